//! Fuzzes the xDS client's pure core: bytes decoded as a
//! `DeltaDiscoveryResponse` (the Address and Authorization payloads inside
//! it included), [`decide`] against what is known, and the changes applied
//! to a state, twice, so that the second round removes what the first
//! accepted. The first byte picks the type URL, so that the conversions are
//! reached without the fuzzer having to find the exact string.
//!
//! Properties: no panic; the reply echoes the nonce and type; it is an ACK
//! exactly when nothing was rejected, and a NACK's detail is code 0 with
//! each rejection as `<name>: <reason>` joined by `; `; a rejected name is
//! not recorded as known.

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use ztunnel_proto::envoy::service::discovery::v3::DeltaDiscoveryResponse;
use ztunnel_proto::xds_types::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};
use ztunnel_proxy::state::{Interner, State};
use ztunnel_proxy::xds::{KnownVersions, apply_changes, decide};

fuzz_target!(|data: &[u8]| {
    let Some((selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(mut response) = DeltaDiscoveryResponse::decode(rest) else {
        return;
    };
    match selector % 3 {
        0 => response.type_url = ADDRESS_TYPE_URL.to_owned(),
        1 => response.type_url = AUTHORIZATION_TYPE_URL.to_owned(),
        _ => {}
    }
    let mut known = KnownVersions::new();
    let mut interner = Interner::new();
    let mut state = State::new();
    for _round in 0..2 {
        let update = decide(&known, &response, &mut interner);
        assert_eq!(update.reply.response_nonce, response.nonce);
        assert_eq!(update.reply.type_url, response.type_url);
        assert!(update.reply.node.is_none());
        match &update.reply.error_detail {
            None => assert!(update.rejected.is_empty()),
            Some(detail) => {
                assert_eq!(detail.code, 0);
                assert!(detail.details.is_empty());
                let expected: Vec<String> =
                    update.rejected.iter().map(ToString::to_string).collect();
                assert_eq!(detail.message, expected.join("; "));
            }
        }
        let kind = update.kind;
        let rejected = update.rejected.clone();
        apply_changes(&mut state, update.changes);
        let Some(kind) = kind else {
            assert!(update.versions.is_empty());
            return;
        };
        let before = known.clone();
        known.record(kind, update.versions);
        for rejection in &rejected {
            // A name given once and rejected is not recorded; what was known
            // before stays as it was.
            let given = response
                .resources
                .iter()
                .filter(|resource| resource.name == rejection.name)
                .count();
            if given == 1 && !response.removed_resources.contains(&rejection.name) {
                assert_eq!(
                    known.version(kind, &rejection.name),
                    before.version(kind, &rejection.name)
                );
            }
        }
    }
});
