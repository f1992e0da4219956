//! What more than one fuzz target checks, and the recorded TLS session the
//! record-layer targets share (`record`). The targets themselves are in
//! `fuzz_targets/`.

#![warn(missing_docs)]

use std::collections::HashMap;

use prost::Message;
use ztunnel_control_plane::xds::cache::{Known, MeshResources, changes_since};
use ztunnel_mesh::MeshSnapshot;
use ztunnel_proto::envoy::service::discovery::v3::{DeltaDiscoveryResponse, Resource};
use ztunnel_proto::xds_types::ResourceKind;
use ztunnel_proxy::state::{Interner, State};
use ztunnel_proxy::xds::{KnownVersions, apply_changes, decide};

pub mod record;

/// Serves `snapshot` as the control plane does (every resource of both
/// types, as encoded for the wire) to the proxy's xDS core, and checks that
/// the proxy accepts every one: whatever the control plane accepts as a
/// mesh, it must never send a resource its own node proxies NACK.
pub fn check_served_to_proxy(snapshot: &MeshSnapshot, trust_domain: &str) {
    let resources = MeshResources::build(snapshot, trust_domain, &MeshResources::empty());
    let mut state = State::new();
    let mut known = KnownVersions::new();
    let mut interner = Interner::new();
    for kind in ResourceKind::ALL {
        let (entries, removed) =
            changes_since(Known::Versions(&HashMap::new()), resources.get(kind));
        assert!(removed.is_empty());
        let response = DeltaDiscoveryResponse {
            type_url: kind.type_url().to_owned(),
            nonce: "1".to_owned(),
            resources: entries
                .iter()
                .map(|entry| Resource::decode(entry.encoded.clone()).expect("an encoded Resource"))
                .collect(),
            ..DeltaDiscoveryResponse::default()
        };
        let update = decide(&known, &response, &mut interner);
        assert!(
            update.rejected.is_empty(),
            "the proxy NACKs what the control plane serves: {:?}",
            update.rejected
        );
        let kind = update.kind.expect("a type the proxy handles");
        known.record(kind, update.versions);
        let applied = apply_changes(&mut state, update.changes);
        assert_eq!(applied.updated, entries.len());
        assert_eq!(known.len(kind), entries.len());
    }
    // The users' policies and those converted from PeerAuthentications.
    assert_eq!(
        state.policies().count(),
        snapshot.policies().len() + snapshot.peer_authentication_policies().len()
    );
    assert_eq!(state.services().count(), snapshot.services().len());
}
