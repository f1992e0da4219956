//! Tests for CA-side CSR validation.

use rcgen::{CertificateParams, KeyPair, SignatureAlgorithm};

use super::*;

fn csr_der(algorithm: &'static SignatureAlgorithm) -> Vec<u8> {
    let key = KeyPair::generate_for(algorithm).unwrap();
    let params =
        CertificateParams::new(vec!["spiffe://cluster.local/ns/a/sa/b".to_string()]).unwrap();
    params.serialize_request(&key).unwrap().der().to_vec()
}

fn rsa_csr_der() -> Vec<u8> {
    let key = KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048).unwrap();
    CertificateParams::default()
        .serialize_request(&key)
        .unwrap()
        .der()
        .to_vec()
}

fn to_pem(der: &[u8]) -> String {
    let body = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, der);
    format!("-----BEGIN CERTIFICATE REQUEST-----\n{body}\n-----END CERTIFICATE REQUEST-----\n")
}

#[test]
fn p256_and_rsa_requests_are_accepted() {
    let p256 = SigningRequest::from_pem(&to_pem(&csr_der(&rcgen::PKCS_ECDSA_P256_SHA256))).unwrap();
    assert_eq!(p256.key_kind(), KeyKind::EcdsaP256);
    let rsa = SigningRequest::from_pem(&to_pem(&rsa_csr_der())).unwrap();
    assert_eq!(rsa.key_kind(), KeyKind::Rsa { bits: 2048 });
}

#[test]
fn bad_requests_are_refused_with_the_reason() {
    let good = csr_der(&rcgen::PKCS_ECDSA_P256_SHA256);
    let mut bad_signature = good.clone();
    if let Some(last) = bad_signature.last_mut() {
        *last ^= 0x01;
    }
    let mut trailing = good.clone();
    trailing.extend_from_slice(&[0, 0]);
    let cases: Vec<(&str, String, CsrError)> = vec![
        ("empty", String::new(), CsrError::Pem),
        ("not pem", "hello".into(), CsrError::Pem),
        (
            "certificate pem",
            to_pem(&good).replace("CERTIFICATE REQUEST", "CERTIFICATE"),
            CsrError::Pem,
        ),
        (
            "garbage der",
            to_pem(b"\x30\x03\x02\x01\x00"),
            CsrError::Der,
        ),
        ("trailing data", to_pem(&trailing), CsrError::TrailingData),
        ("bad signature", to_pem(&bad_signature), CsrError::Signature),
        (
            "p384 key",
            to_pem(&csr_der(&rcgen::PKCS_ECDSA_P384_SHA384)),
            CsrError::KeyType,
        ),
        (
            "ed25519 key",
            to_pem(&csr_der(&rcgen::PKCS_ED25519)),
            CsrError::KeyType,
        ),
        (
            "too large",
            "A".repeat(MAX_CSR_BYTES + 1),
            CsrError::TooLarge {
                len: MAX_CSR_BYTES + 1,
            },
        ),
    ];
    for (name, pem, want) in cases {
        assert_eq!(SigningRequest::from_pem(&pem).unwrap_err(), want, "{name}");
    }
}

#[test]
fn modulus_bits_ignores_leading_zeros() {
    assert_eq!(modulus_bits(&[]), 0);
    assert_eq!(modulus_bits(&[0, 0]), 0);
    assert_eq!(modulus_bits(&[0x01]), 1);
    assert_eq!(modulus_bits(&[0x00, 0x80, 0x00]), 16);
    let mut rsa_1024 = vec![0x00, 0xc0];
    rsa_1024.extend_from_slice(&[0xff; 127]);
    assert_eq!(modulus_bits(&rsa_1024), 1024);
}
