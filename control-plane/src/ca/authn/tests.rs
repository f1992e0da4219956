//! Tests for token authentication: a table of tokens and what each yields.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{EncodingKey, Header};
use rcgen::KeyPair;
use serde_json::{Value, json};

use super::*;

const NOW: u64 = 1_800_000_000;

fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(NOW)
}

struct Key {
    encoding: EncodingKey,
    algorithm: Algorithm,
    keys: TokenKeys,
}

fn es256() -> Key {
    let pair = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    Key {
        encoding: EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap(),
        algorithm: Algorithm::ES256,
        keys: TokenKeys::from_pem(pair.public_key_pem().as_bytes()).unwrap(),
    }
}

fn rs256() -> Key {
    let pair =
        KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, rcgen::RsaKeySize::_2048).unwrap();
    Key {
        encoding: EncodingKey::from_rsa_pem(pair.serialize_pem().as_bytes()).unwrap(),
        algorithm: Algorithm::RS256,
        keys: TokenKeys::from_pem(pair.public_key_pem().as_bytes()).unwrap(),
    }
}

fn claims() -> Value {
    json!({
        "iss": DEFAULT_ISSUER,
        "sub": "system:serviceaccount:istio-system:ztunnel",
        "aud": ["istio-ca", "other"],
        "exp": NOW + 3600,
        "iat": NOW - 10,
        "nbf": NOW - 10,
        "warnafter": NOW + 100,
        "kubernetes.io": {
            "namespace": "istio-system",
            "serviceaccount": {"name": "ztunnel", "uid": "sa-uid"},
            "pod": {"name": "ztunnel-abc", "uid": "pod-uid"},
            "node": {"name": "node-1", "uid": "node-uid"},
        },
    })
}

fn sign(key: &Key, claims: &Value) -> String {
    jsonwebtoken::encode(&Header::new(key.algorithm), claims, &key.encoding).unwrap()
}

/// A correctly signed token whose payload is arbitrary bytes.
fn sign_raw_payload(key: &Key, payload: &[u8]) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"ES256","typ":"JWT"}"#);
    let message = format!("{header}.{}", URL_SAFE_NO_PAD.encode(payload));
    let signature =
        jsonwebtoken::crypto::sign(message.as_bytes(), &key.encoding, key.algorithm).unwrap();
    format!("{message}.{signature}")
}

fn with(mut claims: Value, path: &[&str], value: Value) -> Value {
    let mut target = &mut claims;
    let (last, parents) = path.split_last().unwrap();
    for part in parents {
        target = target.get_mut(*part).unwrap();
    }
    if value.is_null() {
        target.as_object_mut().unwrap().remove(*last);
    } else {
        target[*last] = value;
    }
    claims
}

fn authenticate(key: &Key, token: &str) -> Result<Caller, AuthnError> {
    Caller::from_token(token.as_bytes(), &key.keys, &TokenPolicy::default(), now())
}

#[test]
fn valid_tokens_yield_the_pod() {
    let expected = Caller {
        namespace: "istio-system".into(),
        service_account: "ztunnel".into(),
        pod_name: "ztunnel-abc".into(),
        pod_uid: "pod-uid".into(),
        node_name: Some("node-1".into()),
        // `exp` and the default leeway of 60 s.
        expires: Some(UNIX_EPOCH + Duration::from_secs(NOW + 3600) + DEFAULT_LEEWAY),
    };
    for key in [es256(), rs256()] {
        assert_eq!(
            authenticate(&key, &sign(&key, &claims())),
            Ok(expected.clone())
        );
    }
    let key = es256();
    let no_node = with(claims(), &["kubernetes.io", "node"], Value::Null);
    let caller = authenticate(&key, &sign(&key, &no_node)).unwrap();
    assert_eq!(caller.node_name, None);
    let single_aud = with(claims(), &["aud"], json!("istio-ca"));
    assert!(authenticate(&key, &sign(&key, &single_aud)).is_ok());
    let no_sub = with(claims(), &["sub"], Value::Null);
    assert!(authenticate(&key, &sign(&key, &no_sub)).is_ok());
    let within_leeway = with(claims(), &["exp"], json!(NOW - 30));
    assert!(authenticate(&key, &sign(&key, &within_leeway)).is_ok());
}

#[test]
fn bad_tokens_are_denied_with_the_reason() {
    use AuthnError::*;
    let key = es256();
    let other = es256();
    let k8s = |field: &str, value: Value| with(claims(), &["kubernetes.io", field], value);
    let cases: Vec<(&str, String, AuthnError)> = vec![
        ("garbage", "not a jwt".into(), Malformed),
        ("empty", String::new(), Malformed),
        ("two parts", "a.b".into(), Malformed),
        ("other key", sign(&other, &claims()), BadSignature),
        (
            "rsa key for es256 keys",
            sign(&rs256(), &claims()),
            BadSignature,
        ),
        (
            "hmac",
            jsonwebtoken::encode(
                &Header::default(),
                &claims(),
                &EncodingKey::from_secret(b"k"),
            )
            .unwrap(),
            UnsupportedAlgorithm,
        ),
        (
            "expired",
            sign(&key, &with(claims(), &["exp"], json!(NOW - 61))),
            Expired,
        ),
        (
            "no exp",
            sign(&key, &with(claims(), &["exp"], Value::Null)),
            MalformedClaims,
        ),
        (
            "not yet valid",
            sign(&key, &with(claims(), &["nbf"], json!(NOW + 61))),
            NotYetValid,
        ),
        (
            "wrong audience",
            sign(&key, &with(claims(), &["aud"], json!(["istio-ca-x"]))),
            WrongAudience,
        ),
        (
            "no audience",
            sign(&key, &with(claims(), &["aud"], Value::Null)),
            WrongAudience,
        ),
        (
            "wrong issuer",
            sign(&key, &with(claims(), &["iss"], json!("https://evil"))),
            WrongIssuer,
        ),
        (
            "no issuer",
            sign(&key, &with(claims(), &["iss"], Value::Null)),
            WrongIssuer,
        ),
        (
            "no kubernetes claim",
            sign(&key, &with(claims(), &["kubernetes.io"], Value::Null)),
            NotPodBound,
        ),
        ("no pod", sign(&key, &k8s("pod", Value::Null)), NotPodBound),
        (
            "empty pod uid",
            sign(&key, &k8s("pod", json!({"name": "p", "uid": ""}))),
            MalformedClaims,
        ),
        (
            "empty node",
            sign(&key, &k8s("node", json!({"name": ""}))),
            MalformedClaims,
        ),
        (
            "namespace type",
            sign(&key, &k8s("namespace", json!(5))),
            MalformedClaims,
        ),
        (
            "subject mismatch",
            sign(
                &key,
                &with(
                    claims(),
                    &["sub"],
                    json!("system:serviceaccount:default:default"),
                ),
            ),
            SubjectMismatch,
        ),
        (
            "claims not json",
            sign_raw_payload(&key, b"\xff{"),
            MalformedClaims,
        ),
        (
            "claims array",
            sign_raw_payload(&key, b"[1,2]"),
            MalformedClaims,
        ),
        ("too large", "a".repeat(MAX_TOKEN_BYTES + 1), TokenTooLarge),
    ];
    for (name, token, want) in cases {
        assert_eq!(authenticate(&key, &token), Err(want), "{name}");
    }
}

#[test]
fn the_key_named_by_kid_is_tried_else_every_key() {
    use super::super::token::TokenSigner;
    let a = TokenSigner::generate().unwrap();
    let b = TokenSigner::generate().unwrap();
    let jwk = |signer: &TokenSigner| {
        serde_json::from_str::<Value>(&signer.jwks_json()).unwrap()["keys"][0].clone()
    };
    let jwks = json!({ "keys": [jwk(&b), jwk(&a)] }).to_string();
    let keys = TokenKeys::from_jwks(jwks.as_bytes()).unwrap();
    let encoding = EncodingKey::from_ec_pem(a.private_key_pem().as_bytes()).unwrap();
    let check = |kid: &str| {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.into());
        let token = jsonwebtoken::encode(&header, &claims(), &encoding).unwrap();
        Caller::from_token(token.as_bytes(), &keys, &TokenPolicy::default(), now()).map(|_| ())
    };
    assert_eq!(check(a.kid()), Ok(()));
    assert_eq!(
        check("unknown"),
        Ok(()),
        "an unknown kid falls back to every key"
    );
    assert_eq!(
        check(b.kid()),
        Err(AuthnError::BadSignature),
        "a known kid is the only key tried"
    );
}

#[test]
fn tokens_are_checked_against_the_published_keys_before_any_review() {
    use super::super::token::TokenSigner;
    use AuthnError::*;
    let published = TokenSigner::generate().unwrap();
    let keys = published.verifying_keys().unwrap();
    let signing = EncodingKey::from_ec_pem(published.private_key_pem().as_bytes()).unwrap();
    let forger = es256();
    let token = |kid: Option<&str>, key: &EncodingKey, claims: &Value| {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&header, claims, key).unwrap()
    };
    let kid = Some(published.kid());
    let honest = |claims: &Value| token(kid, &signing, claims);
    let cases: Vec<(&str, String, Result<(), AuthnError>)> = vec![
        ("a token of the issuer", honest(&claims()), Ok(())),
        ("not a JWT", "junk".into(), Err(Malformed)),
        ("three parts, not base64", "a.b.c".into(), Err(Malformed)),
        (
            "too large",
            "a".repeat(MAX_TOKEN_BYTES + 1),
            Err(TokenTooLarge),
        ),
        (
            "a kid the issuer does not publish",
            token(Some("made-up"), &signing, &claims()),
            Err(UnknownKeyId),
        ),
        (
            "no kid",
            token(None, &signing, &claims()),
            Err(UnknownKeyId),
        ),
        (
            "a published kid, another key's signature",
            token(kid, &forger.encoding, &claims()),
            Err(BadSignature),
        ),
        (
            "another issuer",
            honest(&with(claims(), &["iss"], json!("https://other"))),
            Err(WrongIssuer),
        ),
        (
            "another audience",
            honest(&with(claims(), &["aud"], json!(["vault"]))),
            Err(WrongAudience),
        ),
        (
            "expired beyond the leeway",
            honest(&with(claims(), &["exp"], json!(NOW - 61))),
            Err(Expired),
        ),
        (
            "expired within the leeway",
            honest(&with(claims(), &["exp"], json!(NOW - 59))),
            Ok(()),
        ),
        (
            "bound to no pod (a legacy Secret token)",
            honest(&with(claims(), &["kubernetes.io", "pod"], Value::Null)),
            Err(NotPodBound),
        ),
    ];
    for (reason, token, expected) in cases {
        let checked =
            Caller::from_published_token(token.as_bytes(), &keys, &TokenPolicy::default(), now());
        assert_eq!(checked.map(|_| ()), expected, "{reason}");
    }
}

#[test]
fn bearer_header_parsing() {
    assert_eq!(bearer_token(None), Err(AuthnError::MissingToken));
    assert_eq!(
        bearer_token(Some(b"Bearer ")),
        Err(AuthnError::MissingToken)
    );
    assert_eq!(bearer_token(Some(b"Basic abc")), Err(AuthnError::NotBearer));
    assert_eq!(
        bearer_token(Some(b"bearer abc")),
        Err(AuthnError::NotBearer)
    );
    assert_eq!(bearer_token(Some(b"Bearer abc")), Ok(&b"abc"[..]));
    let long = [b"Bearer ".as_slice(), &[b'a'; MAX_TOKEN_BYTES + 1]].concat();
    assert_eq!(bearer_token(Some(&long)), Err(AuthnError::TokenTooLarge));
}

#[test]
fn the_expiry_of_a_reviewed_token_is_read_from_its_claims() {
    let key = es256();
    assert_eq!(
        unverified_expiry(sign(&key, &claims()).as_bytes()),
        Some(UNIX_EPOCH + Duration::from_secs(NOW + 3600))
    );
    let no_exp = with(claims(), &["exp"], Value::Null);
    assert_eq!(unverified_expiry(sign(&key, &no_exp).as_bytes()), None);
    for garbage in [&b""[..], b"a.b.c", b"\xff\xfe", b"eyJhbGciOiJFUzI1NiJ9.e30"] {
        assert_eq!(unverified_expiry(garbage), None);
    }
}
