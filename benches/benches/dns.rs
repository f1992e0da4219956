#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench set-up: a panic is a failed run
//! The DNS proxy's query path per query (`proxy/src/dns/`), against the
//! 10,000-workload, 1,000-service store of `lookup`.
//!
//! `answered`: bytes of an A query → `wire::parse` → `answer::decide`
//! (aliases, service lookup, records) → `wire::encode` for UDP, for a
//! short name (`svc-7`, expanded from the client's namespace), a full
//! name, and a name that is not the mesh's (every alias and wildcard
//! tried, then left to the upstream: the decision cost of a forwarded
//! query).
//!
//! `forwarded`: `Forwarder::forward` over UDP to a nameserver on
//! 127.0.0.1 that sends each query straight back as its answer: the
//! proxy's socket work per forwarded query (a socket per query, send,
//! receive), without an upstream's own cost.

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use hickory_proto::op::{Edns, Message, Query};
use hickory_proto::rr::{Name, RecordType};
use rand::SeedableRng;
use rand::rngs::StdRng;
use ztunnel_proxy::dns::answer::{self, Client, Decision, Settings};
use ztunnel_proxy::dns::forward::Forwarder;
use ztunnel_proxy::dns::wire::{self, Transport};
use ztunnel_proxy::socket::LocalSockets;

#[path = "common/mesh.rs"]
mod mesh;

fn query(name: &str) -> Vec<u8> {
    let mut message = Message::query();
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    message.set_edns(Edns::new());
    message.to_vec().unwrap()
}

fn answered(c: &mut Criterion) {
    let state = mesh::store_of(mesh::WORKLOADS);
    let settings = Settings::default();
    let client = Client {
        namespace: "ns-007".into(),
        network: "".into(),
    };
    let mut rng = StdRng::seed_from_u64(1);
    let mut group = c.benchmark_group("dns_answered");
    for (case, name) in [
        ("short_name", "svc-7."),
        ("full_name", "svc-7.ns-007.svc.cluster.local."),
        ("not_in_mesh", "www.example.com.ns-007.svc.cluster.local."),
    ] {
        let bytes = query(name);
        group.bench_function(case, |b| {
            b.iter(|| {
                let request = wire::parse(black_box(&bytes)).unwrap();
                match answer::decide(&request, Some(&client), &settings, &state, &mut rng) {
                    Decision::Answer(response) => {
                        black_box(wire::encode(response, &request, Transport::Udp).unwrap());
                    }
                    Decision::Forward => {
                        black_box(());
                    }
                }
            });
        });
    }
    group.finish();
}

fn forwarded(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let upstream: SocketAddr = runtime.block_on(async {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buffer = vec![0; 4096];
            loop {
                let Ok((length, from)) = socket.recv_from(&mut buffer).await else {
                    return;
                };
                // The query itself, flagged as a response.
                buffer[2] |= 0x80;
                let _ = socket.send_to(&buffer[..length], from).await;
            }
        });
        addr
    });
    let forwarder = Forwarder::new(vec![upstream]);
    let sockets = LocalSockets::default();
    let bytes = query("www.example.com.");
    c.bench_function("dns_forwarded/udp", |b| {
        b.to_async(&runtime).iter(|| async {
            black_box(
                forwarder
                    .forward(&sockets, &bytes, 7, Transport::Udp)
                    .await
                    .unwrap(),
            )
        });
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = answered, forwarded
}
criterion_main!(benches);
