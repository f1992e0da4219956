//! End to end: two nodes in network namespaces, a dedicated `ztunnel` in
//! each, the real CA, and iptables capture on the client node. Traffic is
//! checked where a user would see it: the bytes that arrive, the connection
//! that closes, the peer address the server sees, the metrics the proxies
//! export.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[path = "support/mesh.rs"]
mod mesh;
#[path = "support/wire_labels.rs"]
mod wire_labels;

use wire_labels::TRAFFIC_LABELS;

use mesh::{
    ALLOW_CLIENT, ALLOW_NOBODY, CLIENT_IP, Mesh, OUTSIDE_IP, SERVER_IP, eventually, ping,
    round_trip,
};
use ztunnel_test_support::skip::skip;

/// Deterministic pseudo-random bytes (xorshift), so runs are comparable.
fn random_bytes(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.extend_from_slice(&seed.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Whether the far side closes the connection within `within` without
/// delivering a byte (a timeout is not a close).
fn closed_without_data(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    if stream.write_all(b"hello").is_err() {
        return true;
    }
    let mut buf = [0u8; 16];
    match stream.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(error) => !matches!(
            error.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn bulk_data_crosses_the_tunnel_intact_with_the_client_identity() {
    let Some(mesh) = Mesh::start("bulk_data", "") else {
        return;
    };
    let peers = mesh.echo_server(&format!("{SERVER_IP}:8080"));
    let data = random_bytes(64 << 20, 0x9e37_79b9_7f4a_7c15);
    let stream = mesh.client_connect(&format!("{SERVER_IP}:8080")).unwrap();
    let echoed = round_trip(stream, data.clone());
    assert_eq!(echoed.len(), data.len(), "all 64 MiB came back");
    assert!(echoed == data, "the bytes are intact");
    // Tunnelled: the server sees its own node's proxy dial it, not the client.
    assert_eq!(peers.recv().unwrap().ip().to_string(), SERVER_IP);

    let client = "spiffe://cluster.local/ns/default/sa/client";
    assert!(
        eventually(|| {
            let metrics = mesh.metrics(&mesh.b, SERVER_IP);
            metrics.lines().any(|line| {
                line.starts_with("istio_tcp_received_bytes_total{reporter=\"destination\"")
                    && line.contains(&format!("source_principal=\"{client}\""))
                    && line.ends_with(&format!(" {}", 64u64 << 20))
            })
        }),
        "server metrics count 64 MiB from the client identity:\n{}",
        mesh.metrics(&mesh.b, SERVER_IP)
    );
    let log = std::fs::read_to_string(mesh.dir.path().join("server.log")).unwrap();
    assert!(
        log.lines()
            .any(|line| line.contains("connection complete") && line.contains(client)),
        "server access log names the client identity:\n{log}"
    );
}

const DENY_CLIENT_OVER_ALLOW: &str = "\
policies:
- name: allow-client
  namespace: default
  scope: Namespace
  action: Allow
  rules:
  - - - principals: [!Exact \"cluster.local/ns/default/sa/client\"]
- name: deny-client
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - principals: [!Exact \"cluster.local/ns/default/sa/client\"]
";

#[test]
fn policies_deny_and_changes_apply_to_open_connections() {
    let Some(mesh) = Mesh::start("policies", ALLOW_NOBODY) else {
        return;
    };
    let _peers = mesh.echo_server(&format!("{SERVER_IP}:8080"));
    let target = format!("{SERVER_IP}:8080");

    // An allow policy that does not match the client: closed, 401 counted.
    let mut denied = mesh.client_connect(&target).unwrap();
    assert!(closed_without_data(&mut denied, Duration::from_secs(10)));
    assert!(
        eventually(|| mesh.metrics(&mesh.b, SERVER_IP).lines().any(|line| {
            line.starts_with("istio_tcp_connections_failed_total")
                && line.contains("response_flags=\"DENY\"")
        })),
        "the denial is counted"
    );

    // Allowed once the policy names the client; the connection stays open.
    mesh.set_config(&mesh::config(ALLOW_CLIENT));
    assert!(
        eventually(|| ping(&mesh, &target)),
        "allowed after the policy change"
    );
    let mut open = mesh.client_connect(&target).unwrap();
    open.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    open.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    open.read_exact(&mut one).unwrap();

    // A deny policy wins over the allow, and the open connection is closed.
    mesh.set_config(&mesh::config(DENY_CLIENT_OVER_ALLOW));
    assert!(
        eventually(|| !ping(&mesh, &target)),
        "deny wins over allow for new connections"
    );
    assert!(
        closed_without_data(&mut open, Duration::from_secs(10)),
        "the open connection is closed once policy no longer allows it"
    );

    // Removing the policies allows new connections again.
    mesh.set_config(&mesh::config(""));
    assert!(eventually(|| ping(&mesh, &target)));
}

#[test]
fn routing_vip_unknown_and_plain_tcp_destinations() {
    let Some(mesh) = Mesh::start("routing", "") else {
        return;
    };
    // The VIP is routed off-node; capture takes it before it leaves.
    let a_if = String::from_utf8(
        mesh.a
            .exec(&["ip", "-o", "link", "show", "type", "veth"])
            .unwrap()
            .stdout,
    )
    .unwrap();
    let a_if = a_if
        .split(':')
        .nth(1)
        .unwrap()
        .trim()
        .split('@')
        .next()
        .unwrap()
        .to_owned();
    mesh.a
        .exec(&["ip", "route", "add", "198.19.0.0/16", "dev", &a_if])
        .unwrap();

    let server = mesh.echo_server(&format!("{SERVER_IP}:8080"));
    let outside = mesh.echo_server(&format!("{OUTSIDE_IP}:9000"));
    let legacy = mesh.echo_server("198.18.0.4:9001");

    // Service VIP → its endpoint, port 80 mapped to 8080, over HBONE.
    assert!(ping(&mesh, "198.19.0.10:80"));
    assert_eq!(server.recv().unwrap().ip().to_string(), SERVER_IP);

    // Unknown destination → plain TCP straight from the client node.
    assert!(ping(&mesh, &format!("{OUTSIDE_IP}:9000")));
    assert_eq!(outside.recv().unwrap().ip().to_string(), CLIENT_IP);

    // A workload that speaks plain TCP → plain TCP.
    assert!(ping(&mesh, "198.18.0.4:9001"));
    assert_eq!(legacy.recv().unwrap().ip().to_string(), CLIENT_IP);
}

#[test]
fn cached_certificates_keep_serving_through_a_ca_outage() {
    let Some(mut mesh) = Mesh::start("ca_outage", "") else {
        return;
    };
    let _peers = mesh.echo_server(&format!("{SERVER_IP}:8080"));
    let target = format!("{SERVER_IP}:8080");
    assert!(ping(&mesh, &target));
    mesh.ca.stop();
    for _ in 0..3 {
        assert!(
            ping(&mesh, &target),
            "new connections work on cached certificates"
        );
    }
}

#[test]
fn the_client_refuses_a_server_with_the_wrong_identity() {
    let Some(mesh) = Mesh::start("wrong_server_identity", "") else {
        return;
    };
    let _peers = mesh.echo_server(&format!("{SERVER_IP}:8080"));
    let target = format!("{SERVER_IP}:8080");
    assert!(ping(&mesh, &target));
    // The client node now believes the server runs as another account; the
    // real server's certificate no longer matches.
    let imposter = mesh::config("").replace("serviceAccount: server", "serviceAccount: expected");
    mesh.set_node_config("client", &imposter);
    assert!(
        eventually(|| !ping(&mesh, &target)),
        "refused by the client"
    );
    assert!(
        eventually(|| mesh.metrics(&mesh.a, CLIENT_IP).lines().any(|line| {
            line.starts_with("istio_tcp_connections_failed_total{reporter=\"source\"")
                && line.contains("response_flags=\"TLS_FAILURE\"")
        })),
        "counted as a TLS failure on the client:\n{}",
        mesh.metrics(&mesh.a, CLIENT_IP)
    );
}

/// Dials the server node's HBONE port with `cert` and reports
/// whether the server let a CONNECT through (it must not).
fn hbone_with_certificate(mesh: &Mesh, cert: &ztunnel_certs::cert::WorkloadCertificate) -> bool {
    use std::sync::Arc;
    let server_id: ztunnel_certs::identity::Identity =
        "spiffe://cluster.local/ns/default/sa/server"
            .parse()
            .unwrap();
    // Trust the mesh root, so only our own certificate is in question.
    let mesh_cert = mesh
        .ca
        .issue(
            &"spiffe://cluster.local/ns/default/sa/probe"
                .parse()
                .unwrap(),
        )
        .unwrap();
    let mut config = ztunnel_certs::tls::client_config(&mesh_cert, vec![server_id]).unwrap();
    let ours = ztunnel_certs::tls::client_config(
        cert,
        vec![
            "spiffe://cluster.local/ns/default/sa/server"
                .parse()
                .unwrap(),
        ],
    )
    .unwrap();
    config.client_auth_cert_resolver = ours.client_auth_cert_resolver;
    let addr: SocketAddr = format!("{SERVER_IP}:15008").parse().unwrap();
    // From the server's own node: node a would capture the dial.
    let mut tcp = mesh
        .b
        .run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
        .unwrap()
        .unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls =
        rustls::ClientConnection::new(Arc::new(config), ztunnel_certs::tls::dummy_server_name())
            .unwrap();
    let mut stream = rustls::Stream::new(&mut tls, &mut tcp);
    // The HTTP/2 preface; a server that accepted us answers with SETTINGS.
    if let Err(error) = stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0") {
        eprintln!("HBONE probe refused: {error}");
        return false;
    }
    let mut buf = [0u8; 9];
    let result = stream.read_exact(&mut buf);
    if let Err(error) = &result {
        eprintln!("HBONE probe refused: {error}");
    }
    result.is_ok()
}

#[test]
fn the_server_refuses_clients_from_an_unknown_ca_or_another_trust_domain() {
    ztunnel_certs::tls::install_provider();
    let Some(mesh) = Mesh::start("bad_client", "") else {
        return;
    };
    let client: ztunnel_certs::identity::Identity = "spiffe://cluster.local/ns/default/sa/client"
        .parse()
        .unwrap();
    // Control: a mesh-issued certificate gets an HTTP/2 answer.
    assert!(hbone_with_certificate(
        &mesh,
        &mesh.ca.issue(&client).unwrap()
    ));

    let unknown_ca = ztunnel_test_support::ca::foreign_certificate(&client).unwrap();
    assert!(
        !hbone_with_certificate(&mesh, &unknown_ca),
        "unknown CA refused"
    );

    let foreign: ztunnel_certs::identity::Identity = "spiffe://other.domain/ns/default/sa/client"
        .parse()
        .unwrap();
    let foreign_domain = mesh.ca.issue(&foreign).unwrap();
    assert!(
        !hbone_with_certificate(&mesh, &foreign_domain),
        "foreign trust domain refused"
    );

    let log = std::fs::read_to_string(mesh.dir.path().join("server.log")).unwrap();
    assert!(
        log.contains("HBONE TLS handshake failed"),
        "the server logs the refusals:\n{log}"
    );
}

/// The label names and values of one sample line, in order.
fn labels_of(line: &str) -> Vec<(String, String)> {
    let Some((_, rest)) = line.split_once('{') else {
        return Vec::new();
    };
    let mut labels = Vec::new();
    let mut rest = rest;
    while let Some((name, after)) = rest.split_once("=\"") {
        let value;
        (value, rest) = ztunnel_test_support::quoted::take(after);
        labels.push((name.trim_start_matches(',').to_owned(), value));
        if rest.starts_with('}') {
            break;
        }
    }
    labels
}

#[test]
fn after_one_tunnelled_transfer_each_istio_family_carries_istios_labels_on_both_proxies() {
    let Some(mesh) = Mesh::start("metric_labels", "") else {
        return;
    };
    let _peers = mesh.echo_server(&format!("{SERVER_IP}:8080"));
    assert!(ping(&mesh, &format!("{SERVER_IP}:8080")));

    let traffic: Vec<String> = TRAFFIC_LABELS.map(str::to_owned).to_vec();
    let worker = vec!["worker".to_owned()];
    let families: [(&str, Vec<String>); 9] = [
        ("istio_tcp_connections_opened_total", traffic.clone()),
        ("istio_tcp_connections_closed_total", traffic.clone()),
        ("istio_tcp_sent_bytes_total", traffic.clone()),
        ("istio_tcp_received_bytes_total", traffic.clone()),
        ("istio_tcp_sockets_open", vec!["reporter".to_owned()]),
        (
            "istio_build",
            vec!["component".to_owned(), "tag".to_owned()],
        ),
        (
            "tokio_worker_total_busy_duration_seconds_total",
            worker.clone(),
        ),
        ("tokio_worker_park_count_total", worker.clone()),
        ("tokio_worker_park_unpark_count_total", worker),
    ];
    for (ns, ip, reporter) in [
        (&mesh.a, CLIENT_IP, "source"),
        (&mesh.b, SERVER_IP, "destination"),
    ] {
        let closed = |text: &str| {
            text.lines()
                .any(|line| line.starts_with("istio_tcp_connections_closed_total{"))
        };
        assert!(eventually(|| closed(&mesh.metrics(ns, ip))), "{reporter}");
        let text = mesh.metrics(ns, ip);
        for (family, expected) in &families {
            let samples: Vec<_> = text
                .lines()
                .filter(|line| line.starts_with(&format!("{family}{{")))
                .collect();
            assert!(!samples.is_empty(), "{reporter}: no {family}:\n{text}");
            for sample in samples {
                let names: Vec<_> = labels_of(sample).into_iter().map(|(n, _)| n).collect();
                assert_eq!(&names, expected, "{reporter}: {sample}");
            }
        }
        for gauge in [
            "process_open_fds ",
            "process_max_fds ",
            "tokio_num_workers ",
        ] {
            assert!(
                text.lines().any(|line| line.starts_with(gauge)),
                "{reporter}: no {gauge}:\n{text}"
            );
        }
        let opened = text
            .lines()
            .find(|line| line.starts_with("istio_tcp_connections_opened_total{"))
            .unwrap();
        let labels = labels_of(opened);
        let value = |name: &str| {
            labels
                .iter()
                .find(|(label, _)| label == name)
                .map(|(_, value)| value.as_str())
        };
        assert_eq!(value("reporter"), Some(reporter));
        // Only the server's workload has a locality.
        assert_eq!(value("source_region"), Some("unknown"), "{opened}");
        assert_eq!(value("destination_region"), Some("eu"), "{opened}");
        assert_eq!(value("destination_zone"), Some("eu-1"), "{opened}");
        // The client dialled the pod, not the service; the receiving side
        // names the service whose target port it reached, as Istio's does.
        if reporter == "destination" {
            assert_eq!(
                value("destination_service"),
                Some("echo.default.svc.cluster.local"),
                "{opened}"
            );
            assert_eq!(value("destination_service_name"), Some("echo"), "{opened}");
        }
    }
}

/// A decimal serial number as its big-endian bytes.
fn serial_bytes(decimal: &str) -> Vec<u8> {
    let mut bytes: Vec<u8> = vec![0];
    for digit in decimal.bytes().map(|b| u32::from(b - b'0')) {
        let mut carry = digit;
        for byte in bytes.iter_mut().rev() {
            let value = u32::from(*byte) * 10 + carry;
            *byte = (value & 0xff) as u8;
            carry = value >> 8;
        }
        while carry > 0 {
            bytes.insert(0, (carry & 0xff) as u8);
            carry >>= 8;
        }
    }
    while bytes.len() > 1 && bytes[0] == 0 {
        bytes.remove(0);
    }
    bytes
}

#[test]
fn a_server_whose_certificate_is_revoked_is_refused_with_cert_revoked() {
    let lists = tempfile::tempdir().unwrap();
    let crl = lists.path().join("ca-crl.pem");
    // An empty file is in force from the start: nothing revoked yet.
    std::fs::write(&crl, "").unwrap();
    let crl_env = crl.to_str().unwrap().to_owned();
    let Some(mesh) = Mesh::start_with_env("crl", "", &[("CRL_PATH", crl_env.as_str())]) else {
        return;
    };
    let _peers = mesh.echo_server(&format!("{SERVER_IP}:8080"));

    // The server's certificate, as its /config_dump shows it.
    let server = "spiffe://cluster.local/ns/default/sa/server";
    let mut serial = String::new();
    assert!(
        eventually(|| {
            let dump =
                mesh::http_get(&mesh.b, "127.0.0.1:15000", "/config_dump").and_then(|answer| {
                    let (_head, body) = answer.split_once("\r\n\r\n")?;
                    serde_json::from_str::<serde_json::Value>(body).ok()
                });
            let found = dump.as_ref().and_then(|dump| {
                dump["certificates"].as_array()?.iter().find_map(|entry| {
                    (entry["identity"] == server)
                        .then(|| entry["certChain"][0]["serialNumber"].as_str())
                        .flatten()
                        .map(str::to_owned)
                })
            });
            found.map(|found| serial = found).is_some()
        }),
        "the server's certificate in its /config_dump"
    );

    // The CA revokes it; the client's ztunnel picks the list up.
    let root_pem = std::fs::read_to_string(mesh.ca.root_cert_path()).unwrap();
    let key_pem = std::fs::read_to_string(mesh.ca.root_key_path()).unwrap();
    let issuer =
        rcgen::Issuer::from_ca_cert_pem(&root_pem, rcgen::KeyPair::from_pem(&key_pem).unwrap())
            .unwrap();
    let now = time::OffsetDateTime::now_utc();
    let list = rcgen::CertificateRevocationListParams {
        this_update: now - time::Duration::minutes(5),
        next_update: now + time::Duration::hours(1),
        crl_number: rcgen::SerialNumber::from_slice(&[1]),
        issuing_distribution_point: None,
        revoked_certs: vec![rcgen::RevokedCertParams {
            serial_number: rcgen::SerialNumber::from_slice(&serial_bytes(&serial)),
            revocation_time: now - time::Duration::minutes(1),
            reason_code: Some(rcgen::RevocationReason::KeyCompromise),
            invalidity_date: None,
        }],
        key_identifier_method: rcgen::KeyIdMethod::Sha256,
    }
    .signed_by(&issuer)
    .unwrap();
    std::fs::write(&crl, list.pem().unwrap()).unwrap();
    assert!(
        eventually(|| mesh.log("client").contains("revocation lists changed")),
        "the client's ztunnel reads the changed list:\n{}",
        mesh.log("client")
    );

    // No connection to the server was made before, so this one shakes
    // hands, and the server's revoked certificate is refused.
    assert!(!ping(&mesh, &format!("{SERVER_IP}:8080")));
    let metrics = mesh.metrics(&mesh.a, CLIENT_IP);
    assert!(
        metrics.lines().any(|line| {
            line.starts_with("istio_tcp_connections_failed_total{reporter=\"source\"")
                && line.contains("response_flags=\"CERT_REVOKED\"")
        }),
        "the client counts a CERT_REVOKED failure:\n{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("istio_crl_policy_rejections_total{reporter=\"source\"}")),
        "{metrics}"
    );
}

/// `openssl s_client` in `ns` to `target` offering only `version`
/// (`-tls1_2`, `-tls1_3`), with no client certificate; its output, stdout
/// and stderr together. Bounded by `timeout`.
fn s_client(ns: &ztunnel_test_support::netns::NetNs, target: &str, version: &str) -> String {
    let output = ns
        .command("timeout")
        // Its input held open for 2 s: at end of input s_client closes,
        // before the server's answer when that comes second.
        .args([
            "10",
            "sh",
            "-c",
            &format!("sleep 2 | openssl s_client {version} -alpn h2 -connect {target}"),
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn a_tls_1_2_client_is_refused_by_inbound_hbone_and_by_the_control_plane() {
    if std::process::Command::new("openssl")
        .arg("version")
        .output()
        .is_err()
    {
        skip("openssl is not installed (apt-get install openssl)");
        return;
    }
    let Some(mesh) = Mesh::start("tls12", "") else {
        return;
    };
    let control_plane = mesh.ca.address().trim_start_matches("https://").to_owned();
    // From node b, where nothing captures outbound traffic: from node a it
    // would go through the client's ztunnel.
    for target in [format!("{SERVER_IP}:15008"), control_plane] {
        // TLS 1.3 gets a handshake (the server then wants a client
        // certificate, which is another matter)...
        let tls13 = s_client(&mesh.b, &target, "-tls1_3");
        assert!(
            tls13.contains("TLSv1.3"),
            "{target} over TLS 1.3:\n{tls13}\n{}",
            mesh.log("server")
        );
        // ...TLS 1.2 gets the protocol_version alert and no session.
        let tls12 = s_client(&mesh.b, &target, "-tls1_2");
        assert!(
            tls12.contains("alert protocol version"),
            "{target} over TLS 1.2:\n{tls12}"
        );
        assert!(!tls12.contains("TLSv1.2, Cipher is"), "{target}:\n{tls12}");
    }
}
