//! Fuzzes the control plane's side of delta xDS (WIRE.md §7): the gRPC
//! request stream a node agent sends, cut into chunks
//! (`wire::RequestDecoder`), each request handled by one stream's state
//! machine (`delta::DeltaStream::on_request`) against the resources of a
//! fixed mesh, and each response framed for the wire (`wire::PushFrames`).
//!
//! The input is `[chunk size][stream bytes]`.
//!
//! Properties: no panic; a response frame is exactly as long as it says
//! and decodes as a `DeltaDiscoveryResponse` the proxy's xDS core accepts
//! whole; nonces are never repeated; a subscription's answer, applied to
//! the versions the client said it holds, leaves it holding exactly the
//! server's resources; the same build again sends nothing.

#![no_main]

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use ztunnel_control_plane::xds::cache::MeshResources;
use ztunnel_control_plane::xds::delta::{DeltaStream, Push, RequestKind};
use ztunnel_control_plane::xds::wire::{PushFrames, RequestDecoder};
use ztunnel_mesh::{MeshFile, MeshSnapshot};
use ztunnel_proto::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use ztunnel_proxy::state::Interner;
use ztunnel_proxy::xds::{KnownVersions, decide};

/// Largest request accepted: small, so that the limit is reached.
const MAX_REQUEST_BYTES: usize = 2048;

const MESH: &str = r#"
pods:
- {name: web-0, namespace: shop, uid: uid-web-0, serviceAccount: web, nodeName: node-a, ips: [10.0.0.1], labels: {app: web}}
- {name: db-0, namespace: shop, uid: uid-db-0, serviceAccount: db, nodeName: node-b, ips: [10.0.0.2], labels: {app: db}}
services:
- {name: web, namespace: shop, hostname: web.shop.svc.cluster.local, vips: [10.96.0.10], ports: {80: 8080}, selector: {app: web}}
policies:
- {name: allow-web, namespace: shop, scope: WorkloadSelector, selector: {app: db}, action: Allow, rules: [[[{principals: [!Exact cluster.local/ns/shop/sa/web]}]]]}
"#;

static RESOURCES: LazyLock<MeshResources> = LazyLock::new(|| {
    let file: MeshFile = serde_yaml_ng::from_str(MESH).expect("the fixture parses");
    let snapshot = MeshSnapshot::new(file).expect("the fixture is a valid mesh");
    MeshResources::build(&snapshot, "cluster.local", &MeshResources::empty())
});

/// Frames `push` as the server writes it, and reads it back as the proxy.
fn sent(push: &Push) -> DeltaDiscoveryResponse {
    let frames = PushFrames::new(push.clone()).expect("a small response frames");
    let len = frames.len();
    let bytes: Vec<u8> = frames.flat_map(|chunk| chunk.to_vec()).collect();
    assert_eq!(bytes.len(), len);
    let (prefix, message) = bytes.split_at(5);
    assert_eq!(prefix[0], 0, "uncompressed");
    assert_eq!(
        u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize,
        message.len()
    );
    DeltaDiscoveryResponse::decode(message).expect("the proxy decodes the response")
}

fn check_response(request: &DeltaDiscoveryRequest, kind: &RequestKind, push: &Push) {
    let response = sent(push);
    assert_eq!(response.nonce, push.nonce);
    let update = decide(&KnownVersions::new(), &response, &mut Interner::new());
    assert!(update.rejected.is_empty(), "{:?}", update.rejected);
    assert_eq!(update.reply.response_nonce, push.nonce);

    let RequestKind::Subscribe { kind, .. } = kind else {
        assert!(push.resources.is_empty() && push.removed.is_empty());
        return;
    };
    // The client's versions after this answer are the server's.
    let mut held: HashMap<&str, &str> = request
        .initial_resource_versions
        .iter()
        .map(|(name, version)| (name.as_str(), version.as_str()))
        .collect();
    for entry in &push.resources {
        held.insert(&entry.name, &entry.version);
    }
    for name in &push.removed {
        assert!(
            held.remove(&**name).is_some(),
            "{name} removed but not held"
        );
    }
    let set = RESOURCES.get(*kind);
    assert_eq!(held.len(), set.len());
    for (name, version) in held {
        let entry = set.get(name).expect("held only what the server has");
        assert_eq!(entry.version, version);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut decoder = RequestDecoder::new(MAX_REQUEST_BYTES);
    let mut state = DeltaStream::new(7);
    let mut nonces = HashSet::new();
    for piece in stream.chunks(chunk) {
        decoder.extend(piece);
        loop {
            let request = match decoder.decode() {
                Ok(Some(request)) => request,
                Ok(None) => break,
                Err(_) => return,
            };
            let (kind, pushes) = state.on_request(&request, &RESOURCES);
            // One build throughout: every subscribed type is already at it,
            // so a request calls for its own answer at most.
            assert!(
                pushes.len() <= 1,
                "{} responses to one request",
                pushes.len()
            );
            for push in pushes {
                assert!(
                    nonces.insert(push.nonce.clone()),
                    "nonce {} repeated",
                    push.nonce
                );
                check_response(&request, &kind, &push);
            }
        }
    }
    // The same build again: nothing more to send.
    assert!(state.on_resources(&RESOURCES).is_empty());
});
