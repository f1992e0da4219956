//! On-demand Address resources (`XDS_ON_DEMAND`): a connection to an
//! address the proxy does not know asks the fake server for it.

use super::*;

/// A plain-TCP workload of `uid` at `ip`, running as `uid`.
fn tcp_workload(uid: &str, ip: [u8; 4]) -> wire::Workload {
    wire::Workload {
        uid: uid.into(),
        name: uid.into(),
        namespace: "default".into(),
        service_account: uid.into(),
        addresses: vec![ip.to_vec()],
        node: "node-b".into(),
        ..Default::default()
    }
}

fn workload_resource_of(workload: wire::Workload, version: &str) -> Resource {
    let name = workload.uid.clone();
    let address = wire::Address {
        r#type: Some(wire::address::Type::Workload(workload)),
    };
    Resource {
        name,
        version: version.into(),
        resource: Some(prost_types::Any {
            type_url: ADDRESS_TYPE_URL.into(),
            value: address.encode_to_vec(),
        }),
        ..Default::default()
    }
}

/// A SOCKS5 CONNECT to `target` through the proxy's 127.0.0.1:15080; the
/// reply's code and, on success, the stream.
async fn socks5_connect(target: SocketAddr) -> (u8, TcpStream) {
    let mut stream = TcpStream::connect("127.0.0.1:15080").await.unwrap();
    stream.write_all(&[5, 1, 0]).await.unwrap();
    let mut choice = [0u8; 2];
    stream.read_exact(&mut choice).await.unwrap();
    let SocketAddr::V4(target) = target else {
        panic!("IPv4 only here");
    };
    let mut request = vec![5, 1, 0, 1];
    request.extend_from_slice(&target.ip().octets());
    request.extend_from_slice(&target.port().to_be_bytes());
    stream.write_all(&request).await.unwrap();
    let mut reply = [0u8; 10];
    stream.read_exact(&mut reply).await.unwrap();
    (reply[1], stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_demand_a_workload_unknown_at_start_is_fetched_by_its_address_before_routing() {
    let mut harness = harness().await;
    // The destination: an echo on 127.0.0.2, which nothing pushes.
    let echo = TcpListener::bind("127.0.0.2:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    let ztunnel = harness.spawn(&[
        ("XDS_ON_DEMAND", "true".into()),
        ("ISTIO_META_DNS_CAPTURE", "false".into()),
        ("UNSTABLE_ENABLE_SOCKS5", "true".into()),
    ]);

    // Address is subscribed to nothing; Authorization is a wildcard.
    let mut session = harness.session().await;
    let address = session.request().await;
    let authorization = session.request().await;
    assert_eq!(address.type_url, ADDRESS_TYPE_URL);
    assert_eq!(
        (
            &address.resource_names_subscribe[..],
            &address.resource_names_unsubscribe[..]
        ),
        (&["*".to_owned()][..], &["*".to_owned()][..])
    );
    assert!(authorization.resource_names_subscribe.is_empty());

    // Ready once Authorization is ACKed: there is no Address wildcard to
    // wait for. The proxy's own workload is pushed as istiod would.
    session
        .push_acked(AUTHORIZATION_TYPE_URL, "p1", vec![], &[])
        .await;
    ready_once_acked(&ztunnel).await;
    let local = wire::Workload {
        service_account: "app".into(),
        ..tcp_workload("app-0", [127, 0, 0, 1])
    };
    session
        .push_acked(
            ADDRESS_TYPE_URL,
            "a1",
            vec![workload_resource_of(local, "1")],
            &[],
        )
        .await;

    // A connection to the unknown address asks for it, and is routed once
    // the answer came, knowing its destination.
    let client = tokio::spawn(socks5_connect(echo_addr));
    let demand = session.request().await;
    assert_eq!(demand.type_url, ADDRESS_TYPE_URL);
    assert_eq!(demand.resource_names_subscribe, ["/127.0.0.2"]);
    // Named by its uid, with the address asked for as an alias, as istiod
    // answers a demand.
    let mut answer = workload_resource_of(tcp_workload("w-echo", [127, 0, 0, 2]), "1");
    answer.aliases = vec!["/127.0.0.2".to_owned()];
    session
        .push_acked(ADDRESS_TYPE_URL, "a2", vec![answer], &[])
        .await;
    let (code, mut stream) = tokio::time::timeout(WAIT, client).await.unwrap().unwrap();
    assert_eq!(code, 0, "connected");
    stream.write_all(b"on demand").await.unwrap();
    let mut echoed = [0u8; 9];
    stream.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"on demand");
    assert_eq!(workload_uids(&ztunnel).await, ["app-0", "w-echo"]);
    let (_, metrics) = get(ztunnel.stats, "/metrics").await.unwrap();
    assert!(
        metrics.lines().any(
            |line| line.starts_with("istio_tcp_connections_opened_total")
                && line.contains("destination_workload=\"w-echo\"")
        ),
        "the connection names the workload fetched for it:\n{metrics}"
    );
}
