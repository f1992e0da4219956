#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! Istio's settings on the two-node dedicated mesh of `support/mesh.rs`,
//! end to end: `IPV6_ENABLED`, the admin's loopbacks, `COMPLIANCE_POLICY=pqc`
//! against stock rustls peers, `AUTHZ_POLICY_INFO_LOGGING`, and SOCKS5 on
//! 15080. The traffic paths themselves are `e2e.rs`'s.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[path = "support/mesh.rs"]
mod mesh;

use mesh::{ALLOW_CLIENT, ALLOW_NOBODY, Mesh, SERVER_IP, eventually, ping, round_trip};

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
