#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench set-up: a panic is a failed run
//! The connection bound's cost per connection: a slot taken and given
//! back (`capacity.rs`), what every accepted connection, HBONE stream and
//! same-node connection pays twice. `share/*` is the per-pod ledger (one
//! lock, a few additions); `semaphore` is the node-wide semaphore alone,
//! what the bound cost before pods had shares, for comparison.
//!
//! `share/busy_node` takes the slot for one pod while 255 others each
//! hold 16, so the ledger's map and sums are those of a full node.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tokio::sync::Semaphore;
use ztunnel_proxy::capacity::{Capacity, Listener};
use ztunnel_proxy::config::WorkloadInfo;

fn pod(index: usize) -> WorkloadInfo {
    format!("bench/pod-{index}/default").parse().unwrap()
}

fn capacity(c: &mut Criterion) {
    let mut group = c.benchmark_group("capacity");
    group.measurement_time(Duration::from_secs(3));

    let alone = Arc::new(Capacity::new(65_536, 256));
    let only = alone.join(&pod(0));
    group.bench_function("share/one_pod", |b| {
        b.iter(|| drop(black_box(only.admit(Listener::Outbound))));
    });

    let busy = Arc::new(Capacity::new(65_536, 256));
    let shares: Vec<_> = (0..256).map(|index| busy.join(&pod(index))).collect();
    let held: Vec<_> = shares[1..]
        .iter()
        .flat_map(|share| (0..16).map(|_| share.admit(Listener::HboneStream).unwrap()))
        .collect();
    group.bench_function("share/busy_node", |b| {
        b.iter(|| drop(black_box(shares[0].admit(Listener::Outbound))));
    });
    drop(held);

    let semaphore = Arc::new(Semaphore::new(65_536));
    group.bench_function("semaphore", |b| {
        b.iter(|| drop(black_box(Arc::clone(&semaphore).try_acquire_owned())));
    });
    group.finish();
}

criterion_group!(benches, capacity);
criterion_main!(benches);
