//! Framing: a response's chunks are one gRPC message that decodes to the
//! push; requests are split, size-checked, and their large buffers given
//! back.

use ztunnel_proto::envoy::service::discovery::v3::{DeltaDiscoveryResponse, Resource};
use ztunnel_proto::xds_types::ADDRESS_TYPE_URL;

use super::*;

fn entry(name: &str, payload_bytes: usize) -> Arc<Entry> {
    let resource = Resource {
        name: name.into(),
        version: format!("v-{name}"),
        resource: Some(prost_types::Any {
            type_url: "t".into(),
            value: vec![7; payload_bytes],
        }),
        ..Resource::default()
    };
    Arc::new(Entry {
        name: name.into(),
        version: resource.version.clone(),
        encoded: Bytes::from(resource.encode_to_vec()),
    })
}

fn push(resources: Vec<Arc<Entry>>, removed: &[&str]) -> Push {
    Push {
        type_url: ADDRESS_TYPE_URL.into(),
        nonce: "3-9".into(),
        resources,
        removed: removed.iter().map(|name| Arc::from(*name)).collect(),
    }
}

/// Concatenates the chunks, checks the prefix, decodes the message.
fn unframe(frames: PushFrames) -> (usize, DeltaDiscoveryResponse) {
    let len = frames.len();
    let chunks: Vec<Bytes> = frames.collect();
    let bytes: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
    assert_eq!(bytes.len(), len, "len() is the frame's size");
    assert_eq!(bytes[0], 0, "not compressed");
    let message_len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
    assert_eq!(message_len, len - PREFIX_BYTES);
    (
        chunks.len(),
        DeltaDiscoveryResponse::decode(&bytes[PREFIX_BYTES..]).unwrap(),
    )
}

#[test]
fn a_push_is_one_grpc_message_in_bounded_chunks() {
    // (case, resource count, payload bytes each, removed, at least this many chunks)
    let cases: [(&str, usize, usize, &[&str], usize); 4] = [
        ("empty", 0, 0, &[], 1),
        ("removals only", 0, 0, &["a", "n/b"], 1),
        ("many small", 3000, 100, &["gone"], 4),
        ("one larger than a chunk", 2, 200_000, &[], 2),
    ];
    for (case, count, payload, removed, min_chunks) in cases {
        let resources: Vec<Arc<Entry>> = (0..count)
            .map(|i| entry(&format!("r{i:05}"), payload))
            .collect();
        let (chunks, response) =
            unframe(PushFrames::new(push(resources.clone(), removed)).unwrap());
        assert!(chunks >= min_chunks, "{case}: {chunks} chunks");
        assert_eq!(response.type_url, ADDRESS_TYPE_URL, "{case}");
        assert_eq!(response.nonce, "3-9", "{case}");
        assert_eq!(response.removed_resources, removed, "{case}");
        assert_eq!(response.resources.len(), count, "{case}");
        for (got, want) in response.resources.iter().zip(&resources) {
            assert_eq!(Bytes::from(got.encode_to_vec()), want.encoded, "{case}");
        }
    }
}

fn framed(request: &DeltaDiscoveryRequest) -> Vec<u8> {
    let body = request.encode_to_vec();
    let mut bytes = vec![0];
    bytes.extend_from_slice(&(body.len() as u32).to_be_bytes());
    bytes.extend_from_slice(&body);
    bytes
}

#[test]
fn requests_are_split_from_any_chunking() {
    let first = DeltaDiscoveryRequest {
        type_url: "a".into(),
        ..DeltaDiscoveryRequest::default()
    };
    let second = DeltaDiscoveryRequest {
        type_url: "b".into(),
        response_nonce: "1-1".into(),
        ..DeltaDiscoveryRequest::default()
    };
    let mut bytes = framed(&first);
    bytes.extend(framed(&second));
    for split in [1, 3, 5, 7, bytes.len()] {
        let mut decoder = RequestDecoder::new(1024);
        let mut got = Vec::new();
        for piece in bytes.chunks(split) {
            decoder.extend(piece);
            while let Some(request) = decoder.decode().unwrap() {
                got.push(request);
            }
        }
        assert_eq!(got, [first.clone(), second.clone()], "pieces of {split}");
        assert!(!decoder.has_partial());
    }
    let mut decoder = RequestDecoder::new(1024);
    decoder.extend(&framed(&first)[..4]);
    assert!(decoder.decode().unwrap().is_none());
    assert!(decoder.has_partial(), "a truncated request is noticed");
}

#[test]
fn bad_requests_are_refused_before_they_are_buffered() {
    let mut compressed = framed(&DeltaDiscoveryRequest::default());
    compressed[0] = 1;
    let mut decoder = RequestDecoder::new(1024);
    decoder.extend(&compressed);
    assert!(matches!(decoder.decode(), Err(WireError::Compressed)));

    let mut decoder = RequestDecoder::new(1024);
    decoder.extend(&[0, 0, 0, 4, 1]);
    assert!(
        matches!(
            decoder.decode(),
            Err(WireError::TooLarge {
                len: 1025,
                max: 1024
            })
        ),
        "refused from the prefix alone"
    );

    let mut decoder = RequestDecoder::new(1024);
    decoder.extend(&[0, 0, 0, 0, 2, 0xff, 0xff]);
    assert!(matches!(decoder.decode(), Err(WireError::Decode(_))));
}

#[test]
fn a_large_request_buffer_is_given_back() {
    let large = DeltaDiscoveryRequest {
        initial_resource_versions: (0..5000)
            .map(|i| (format!("uid-{i}"), format!("{i:016x}")))
            .collect(),
        ..DeltaDiscoveryRequest::default()
    };
    let mut decoder = RequestDecoder::new(16 * 1024 * 1024);
    decoder.extend(&framed(&large));
    assert_eq!(
        decoder
            .decode()
            .unwrap()
            .unwrap()
            .initial_resource_versions
            .len(),
        5000
    );
    assert!(decoder.buffer.capacity() <= KEPT_REQUEST_BUFFER_BYTES);
}
