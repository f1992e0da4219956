use rcgen::string::Ia5String;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use super::*;

#[test]
fn query_values_are_found_and_percent_decoded() {
    let table = [
        ("level=debug", Ok(Some("debug"))),
        (
            "x=1&level=access%3Ddebug%2Cinfo",
            Ok(Some("access=debug,info")),
        ),
        ("level=a+b", Ok(Some("a b"))),
        ("other=1", Ok(None)),
        ("", Ok(None)),
        ("level=%zz", Err(AdminError::MalformedQuery)),
        ("level=%4", Err(AdminError::MalformedQuery)),
        ("level=%ff", Err(AdminError::MalformedQuery)),
    ];
    for (query, expected) in table {
        let expected = expected.map(|value| value.map(str::to_owned));
        assert_eq!(query_value(query, "level"), expected, "{query}");
    }
}

/// A workload certificate for `identity`, signed by a fresh root, and the
/// PEM of its private key.
fn workload_certificate(identity: &str) -> (WorkloadCertificate, String) {
    let mut root_params = CertificateParams::default();
    root_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let root_key = KeyPair::generate().unwrap();
    let root = root_params.self_signed(&root_key).unwrap();
    let issuer = Issuer::new(root_params, root_key);

    let mut leaf_params = CertificateParams::default();
    leaf_params.subject_alt_names = vec![SanType::URI(Ia5String::try_from(identity).unwrap())];
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
    let key_pem = leaf_key.serialize_pem();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let certificate =
        WorkloadCertificate::from_ca_response(&[leaf.pem(), root.pem()], key, None).unwrap();
    (certificate, key_pem)
}

#[test]
fn a_certificate_dump_shows_identity_and_expiry_but_no_key() {
    ztunnel_certs::tls::install_provider();
    let identity = "spiffe://cluster.local/ns/b/sa/server";
    let (certificate, key_pem) = workload_certificate(identity);
    let dump = certificate_dump(&certificate, SystemTime::now());
    assert_eq!(dump.identity.as_deref(), Some(identity));
    assert_eq!(dump.chain.len(), 1);
    assert_eq!(dump.chain[0].identities, vec![identity.to_owned()]);
    assert_eq!(
        dump.chain[0].not_after,
        rfc3339(certificate.leaf().not_after())
    );

    let json = serde_json::to_string(&dump).unwrap();
    assert!(!json.contains("PRIVATE KEY"));
    let key_body: String = key_pem
        .lines()
        .filter(|line| !line.starts_with("-----"))
        .collect();
    assert!(!json.contains(&key_body[..32]), "{json}");
}
