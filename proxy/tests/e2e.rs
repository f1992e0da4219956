//! End to end: two nodes in network namespaces, a dedicated `ztunnel` in
//! each, the real CA, and iptables capture on the client node. Traffic is
//! checked where a user would see it: the bytes that arrive, the connection
//! that closes, the peer address the server sees, the metrics the proxies
//! export.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

#[path = "support/mesh.rs"]
mod mesh;
#[path = "support/wire_labels.rs"]
mod wire_labels;

use wire_labels::TRAFFIC_LABELS;

use mesh::{CLIENT_IP, Mesh, OUTSIDE_IP, SERVER_IP};
use ztunnel_test_support::skip::skip;
use ztunnel_test_support::wait;

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

/// Sends `data`, half-closes, and reads the whole echo.
fn round_trip(stream: TcpStream, data: Vec<u8>) -> Vec<u8> {
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut writer = stream.try_clone().unwrap();
    // A refused connection fails the write or the read; the caller sees
    // fewer bytes than it sent.
    let sender = std::thread::spawn(move || {
        let _ = writer.write_all(&data);
        let _ = writer.shutdown(Shutdown::Write);
    });
    let mut reader = stream;
    let mut echoed = Vec::new();
    let _ = reader.read_to_end(&mut echoed);
    let _ = sender.join();
    echoed
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

fn ping(mesh: &Mesh, addr: &str) -> bool {
    match mesh.client_connect(addr) {
        Ok(stream) => round_trip(stream, b"ping".to_vec()) == b"ping",
        Err(_) => false,
    }
}

/// Waits up to 10 s for `check`, polling.
fn eventually(check: impl FnMut() -> bool) -> bool {
    wait::until(Duration::from_secs(10), check)
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

const ALLOW_CLIENT: &str = "\
policies:
- name: allow-client
  namespace: default
  scope: Namespace
  action: Allow
  rules:
  - - - principals: [!Exact \"cluster.local/ns/default/sa/client\"]
";

const ALLOW_NOBODY: &str = "\
policies:
- name: allow-nobody
  namespace: default
  scope: Namespace
  action: Allow
  rules:
  - - - principals: [!Exact \"cluster.local/ns/default/sa/nobody\"]
";

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

/// The TCP listening addresses in `ns` of `family` (`-4` or `-6`), as
/// `ss` prints them (`0.0.0.0:15008`, `[::1]:15000`, `*:15020` for the
/// dual-stack `[::]`).
fn listening(ns: &ztunnel_test_support::netns::NetNs, family: &str) -> Vec<String> {
    let output = ns.exec(&["ss", "-ltnH", family]).unwrap();
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().nth(3).map(str::to_owned))
        .collect()
}

#[test]
fn ipv6_enabled_false_puts_every_listener_on_ipv4_and_the_tunnel_still_carries() {
    let env = [("IPV6_ENABLED", "false")];
    let Some(mesh) = Mesh::start_with_env("ipv6_enabled_false", "", &env) else {
        return;
    };
    // The server's node runs ztunnel only: not one IPv6 socket, so a
    // kernel booted without IPv6 starts it.
    let ipv6 = listening(&mesh.b, "-6");
    assert!(ipv6.is_empty(), "IPv6 listeners: {ipv6:?}");
    let ipv4 = listening(&mesh.b, "-4");
    for expected in [
        "0.0.0.0:15001",
        "0.0.0.0:15006",
        "0.0.0.0:15008",
        "127.0.0.1:15000",
        "0.0.0.0:15020",
        "0.0.0.0:15021",
    ] {
        assert!(
            ipv4.iter().any(|addr| addr == expected),
            "{expected} in {ipv4:?}"
        );
    }
    let _peers = mesh.echo_server(&format!("{SERVER_IP}:8080"));
    assert!(ping(&mesh, &format!("{SERVER_IP}:8080")), "tunnelled");
}

#[test]
fn the_admin_answers_on_both_loopbacks_where_ipv6_is_on_as_istios_does() {
    let Some(mesh) = Mesh::start("admin_loopbacks", "") else {
        return;
    };
    for admin in ["127.0.0.1:15000", "[::1]:15000"] {
        let answer = mesh::http_get(&mesh.b, admin, "/config_dump").unwrap_or_default();
        assert!(answer.starts_with("HTTP/1.1 200"), "{admin}: {answer}");
    }
    let ipv6 = listening(&mesh.b, "-6");
    assert!(
        ipv6.iter().any(|addr| addr == "*:15020"),
        "dual-stack by default: {ipv6:?}"
    );
}

/// A stock rustls client's view of a server certificate: any is accepted,
/// each signature still checked. The key exchange is what is under test.
#[derive(Debug)]
struct AnyServer(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The client certificate a stock rustls client presents.
#[derive(Debug)]
struct Present(std::sync::Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for Present {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _schemes: &[rustls::SignatureScheme],
    ) -> Option<std::sync::Arc<rustls::sign::CertifiedKey>> {
        Some(std::sync::Arc::clone(&self.0))
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Dials the server node's 15008 with stock rustls offering only `group`
/// and a certificate of the mesh; the group the handshake agreed on, or
/// `None` when the server refused it.
fn handshake_offering(
    mesh: &Mesh,
    group: &'static dyn rustls::crypto::SupportedKxGroup,
) -> Option<rustls::NamedGroup> {
    use std::sync::Arc;
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.kx_groups = vec![group];
    let provider = Arc::new(provider);
    let probe = mesh
        .ca
        .issue(
            &"spiffe://cluster.local/ns/default/sa/probe"
                .parse()
                .unwrap(),
        )
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_client_cert_resolver(Arc::new(Present(Arc::clone(probe.certified_key()))));
    let addr: SocketAddr = format!("{SERVER_IP}:15008").parse().unwrap();
    let mut tcp = mesh
        .b
        .run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
        .unwrap()
        .unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut config = config;
    config.alpn_protocols = vec![b"h2".to_vec()];
    let mut tls =
        rustls::ClientConnection::new(Arc::new(config), ztunnel_certs::tls::dummy_server_name())
            .unwrap();
    let mut stream = rustls::Stream::new(&mut tls, &mut tcp);
    // The HTTP/2 preface; a server that finished the handshake answers
    // with SETTINGS.
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .ok()?;
    let mut settings = [0u8; 9];
    stream.read_exact(&mut settings).ok()?;
    tls.negotiated_key_exchange_group()
        .map(|group| group.name())
}

#[test]
fn pqc_compliance_policy_tunnels_over_x25519mlkem768_only() {
    use rustls::crypto::aws_lc_rs::kx_group::{X25519, X25519MLKEM768};
    let env = [("COMPLIANCE_POLICY", "pqc")];
    let Some(mesh) = Mesh::start_with_env("pqc", "", &env) else {
        return;
    };
    // Both proxies post-quantum: the tunnel between them carries.
    let _peers = mesh.echo_server(&format!("{SERVER_IP}:8080"));
    assert!(ping(&mesh, &format!("{SERVER_IP}:8080")), "tunnelled");
    // A stock peer that offers only the hybrid group gets through; one
    // that offers only X25519 is refused at the handshake.
    assert_eq!(
        handshake_offering(&mesh, X25519MLKEM768),
        Some(rustls::NamedGroup::X25519MLKEM768)
    );
    assert_eq!(handshake_offering(&mesh, X25519), None);
}

#[test]
fn pqc_is_not_required_by_default_and_a_post_quantum_peer_is_still_served() {
    use rustls::crypto::aws_lc_rs::kx_group::{X25519, X25519MLKEM768};
    let Some(mesh) = Mesh::start("pqc_default", "") else {
        return;
    };
    assert_eq!(
        handshake_offering(&mesh, X25519),
        Some(rustls::NamedGroup::X25519)
    );
    assert_eq!(
        handshake_offering(&mesh, X25519MLKEM768),
        Some(rustls::NamedGroup::X25519MLKEM768)
    );
}

#[test]
fn authz_policy_info_logging_puts_each_decision_in_the_info_log() {
    let target = format!("{SERVER_IP}:8080");
    let decisions = |mesh: &Mesh| {
        mesh.log("server")
            .lines()
            .filter(|line| line.contains("policy decision"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let env = [("AUTHZ_POLICY_INFO_LOGGING", "true")];
    let Some(mesh) = Mesh::start_with_env("authz_info", ALLOW_CLIENT, &env) else {
        return;
    };
    let _peers = mesh.echo_server(&target);
    assert!(ping(&mesh, &target));
    assert!(
        eventually(|| decisions(&mesh)
            .iter()
            .any(|line| line.contains("allowed by: default/allow-client"))),
        "{:?}",
        decisions(&mesh)
    );
    mesh.set_config(&mesh::config(ALLOW_NOBODY));
    assert!(eventually(|| !ping(&mesh, &target)), "denied");
    assert!(
        eventually(|| decisions(&mesh)
            .iter()
            .any(|line| line.contains("allow policies exist, but none allowed"))),
        "{:?}",
        decisions(&mesh)
    );
    drop(mesh);

    // Unset, the same decisions are debug lines, out of an info log.
    let Some(mesh) = Mesh::start("authz_debug", ALLOW_CLIENT) else {
        return;
    };
    let _peers = mesh.echo_server(&target);
    assert!(ping(&mesh, &target));
    assert_eq!(decisions(&mesh), Vec::<String>::new());
}

/// A SOCKS5 CONNECT from node a's client namespace through its proxy's
/// 127.0.0.1:15080, to `address` (`[1, a, b, c, d]`) or a hostname
/// (`[3, len, name...]`) and `port`: the reply code, and the stream when
/// it is 0.
fn socks5_connect(mesh: &Mesh, address: Vec<u8>, port: u16) -> (u8, Option<TcpStream>) {
    mesh.a
        .run(move || {
            let mut stream = TcpStream::connect_timeout(
                &"127.0.0.1:15080".parse().unwrap(),
                Duration::from_secs(5),
            )
            .unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            stream.write_all(&[5, 1, 0]).unwrap();
            let mut choice = [0u8; 2];
            stream.read_exact(&mut choice).unwrap();
            assert_eq!(choice, [5, 0], "no authentication chosen");
            let mut request = vec![5, 1, 0];
            request.extend_from_slice(&address);
            request.extend_from_slice(&port.to_be_bytes());
            stream.write_all(&request).unwrap();
            let mut reply = [0u8; 10];
            stream.read_exact(&mut reply).unwrap();
            assert_eq!(reply[0], 5);
            let code = reply[1];
            (code, (code == 0).then_some(stream))
        })
        .unwrap()
}

#[test]
fn socks5_on_15080_carries_connections_by_address_and_by_service_name_over_hbone() {
    let env = [("UNSTABLE_ENABLE_SOCKS5", "true")];
    let Some(mesh) = Mesh::start_with_env("socks5", "", &env) else {
        return;
    };
    let _peers = mesh.echo_server(&format!("{SERVER_IP}:8080"));
    let server: std::net::Ipv4Addr = SERVER_IP.parse().unwrap();
    let mut by_address = vec![1];
    by_address.extend_from_slice(&server.octets());
    let host = b"echo.default.svc.cluster.local";
    let mut by_name = vec![3, u8::try_from(host.len()).unwrap()];
    by_name.extend_from_slice(host);
    for (what, address, port) in [("address", by_address, 8080), ("service name", by_name, 80)] {
        let (code, stream) = socks5_connect(&mesh, address, port);
        assert_eq!(code, 0, "{what}: {}", mesh.log("client"));
        let echoed = round_trip(stream.unwrap(), b"through socks".to_vec());
        assert_eq!(echoed, b"through socks", "{what}");
    }
    // Tunnelled with the client's identity, as a captured connection.
    let client = "spiffe://cluster.local/ns/default/sa/client";
    assert!(
        eventually(|| mesh
            .log("server")
            .lines()
            .filter(|line| line.contains("connection complete") && line.contains(client))
            .count()
            >= 2),
        "{}",
        mesh.log("server")
    );
    // What it does not do is answered with its reply code.
    let (code, _) = socks5_connect(&mesh, vec![9], 80);
    assert_eq!(code, 8, "address type not supported");
    let missing = b"nothing.invalid";
    let mut by_missing = vec![3, u8::try_from(missing.len()).unwrap()];
    by_missing.extend_from_slice(missing);
    let (code, _) = socks5_connect(&mesh, by_missing, 80);
    assert_eq!(code, 4, "host unreachable");
}
