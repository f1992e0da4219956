//! Fuzzes token verification and claim extraction. Half the inputs are used
//! as raw tokens; the other half become the payload of a token correctly
//! signed with a fixed test key, so that the claim parser behind the
//! signature check is reached too.

#![no_main]

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey};
use libfuzzer_sys::fuzz_target;
use ztunnel_control_plane::ca::authn::{Caller, TokenPolicy};
use ztunnel_control_plane::ca::token::TokenSigner;
use ztunnel_control_plane::ca::token_keys::TokenKeys;

/// The fixed test key: generated once per fuzzing process.
struct Fixture {
    keys: TokenKeys,
    signing: EncodingKey,
    header: String,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let signer = TokenSigner::generate().expect("test key");
    Fixture {
        keys: signer.verifying_keys().expect("test key JWKS"),
        signing: EncodingKey::from_ec_pem(signer.private_key_pem().as_bytes()).expect("test key"),
        header: URL_SAFE_NO_PAD.encode(br#"{"alg":"ES256","typ":"JWT"}"#),
    }
});

fuzz_target!(|data: &[u8]| {
    let fixture = &*FIXTURE;
    let policy = TokenPolicy::default();
    let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let Some((mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        let _ = Caller::from_token(rest, &fixture.keys, &policy, now);
        let _ = Caller::from_token(rest, &fixture.keys, &policy, SystemTime::UNIX_EPOCH);
        return;
    }
    let message = format!("{}.{}", fixture.header, URL_SAFE_NO_PAD.encode(rest));
    let Ok(signature) =
        jsonwebtoken::crypto::sign(message.as_bytes(), &fixture.signing, Algorithm::ES256)
    else {
        return;
    };
    let token = format!("{message}.{signature}");
    let _ = Caller::from_token(token.as_bytes(), &fixture.keys, &policy, now);
});
