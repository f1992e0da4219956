//! The datagram format: fd rules, bad bytes, typed adds, encoded answers.

use super::*;
use zds::workload_request::Payload;

fn datagram(payload: Option<Payload>, fds: usize) -> Datagram {
    let bytes = zds::WorkloadRequest { payload }.encode_to_vec();
    let fds = (0..fds)
        .map(|_| OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
        .collect();
    Datagram {
        bytes,
        fds,
        truncated: false,
    }
}

fn add() -> Option<Payload> {
    Some(Payload::Add(zds::AddWorkload {
        uid: "uid-1".into(),
        workload_info: Some(zds::WorkloadInfo {
            name: "pod".into(),
            namespace: "ns".into(),
            service_account: "sa".into(),
        }),
    }))
}

fn read_error(datagram: Datagram) -> String {
    parse(datagram, |_| true).unwrap_err().to_string()
}

#[test]
fn fd_rules() {
    let del = Some(Payload::Del(zds::DelWorkload { uid: "u".into() }));
    let cases = [
        (datagram(add(), 0), "No control message"),
        (datagram(add(), 2), "Expected 1 FD, got 2"),
        (datagram(add(), 3), "Expected 1 FD, got 3"),
        (datagram(del, 1), "Unexpected control message"),
        (
            datagram(Some(Payload::SnapshotSent(zds::SnapshotSent {})), 1),
            "Unexpected control message",
        ),
    ];
    for (datagram, expected) in cases {
        assert_eq!(read_error(datagram), expected);
    }
}

#[test]
fn bad_bytes() {
    let mut truncated = datagram(add(), 1);
    truncated.truncated = true;
    assert_eq!(read_error(truncated), "received truncated message");
    let garbage = Datagram {
        bytes: vec![0xff, 0xff, 0xff],
        fds: Vec::new(),
        truncated: false,
    };
    assert!(read_error(garbage).starts_with("failed to decode Protobuf message: "));
    // An unknown field only: decodes, but names no payload.
    let unknown = Datagram {
        bytes: vec![0x48, 0x01],
        fds: Vec::new(),
        truncated: false,
    };
    assert_eq!(read_error(unknown), "no payload");
}

#[test]
fn add_is_typed() {
    let Ok(Request::Add {
        uid,
        workload: Some(workload),
        handle: Handle::Netns(_),
    }) = parse(datagram(add(), 1), |_| true)
    else {
        panic!("not an add with a netns");
    };
    assert_eq!(&*uid, "uid-1");
    assert_eq!(
        (
            &*workload.namespace,
            &*workload.name,
            &*workload.service_account
        ),
        ("ns", "pod", "sa")
    );
    let not_netns = parse(datagram(add(), 1), |_| false);
    assert!(matches!(
        not_netns,
        Ok(Request::Add {
            handle: Handle::NotNetns,
            ..
        })
    ));
}

#[test]
fn answers_encode() {
    let hello = zds::ZdsHello::decode(hello().as_slice()).unwrap();
    assert_eq!(hello.version, i32::from(zds::Version::V1));
    let nack = zds::WorkloadResponse::decode(ack("boom".into()).as_slice()).unwrap();
    assert_eq!(
        nack.payload,
        Some(zds::workload_response::Payload::Ack(zds::Ack {
            error: "boom".into()
        }))
    );
}
