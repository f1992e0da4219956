#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! Real TLS 1.3 handshakes over loopback TCP between the mesh client and
//! server configs, with chains generated here by rcgen: the verifier
//! rejections of WIRE.md §4 in each direction, and the accepted cases.

use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::sign::SingleCertAndKey;
use rustls::{CertificateError, ClientConfig, ProtocolVersion, ServerConfig};
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::tls::{
    self, PeerError, TlsError, client_config, dummy_server_name, peer_identity, server_config,
};

const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/client";
const SERVER: &str = "spiffe://cluster.local/ns/default/sa/server";
const OTHER: &str = "spiffe://cluster.local/ns/default/sa/other";
const FOREIGN_CLIENT: &str = "spiffe://other.domain/ns/default/sa/client";
const DAY: Duration = Duration::from_secs(24 * 3600);
/// Generous: a handshake on loopback takes milliseconds, this only stops a
/// hung test.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A CA made for the test: its PEM and the means to sign with it.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn root(name: &str) -> Ca {
        Ca::new(name, None)
    }

    fn intermediate(name: &str, parent: &Ca) -> Ca {
        Ca::new(name, Some(parent))
    }

    fn new(name: &str, parent: Option<&Ca>) -> Ca {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = match parent {
            Some(parent) => params.signed_by(&key, &parent.issuer).unwrap(),
            None => params.self_signed(&key).unwrap(),
        };
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }
}

/// What a generated leaf looks like; the default is a valid istiod-style leaf.
#[derive(Clone)]
struct Leaf {
    uris: Vec<&'static str>,
    dns: Vec<&'static str>,
    not_before: SystemTime,
    not_after: SystemTime,
    is_ca: bool,
    usages: Vec<ExtendedKeyUsagePurpose>,
}

impl Leaf {
    fn new(uri: &'static str) -> Leaf {
        Leaf::with_uris(&[uri])
    }

    fn with_uris(uris: &[&'static str]) -> Leaf {
        let now = SystemTime::now();
        Leaf {
            uris: uris.to_vec(),
            dns: Vec::new(),
            not_before: now - Duration::from_secs(120),
            not_after: now + DAY,
            is_ca: false,
            usages: vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        }
    }

    fn valid(mut self, from: SystemTime, to: SystemTime) -> Leaf {
        (self.not_before, self.not_after) = (from, to);
        self
    }

    fn issue(&self, ca: &Ca) -> (String, PrivateKeyDer<'static>) {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        let uris = self
            .uris
            .iter()
            .map(|u| SanType::URI(Ia5String::try_from(*u).unwrap()));
        let dns = self
            .dns
            .iter()
            .map(|d| SanType::DnsName(Ia5String::try_from(*d).unwrap()));
        params.subject_alt_names = uris.chain(dns).collect();
        params.not_before = OffsetDateTime::from(self.not_before);
        params.not_after = OffsetDateTime::from(self.not_after);
        if self.is_ca {
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = self.usages.clone();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca.issuer).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (cert.pem(), key)
    }
}

/// A workload certificate as a CA response would carry it: `leaf` issued by
/// the last of `signers`, the other signers as intermediates, and `roots` as
/// the trust bundle.
fn workload(leaf: &Leaf, signers: &[&Ca], roots: &[&Ca]) -> WorkloadCertificate {
    let (pem, key) = leaf.issue(signers.last().unwrap());
    let mut chain = vec![pem];
    chain.extend(signers.iter().skip(1).rev().map(|ca| ca.pem.clone()));
    chain.push(roots.iter().map(|ca| ca.pem.as_str()).collect());
    WorkloadCertificate::from_ca_response(&chain, key, None).unwrap()
}

/// A server that presents `cert` and checks nobody, so that only the
/// client's verification is under test.
fn presenting_server(cert: &WorkloadCertificate) -> ServerConfig {
    let mut config = ServerConfig::builder_with_provider(tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(Arc::clone(
            cert.certified_key(),
        ))));
    config.alpn_protocols = vec![tls::ALPN_H2.to_vec()];
    config
}

fn id(uri: &str) -> Identity {
    uri.parse().unwrap()
}

/// What one side saw of a completed handshake.
#[derive(Debug)]
struct Seen {
    peer: Option<Identity>,
    alpn: Option<Vec<u8>>,
    version: Option<ProtocolVersion>,
    /// SNI as the server received it; always `None` on the client side.
    sni: Option<String>,
}

/// Dials `server` from `client` over 127.0.0.1 and reports each side's view.
/// The client reads a greeting after its handshake because in TLS 1.3 the
/// server judges the client's certificate only after the client is done.
async fn handshake(
    client: ClientConfig,
    server: ServerConfig,
) -> (io::Result<Seen>, io::Result<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(server));
    let connector = TlsConnector::from(Arc::new(client));
    let server = async move {
        let (tcp, _) = listener.accept().await?;
        let mut stream = acceptor.accept(tcp).await?;
        let (_, conn) = stream.get_ref();
        let seen = Seen {
            peer: peer_identity(conn),
            alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
            version: conn.protocol_version(),
            sni: conn.server_name().map(str::to_owned),
        };
        stream.write_all(b"ok").await?;
        stream.shutdown().await?;
        Ok(seen)
    };
    let client = async move {
        let tcp = TcpStream::connect(address).await?;
        let mut stream = connector.connect(dummy_server_name(), tcp).await?;
        let mut greeting = [0; 2];
        stream.read_exact(&mut greeting).await?;
        let (_, conn) = stream.get_ref();
        Ok(Seen {
            peer: peer_identity(conn),
            alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
            version: conn.protocol_version(),
            sni: None,
        })
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, async { tokio::join!(client, server) })
        .await
        .expect("handshake timed out")
}

/// The rustls error a failed side reported.
fn rustls_error(side: &str, result: io::Result<Seen>) -> rustls::Error {
    let error = match result {
        Ok(seen) => panic!("{side}: handshake should have failed, saw {seen:?}"),
        Err(error) => error,
    };
    match error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(inner) => inner.clone(),
        None => panic!("{side}: not a rustls error: {error}"),
    }
}

/// Our verifier's reason, when the rejection came from the SPIFFE checks.
fn peer_error(error: &rustls::Error) -> Option<&PeerError> {
    match error {
        rustls::Error::InvalidCertificate(CertificateError::Other(other)) => {
            other.0.downcast_ref::<PeerError>()
        }
        _ => None,
    }
}

/// A named rejection case: the leaf the verified side presents, its signers,
/// and what the verifying side must say.
struct Rejection {
    name: &'static str,
    leaf: Leaf,
    signed_by_unknown_ca: bool,
    expect: fn(&rustls::Error) -> bool,
}

/// The rejections both directions share: a bad leaf is bad whichever side
/// presents it.
fn shared_rejections(presenter: &'static str) -> Vec<Rejection> {
    let now = SystemTime::now();
    let mut no_uri = Leaf::with_uris(&[]);
    no_uri.dns = vec!["server.default.svc.cluster.local"];
    let mut ca_leaf = Leaf::new(presenter);
    ca_leaf.is_ca = true;
    let case = |name, leaf, expect| Rejection {
        name,
        leaf,
        signed_by_unknown_ca: false,
        expect,
    };
    vec![
        Rejection {
            name: "unknown CA",
            leaf: Leaf::new(presenter),
            signed_by_unknown_ca: true,
            expect: |e| {
                matches!(
                    e,
                    rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)
                )
            },
        },
        case(
            "expired",
            Leaf::new(presenter).valid(now - 2 * DAY, now - DAY),
            |e| {
                matches!(
                    e,
                    rustls::Error::InvalidCertificate(CertificateError::ExpiredContext { .. })
                )
            },
        ),
        case(
            "not yet valid",
            Leaf::new(presenter).valid(now + DAY, now + 2 * DAY),
            |e| {
                matches!(
                    e,
                    rustls::Error::InvalidCertificate(CertificateError::NotValidYetContext { .. })
                )
            },
        ),
        case("no URI SAN", no_uri, |e| {
            matches!(peer_error(e), Some(PeerError::UriSanCount(0)))
        }),
        case("two URI SANs", Leaf::with_uris(&[presenter, OTHER]), |e| {
            matches!(peer_error(e), Some(PeerError::UriSanCount(2)))
        }),
        case(
            "URI SAN that is not an identity",
            Leaf::with_uris(&["https://example.com/"]),
            |e| matches!(peer_error(e), Some(PeerError::NotAnIdentity)),
        ),
        // webpki refuses a CA used as an end entity before our own check runs.
        case("leaf with CA:true", ca_leaf, |e| {
            matches!(e, rustls::Error::InvalidCertificate(_))
                && e.to_string().contains("CaUsedAsEndEntity")
        }),
    ]
}

#[tokio::test]
async fn mutual_tls_succeeds_and_each_side_sees_the_other_identity() {
    let root = Ca::root("root");
    let intermediate = Ca::intermediate("intermediate", &root);
    let server_cert = workload(&Leaf::new(SERVER), &[&root], &[&root]);
    let client_cert = workload(&Leaf::new(CLIENT), &[&root, &intermediate], &[&root]);
    assert_eq!(client_cert.intermediates().len(), 1);

    let client = client_config(&client_cert, vec![id(OTHER), id(SERVER)]).unwrap();
    let (client, server) = handshake(client, server_config(&server_cert).unwrap()).await;
    let (client, server) = (client.unwrap(), server.unwrap());
    assert_eq!(
        server.peer,
        Some(id(CLIENT)),
        "server feeds the client identity to authorization"
    );
    assert_eq!(client.peer, Some(id(SERVER)));
    for seen in [&client, &server] {
        assert_eq!(seen.alpn.as_deref(), Some(&b"h2"[..]));
        assert_eq!(seen.version, Some(ProtocolVersion::TLSv1_3));
    }
    assert_eq!(server.sni, None, "the client sends no SNI");
}

#[tokio::test]
async fn client_rejects_bad_servers() {
    let root = Ca::root("root");
    let unknown = Ca::root("unknown");
    let client_cert = workload(&Leaf::new(CLIENT), &[&root], &[&root]);
    let mut server_auth_missing = Leaf::new(SERVER);
    server_auth_missing.usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let mut cases = shared_rejections(SERVER);
    cases.push(Rejection {
        name: "wrong SAN",
        leaf: Leaf::new(OTHER),
        signed_by_unknown_ca: false,
        expect: |e| matches!(peer_error(e), Some(PeerError::UnexpectedIdentity(found)) if found.as_str() == OTHER),
    });
    cases.push(Rejection {
        name: "no serverAuth usage",
        leaf: server_auth_missing,
        signed_by_unknown_ca: false,
        expect: |e| {
            matches!(
                e,
                rustls::Error::InvalidCertificate(CertificateError::InvalidPurpose)
            )
        },
    });

    for case in cases {
        let signer = if case.signed_by_unknown_ca {
            &unknown
        } else {
            &root
        };
        let server_cert = workload(&case.leaf, &[signer], &[signer]);
        let client = client_config(&client_cert, vec![id(SERVER)]).unwrap();
        let (client, _) = handshake(client, presenting_server(&server_cert)).await;
        let error = rustls_error(case.name, client);
        assert!(
            (case.expect)(&error),
            "{}: wrong reason: {error}",
            case.name
        );
    }
}

#[tokio::test]
async fn server_rejects_bad_clients() {
    let root = Ca::root("root");
    let unknown = Ca::root("unknown");
    let server_cert = workload(&Leaf::new(SERVER), &[&root], &[&root]);
    let mut client_auth_missing = Leaf::new(CLIENT);
    client_auth_missing.usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let mut cases = shared_rejections(CLIENT);
    cases.push(Rejection {
        name: "foreign trust domain",
        leaf: Leaf::new(FOREIGN_CLIENT),
        signed_by_unknown_ca: false,
        expect: |e| {
            matches!(peer_error(e), Some(PeerError::ForeignTrustDomain { identity, trust_domain })
                if identity.as_str() == FOREIGN_CLIENT && trust_domain == "cluster.local")
        },
    });
    cases.push(Rejection {
        name: "no clientAuth usage",
        leaf: client_auth_missing,
        signed_by_unknown_ca: false,
        expect: |e| {
            matches!(
                e,
                rustls::Error::InvalidCertificate(CertificateError::InvalidPurpose)
            )
        },
    });

    for case in cases {
        let signer = if case.signed_by_unknown_ca {
            &unknown
        } else {
            &root
        };
        // The client trusts the server, so only the server's verdict counts.
        let client_cert = workload(&case.leaf, &[signer], &[&root]);
        let client = client_config(&client_cert, vec![id(SERVER)]).unwrap();
        let (client, server) = handshake(client, server_config(&server_cert).unwrap()).await;
        let error = rustls_error(case.name, server);
        assert!(
            (case.expect)(&error),
            "{}: wrong reason: {error}",
            case.name
        );
        assert!(
            client.is_err(),
            "{}: the client must see the rejection",
            case.name
        );
    }
}

#[tokio::test]
async fn several_roots_are_trusted_at_once_during_a_rotation() {
    let old_root = Ca::root("old root");
    let new_root = Ca::root("new root");
    let both: &[&Ca] = &[&old_root, &new_root];
    // Server issued by the old root, client by the new one; both trust both.
    let server_cert = workload(&Leaf::new(SERVER), &[&old_root], both);
    let client_cert = workload(&Leaf::new(CLIENT), &[&new_root], both);
    assert_eq!(client_cert.roots().certificates().len(), 2);

    let client = client_config(&client_cert, vec![id(SERVER)]).unwrap();
    let (client, server) = handshake(client, server_config(&server_cert).unwrap()).await;
    assert_eq!(client.unwrap().peer, Some(id(SERVER)));
    assert_eq!(server.unwrap().peer, Some(id(CLIENT)));

    // A peer that trusts only the old root still refuses the new root's leaf.
    let old_only = workload(&Leaf::new(SERVER), &[&old_root], &[&old_root]);
    let client = client_config(&client_cert, vec![id(SERVER)]).unwrap();
    let (_, server) = handshake(client, server_config(&old_only).unwrap()).await;
    let error = rustls_error("old root only", server);
    assert!(matches!(
        error,
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)
    ));
}

#[test]
fn configs_refuse_what_could_never_verify() {
    let root = Ca::root("root");
    let cert = workload(&Leaf::new(CLIENT), &[&root], &[&root]);
    assert!(matches!(
        client_config(&cert, Vec::new()),
        Err(TlsError::NoExpectedIdentity)
    ));
    let mut no_identity = Leaf::with_uris(&[]);
    no_identity.dns = vec!["example.com"];
    let cert = workload(&no_identity, &[&root], &[&root]);
    assert!(matches!(server_config(&cert), Err(TlsError::NoOwnIdentity)));
}
