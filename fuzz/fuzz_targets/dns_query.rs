//! Fuzzes the DNS proxy's query path as far as it is pure
//! (`proxy/src/dns/`): the request bytes through `wire::parse` (or
//! `wire::format_error` when they do not parse), `answer::decide` against
//! a fixed mesh (services with search-list names, wildcards, a headless
//! service, two networks), then `wire::encode` for UDP and for TCP.
//!
//! The input is the request as it arrives on the wire: malformed
//! packets, compression loops and pointers past the end, huge section
//! counts, EDNS of every size all come from the bytes.
//!
//! Properties: no panic; a FORMERR is sent only to bytes with a header
//! that is not a response, and carries its id; a local response keeps the
//! request's id and question, and a NOERROR one is authoritative with
//! every record's TTL 30; over UDP the response fits what the client
//! takes (512 bytes, or its EDNS payload) and says TC when it left
//! records out; over TCP nothing is left out; every response decodes.

#![no_main]

use std::path::Path;
use std::sync::LazyLock;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use libfuzzer_sys::fuzz_target;
use rand::SeedableRng;
use rand::rngs::StdRng;
use ztunnel_proxy::config::local;
use ztunnel_proxy::dns::answer::{self, Client, Decision, Settings, TTL};
use ztunnel_proxy::dns::wire::{self, Transport, UDP_MIN_PAYLOAD};
use ztunnel_proxy::state::State;

const MESH: &str = r#"
workloads:
- uid: pod-a
  name: pod-a
  namespace: ns1
  workloadIps: ["10.0.0.1", "fd00::1"]
  services:
    ns1/headless.ns1.svc.cluster.local: {80: 8080}
- uid: pod-b
  name: pod-b
  namespace: ns1
  workloadIps: ["10.0.0.2"]
  services:
    ns1/headless.ns1.svc.cluster.local: {80: 8080}
services:
- {name: echo, namespace: ns1, hostname: echo.ns1.svc.cluster.local, vips: ["/10.96.0.1", "/fd00::96:1", "net2/10.97.0.1"], ports: {80: 8080}}
- {name: echo, namespace: ns2, hostname: echo.ns2.svc.cluster.local, vips: ["/10.96.0.2"], ports: {80: 8080}}
- {name: google, namespace: ext, hostname: www.google.com, vips: ["/1.1.1.1"], ports: {443: 443}}
- {name: wild, namespace: ext, hostname: "*.wildcard", vips: ["/10.10.10.10"], ports: {80: 80}}
- {name: headless, namespace: ns1, hostname: headless.ns1.svc.cluster.local, vips: [], ports: {80: 8080}}
- {name: none, namespace: ext, hostname: no-address.example.com, vips: [], ports: {80: 80}}
"#;

static STATE: LazyLock<State> = LazyLock::new(|| {
    local::parse(MESH, Path::new("mesh.yaml"))
        .expect("the fixed mesh parses")
        .into_state()
});

fuzz_target!(|data: &[u8]| {
    let request = match wire::parse(data) {
        Ok(request) => request,
        Err(_) => {
            if let Some(reply) = wire::format_error(data) {
                assert!(data.len() >= 12 && data[2] & 0x80 == 0);
                let reply = Message::from_vec(&reply).expect("a FORMERR decodes");
                assert_eq!(reply.metadata.id, u16::from_be_bytes([data[0], data[1]]));
                assert_eq!(reply.metadata.response_code, ResponseCode::FormErr);
            }
            return;
        }
    };
    let client = Client {
        namespace: "ns1".into(),
        network: "".into(),
    };
    let settings = Settings::default();
    let mut rng = StdRng::seed_from_u64(u64::from(request.metadata.id));
    let response = match answer::decide(&request, Some(&client), &settings, &STATE, &mut rng) {
        Decision::Forward => return,
        Decision::Answer(response) => response,
    };
    assert_eq!(response.metadata.id, request.metadata.id);
    assert_eq!(response.metadata.message_type, MessageType::Response);
    if response.metadata.response_code == ResponseCode::NoError {
        assert!(response.metadata.authoritative);
        assert_eq!(response.queries, request.queries);
        assert!(response.answers.iter().all(|record| record.ttl == TTL));
    }
    let full = response.answers.len();

    let limit = request
        .edns
        .as_ref()
        .map_or(UDP_MIN_PAYLOAD, |edns| edns.max_payload().max(UDP_MIN_PAYLOAD));
    if let Ok(udp) = wire::encode(response.clone(), &request, Transport::Udp) {
        assert!(udp.len() <= usize::from(limit), "{} over {limit}", udp.len());
        let decoded = Message::from_vec(&udp).expect("a UDP response decodes");
        assert_eq!(decoded.metadata.id, request.metadata.id);
        assert!(decoded.answers.len() == full || decoded.metadata.truncation);
    }
    if let Ok(tcp) = wire::encode(response, &request, Transport::Tcp) {
        let decoded = Message::from_vec(&tcp).expect("a TCP response decodes");
        assert_eq!(decoded.answers.len(), full);
        assert!(!decoded.metadata.truncation);
    }
});
