//! Parsing certificates into their facts (identities, validity, CA flag)
//! and turning CA responses into workload certificates, with the refusals
//! of WIRE.md §2 and §3.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;

use super::*;
use crate::error_chain::ErrorChain;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// A CA generated for the test: its certificate and the means to sign with it.
struct TestCa {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca(name: &str, parent: Option<&TestCa>) -> TestCa {
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
    TestCa {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

fn uri(text: &str) -> SanType {
    SanType::URI(Ia5String::try_from(text).unwrap())
}

fn unix(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(seconds)
}

/// A leaf with `sans`, valid from `not_before` to `not_after`, and its key.
fn leaf_with(
    ca: &TestCa,
    sans: Vec<SanType>,
    not_before: SystemTime,
    not_after: SystemTime,
) -> (String, PrivateKeyDer<'static>) {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = sans;
    params.not_before = OffsetDateTime::from(not_before);
    params.not_after = OffsetDateTime::from(not_after);
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    (cert.pem(), key)
}

fn leaf(ca: &TestCa, sans: Vec<SanType>) -> (String, PrivateKeyDer<'static>) {
    let now = SystemTime::now();
    leaf_with(ca, sans, now - Duration::from_secs(120), now + DAY)
}

#[test]
fn the_validity_window_is_read_from_the_certificate() {
    let root = ca("root", None);
    let not_before = unix(1_700_000_000);
    let not_after = not_before + DAY;
    let (pem, _) = leaf_with(
        &root,
        vec![uri("spiffe://td/ns/a/sa/b")],
        not_before,
        not_after,
    );
    let cert = Certificate::from_pem(&pem).unwrap();
    assert_eq!(cert.not_before(), not_before);
    assert_eq!(cert.not_after(), not_after);
}

#[test]
fn identities_come_from_uri_sans_only() {
    let root = ca("root", None);
    let dns = SanType::DnsName(Ia5String::try_from("spiffe.example").unwrap());
    // (case, SANs, identities, own identity, URI SAN count)
    type Case = (
        &'static str,
        Vec<SanType>,
        Vec<&'static str>,
        Option<&'static str>,
        usize,
    );
    let cases: [Case; 5] = [
        (
            "one identity",
            vec![uri("spiffe://td/ns/a/sa/b")],
            vec!["spiffe://td/ns/a/sa/b"],
            Some("spiffe://td/ns/a/sa/b"),
            1,
        ),
        ("none", vec![dns.clone()], vec![], None, 0),
        (
            "two identities, first is own",
            vec![
                uri("spiffe://td/ns/a/sa/b"),
                dns,
                uri("spiffe://td/ns/c/sa/d"),
            ],
            vec!["spiffe://td/ns/a/sa/b", "spiffe://td/ns/c/sa/d"],
            Some("spiffe://td/ns/a/sa/b"),
            2,
        ),
        (
            "non-identity URI skipped but counted",
            vec![uri("https://example.com/x"), uri("spiffe://td/ns/a/sa/b")],
            vec!["spiffe://td/ns/a/sa/b"],
            None,
            2,
        ),
        (
            "malformed identity skipped",
            vec![uri("spiffe://td/ns/a/sa/")],
            vec![],
            None,
            1,
        ),
    ];
    for (name, sans, identities, identity, count) in cases {
        let (pem, _) = leaf(&root, sans);
        let cert = Certificate::from_pem(&pem).unwrap();
        let found: Vec<&str> = cert.identities().iter().map(Identity::as_str).collect();
        assert_eq!(found, identities, "{name}");
        assert_eq!(cert.identity().map(Identity::as_str), identity, "{name}");
        assert_eq!(cert.uri_san_count(), count, "{name}");
        assert!(!cert.is_ca(), "{name}");
    }
}

#[test]
fn a_san_with_an_embedded_nul_refuses_the_certificate() {
    let root = ca("root", None);
    let nul_uri = uri("spiffe://td/ns/a/sa/b\0.evil");
    let nul_dns = SanType::DnsName(Ia5String::try_from("good.example\0.evil").unwrap());
    for sans in [vec![nul_uri], vec![uri("spiffe://td/ns/a/sa/b"), nul_dns]] {
        let (pem, _) = leaf(&root, sans);
        assert!(matches!(
            Certificate::from_pem(&pem),
            Err(CertError::NulInSan)
        ));
    }
}

#[test]
fn ca_flag_and_malformed_input_are_reported() {
    let root = ca("root", None);
    assert!(Certificate::from_pem(&root.pem).unwrap().is_ca());

    let der = parse_pem_bundle(&root.pem).unwrap().remove(0);
    let mut trailing = der.to_vec();
    trailing.push(0);
    let trailing = Certificate::from_der(CertificateDer::from(trailing));
    assert!(matches!(trailing, Err(CertError::TrailingData)));
    let garbage = Certificate::from_der(CertificateDer::from(vec![0x30, 0x03, 1, 2, 3]));
    assert!(matches!(garbage, Err(CertError::Der(_))));

    let two = format!("{}{}", root.pem, root.pem);
    assert_eq!(parse_pem_bundle(&two).unwrap().len(), 2);
    let cases = [("", 0), ("not a pem", 0), (two.as_str(), 2)];
    for (pem, found) in cases {
        let result = Certificate::from_pem(pem);
        assert!(
            matches!(result, Err(CertError::CertificateCount { found: f }) if f == found),
            "{pem:?}"
        );
    }
    let broken = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
    assert!(matches!(
        Certificate::from_pem(broken),
        Err(CertError::Pem(_))
    ));
}

#[test]
fn ca_responses_become_workload_certificates() {
    let root = ca("root", None);
    let other_root = ca("other root", None);
    let intermediate = ca("intermediate", Some(&root));
    let id: Identity = "spiffe://td/ns/a/sa/b".parse().unwrap();
    let (direct, direct_key) = leaf(&root, vec![uri(id.as_str())]);
    let (via, via_key) = leaf(&intermediate, vec![uri(id.as_str())]);
    let bundle = format!("{}{}", other_root.pem, root.pem);

    let cert = WorkloadCertificate::from_ca_response(
        &[direct.clone(), root.pem.clone()],
        direct_key.clone_key(),
        Some(&id),
    )
    .unwrap();
    assert_eq!(cert.identity(), Some(&id));
    assert!(cert.intermediates().is_empty());
    assert_eq!(cert.roots().certificates().len(), 1);
    assert_eq!(cert.certified_key().cert.len(), 1);

    let cert = WorkloadCertificate::from_ca_response(
        &[via, intermediate.pem.clone(), bundle],
        via_key,
        None,
    )
    .unwrap();
    assert_eq!(cert.intermediates().len(), 1);
    assert!(cert.intermediates()[0].is_ca());
    assert_eq!(
        cert.roots().certificates().len(),
        2,
        "every root of the bundle is trusted"
    );
    assert_eq!(
        cert.certified_key().cert.len(),
        2,
        "leaf and intermediate are presented"
    );
    let shown = format!("{cert:?}");
    assert!(
        shown.contains("spiffe://td/ns/a/sa/b") && !shown.contains("key"),
        "{shown}"
    );
}

#[test]
fn bad_ca_responses_are_refused_with_the_reason() {
    let root = ca("root", None);
    let id: Identity = "spiffe://td/ns/a/sa/b".parse().unwrap();
    let other: Identity = "spiffe://td/ns/a/sa/c".parse().unwrap();
    let (good, key) = leaf(&root, vec![uri(id.as_str())]);
    let (_, foreign_key) = leaf(&root, vec![uri(id.as_str())]);

    let check = |chain: &[String], key: &PrivateKeyDer<'static>, requested, want: &str| {
        let result = WorkloadCertificate::from_ca_response(chain, key.clone_key(), requested);
        let error = result.map(|_| ()).unwrap_err();
        let shown = ErrorChain(&error).to_string();
        assert!(shown.contains(want), "{want}: got {shown}");
        error
    };
    assert!(matches!(
        check(&[], &key, None, "no certificates"),
        CertError::EmptyChain
    ));
    assert!(matches!(
        check(
            std::slice::from_ref(&good),
            &key,
            None,
            "no root certificate present"
        ),
        CertError::NoRoot
    ));
    let error = check(
        &[good.clone(), root.pem.clone()],
        &key,
        Some(&other),
        "requested",
    );
    assert!(
        matches!(error, CertError::IdentityMismatch { requested, found: Some(found) }
        if *requested == other && *found == id)
    );
    let error = check(
        &[good.clone(), String::new()],
        &key,
        None,
        "no root certificate present",
    );
    assert!(matches!(error, CertError::Roots(RootsError::Empty)));
    let error = check(&["junk".into(), root.pem.clone()], &key, None, "found 0");
    assert!(matches!(error, CertError::CertificateCount { found: 0 }));
    let error = check(
        &[good.clone(), root.pem.clone()],
        &foreign_key,
        None,
        "private key",
    );
    assert!(matches!(error, CertError::Key(_)));
}

#[test]
fn the_serial_number_reads_in_decimal_as_operators_tools_print_it() {
    let mut params = CertificateParams::default();
    // 0x01_00 = 256: a serial whose hex and decimal forms differ.
    params.serial_number = Some(rcgen::SerialNumber::from_slice(&[0x01, 0x00]));
    let key = KeyPair::generate().unwrap();
    let pem = params.self_signed(&key).unwrap().pem();
    assert_eq!(Certificate::from_pem(&pem).unwrap().serial(), "256");
}
