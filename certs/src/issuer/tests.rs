//! Tests for the issuer: leaf contents, chain layout, clamping, and the
//! checks on loaded material.

use rcgen::{CertificateParams, KeyPair};
use x509_parser::extensions::{GeneralName, ParsedExtension};

use super::*;

const HOUR: Duration = Duration::from_secs(3600);

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn identity() -> Identity {
    "spiffe://cluster.local/ns/default/sa/app".parse().unwrap()
}

fn request() -> SigningRequest {
    let key = KeyPair::generate().unwrap();
    // The CSR asks for another identity; the certificate must not carry it.
    let params = CertificateParams::new(vec!["evil.example".to_string()]).unwrap();
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    SigningRequest::from_pem(&pem).unwrap()
}

fn root_issuer(now: SystemTime) -> (Issuer, GeneratedRoot) {
    let root = generate_root("cluster.local", now).unwrap();
    let material = SigningMaterial {
        root_cert_pem: root.cert_pem.clone(),
        root_key_pem: Some(root.key_pem.clone()),
        ..SigningMaterial::default()
    };
    (Issuer::new(&material).unwrap(), root)
}

/// An intermediate signed by `root`, valid until `not_after`.
fn intermediate(root: &GeneratedRoot, not_after: SystemTime) -> IntermediateMaterial {
    let root_key = KeyPair::from_pem(&root.key_pem).unwrap();
    let root_issuer = rcgen::Issuer::from_ca_cert_pem(&root.cert_pem, root_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.not_before = (now() - HOUR).into();
    params.not_after = not_after.into();
    let cert = params.signed_by(&key, &root_issuer).unwrap();
    IntermediateMaterial {
        chain_pem: cert.pem(),
        key_pem: key.serialize_pem().into(),
    }
}

fn parse(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

#[test]
fn workload_leaf_carries_only_the_authorized_identity() {
    let (issuer, root) = root_issuer(now() - HOUR);
    let chain = issuer
        .sign_workload(&request(), &identity(), 24 * HOUR, now())
        .unwrap();

    assert_eq!(chain.len(), 2, "leaf and root bundle");
    assert_eq!(chain[1], root.cert_pem, "last element is the root bundle");
    assert!(chain[0].ends_with("-----END CERTIFICATE-----\n"));

    let der = parse(&chain[0]);
    let (_, leaf) = X509Certificate::from_der(&der).unwrap();
    assert!(
        leaf.subject().iter_attributes().next().is_none(),
        "empty subject"
    );
    let san = leaf.subject_alternative_name().unwrap().unwrap();
    assert!(san.critical, "SAN is critical when the subject is empty");
    assert_eq!(
        san.value.general_names,
        vec![GeneralName::URI("spiffe://cluster.local/ns/default/sa/app")]
    );
    let key_usage = leaf.key_usage().unwrap().unwrap().value;
    assert!(key_usage.digital_signature() && key_usage.key_encipherment());
    assert!(!key_usage.key_cert_sign());
    let eku = leaf.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth);
    let basic = leaf.basic_constraints().unwrap().unwrap().value;
    assert!(!basic.ca);
    let start = now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    assert_eq!(leaf.validity().not_before.timestamp(), start - 120);
    assert_eq!(leaf.validity().not_after.timestamp(), start + 24 * 3600);
    assert!(leaf.extensions().iter().any(|ext| matches!(
        ext.parsed_extension(),
        ParsedExtension::AuthorityKeyIdentifier(_)
    )));
}

#[test]
fn leaf_never_outlives_its_signer() {
    let (_, root) = root_issuer(now() - HOUR);
    let signer_end = now() + 2 * HOUR;
    let material = SigningMaterial {
        root_cert_pem: root.cert_pem.clone(),
        root_key_pem: None,
        intermediate: Some(intermediate(&root, signer_end)),
        extra_roots_pem: None,
    };
    let issuer = Issuer::new(&material).unwrap();
    let chain = issuer
        .sign_workload(&request(), &identity(), 24 * HOUR, now())
        .unwrap();
    let der = parse(&chain[0]);
    let (_, leaf) = X509Certificate::from_der(&der).unwrap();
    let end = signer_end.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    assert_eq!(leaf.validity().not_after.timestamp(), end);

    let expired = issuer.sign_workload(&request(), &identity(), HOUR, signer_end);
    assert!(matches!(expired, Err(IssuerError::SignerExpired)));
}

#[test]
fn chain_has_each_intermediate_then_the_whole_root_bundle() {
    let (_, root) = root_issuer(now() - HOUR);
    let old_root = generate_root("cluster.local", now() - HOUR).unwrap();
    let intermediate = intermediate(&root, now() + 48 * HOUR);
    let material = SigningMaterial {
        root_cert_pem: root.cert_pem.clone(),
        root_key_pem: None,
        intermediate: Some(intermediate.clone()),
        extra_roots_pem: Some(old_root.cert_pem.clone()),
    };
    let issuer = Issuer::new(&material).unwrap();
    let chain = issuer
        .sign_workload(&request(), &identity(), HOUR, now())
        .unwrap();

    assert_eq!(chain.len(), 3);
    assert_eq!(parse(&chain[1]), parse(&intermediate.chain_pem));
    assert_eq!(chain[1].matches("BEGIN CERTIFICATE").count(), 1);
    assert!(chain[1].ends_with('\n'));
    assert_eq!(chain[2], format!("{}{}", root.cert_pem, old_root.cert_pem));
    assert_eq!(issuer.roots().len(), 2);

    let leaf_der = parse(&chain[0]);
    let (_, leaf) = X509Certificate::from_der(&leaf_der).unwrap();
    let inter_der = parse(&intermediate.chain_pem);
    let (_, inter) = X509Certificate::from_der(&inter_der).unwrap();
    leaf.verify_signature(Some(inter.public_key())).unwrap();
}

#[test]
fn inconsistent_material_is_refused() {
    let (_, root) = root_issuer(now());
    let other = generate_root("cluster.local", now()).unwrap();
    let mismatched = SigningMaterial {
        root_cert_pem: root.cert_pem.clone(),
        root_key_pem: Some(other.key_pem.clone()),
        ..SigningMaterial::default()
    };
    assert!(matches!(
        Issuer::new(&mismatched),
        Err(IssuerError::KeyMismatch { .. })
    ));

    let no_key = SigningMaterial {
        root_cert_pem: root.cert_pem.clone(),
        ..SigningMaterial::default()
    };
    assert!(matches!(
        Issuer::new(&no_key),
        Err(IssuerError::NoSigningKey)
    ));

    let foreign_intermediate = SigningMaterial {
        root_cert_pem: root.cert_pem.clone(),
        intermediate: Some(intermediate(&other, now() + HOUR)),
        ..SigningMaterial::default()
    };
    assert!(matches!(
        Issuer::new(&foreign_intermediate),
        Err(IssuerError::BrokenChain { index: 0 })
    ));

    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["x".to_string()])
        .unwrap()
        .self_signed(&leaf_key)
        .unwrap();
    let not_ca = SigningMaterial {
        root_cert_pem: leaf.pem(),
        root_key_pem: Some(leaf_key.serialize_pem().into()),
        ..SigningMaterial::default()
    };
    assert!(matches!(
        Issuer::new(&not_ca),
        Err(IssuerError::NotCa { .. })
    ));

    let garbage = SigningMaterial {
        root_cert_pem: "nope".into(),
        ..SigningMaterial::default()
    };
    assert!(matches!(
        Issuer::new(&garbage),
        Err(IssuerError::NoCertificate { .. })
    ));
}

#[test]
fn ttl_policy_defaults_and_bounds() {
    let policy = TtlPolicy::new(24 * HOUR, 90 * 24 * HOUR);
    let max = 90 * 24 * 3600;
    let cases: &[(i64, Option<Duration>)] = &[
        (0, Some(24 * HOUR)),
        (-5, Some(24 * HOUR)),
        (i64::MIN, Some(24 * HOUR)),
        (3600, Some(HOUR)),
        (max, Some(Duration::from_secs(max as u64))),
        (max + 1, None),
        (i64::MAX, None),
    ];
    for (requested, want) in cases {
        assert_eq!(policy.resolve(*requested).ok(), *want, "{requested}");
    }
    assert_eq!(TtlPolicy::new(24 * HOUR, HOUR).default_ttl(), HOUR);
}

#[test]
fn serving_certificate_names_the_ca_hosts() {
    let (issuer, _) = root_issuer(now() - HOUR);
    let names = vec![
        "localhost".to_string(),
        "istiod.istio-system.svc".to_string(),
    ];
    let ips = vec![IpAddr::from([127, 0, 0, 1])];
    let serving = issuer.sign_server(&names, &ips, now()).unwrap();
    assert_eq!(serving.chain.len(), 1);
    let (_, leaf) = X509Certificate::from_der(&serving.chain[0]).unwrap();
    let san = leaf.subject_alternative_name().unwrap().unwrap().value;
    assert_eq!(san.general_names.len(), 3);
    assert!(
        san.general_names
            .contains(&GeneralName::DNSName("istiod.istio-system.svc"))
    );
}

#[test]
fn debug_output_of_the_signing_material_leaves_every_key_out() {
    let root = generate_root("cluster.local", now()).unwrap();
    let intermediate = intermediate(&root, now() + HOUR);
    let material = SigningMaterial {
        root_cert_pem: root.cert_pem.clone(),
        root_key_pem: Some(root.key_pem.clone()),
        intermediate: Some(intermediate.clone()),
        extra_roots_pem: None,
    };
    let shown = format!("{material:?} {material:#?} {root:?} {intermediate:?}");
    assert!(
        shown.contains("BEGIN CERTIFICATE"),
        "certificates are shown"
    );
    for key in [&root.key_pem, &intermediate.key_pem] {
        let body = key.lines().nth(1).unwrap();
        assert!(!shown.contains(body), "a key line leaked: {shown}");
    }
    assert!(!shown.contains("PRIVATE KEY"));
}

/// Compiles only for types that wipe themselves on drop.
fn wiped_on_drop<T: zeroize::ZeroizeOnDrop>() {}

#[test]
fn the_signing_key_keeps_no_der_copy_and_its_pem_is_wiped_on_drop() {
    wiped_on_drop::<SecretPem>();
    let root = generate_root("cluster.local", now()).unwrap();
    let key = parse_key(&root.key_pem, "root key").unwrap();
    // rcgen's own DER copy is gone; signing uses the parsed key only.
    assert!(key.serialized_der().is_empty());
    let (issuer, _) = root_issuer(now());
    let chain = issuer
        .sign_workload(&request(), &identity(), HOUR, now())
        .unwrap();
    assert_eq!(chain.len(), 2);
}
