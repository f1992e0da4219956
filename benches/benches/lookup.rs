#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench set-up: a panic is a failed run
//! The state store at mesh scale: 10,000 workloads behind 1,000 services.
//!
//! `lookup` measures the reads every connection makes: a workload by
//! address (inbound destination, outbound source), by uid (policy
//! re-checks), a service by VIP (outbound), and an address that belongs to
//! nothing (passthrough traffic). Successive iterations walk through
//! different keys, so that one hot hash bucket does not flatter the result.
//!
//! `update` measures the delta-xDS path of one workload against the full
//! store: replacing an existing one (the common update: a pod changed),
//! adding a new one and removing it again (pod churn), and the same
//! replacement starting from the `istio.workload.Address` message, so that
//! the conversion is counted too. Each leaves the store as it found it.
//! Decoding the protobuf bytes is left out: that is prost's cost.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use ztunnel_proto::istio::workload as proto;
use ztunnel_proxy::state::{AddressResource, State};

#[path = "common/mesh.rs"]
mod mesh;

use mesh::{SERVICES, WORKLOADS, service_vip, typed_workload, workload, workload_ip};

fn store() -> State {
    mesh::store_of(WORKLOADS)
}

/// Key `iteration` of `count`, stepping by a prime so that successive
/// lookups use unrelated keys rather than neighbours.
fn key(iteration: &mut u32, count: u32) -> u32 {
    *iteration = iteration.wrapping_add(1);
    iteration.wrapping_mul(7_919) % count
}

fn lookup(c: &mut Criterion) {
    let state = store();
    let uids: Vec<String> = (0..WORKLOADS).map(|index| workload(index).uid).collect();
    let mut group = c.benchmark_group("lookup");

    let mut iteration = 0;
    group.bench_function("workload_by_address", |b| {
        b.iter(|| {
            let ip = IpAddr::V4(workload_ip(key(&mut iteration, WORKLOADS)));
            state
                .workload_by_address(black_box(""), black_box(ip))
                .unwrap();
        })
    });
    group.bench_function("workload_by_uid", |b| {
        b.iter(|| {
            let uid = &uids[key(&mut iteration, WORKLOADS) as usize];
            state.workload(black_box(uid)).unwrap();
        })
    });
    group.bench_function("service_by_vip", |b| {
        b.iter(|| {
            let vip = IpAddr::V4(service_vip(key(&mut iteration, SERVICES)));
            state.service_by_vip(black_box(""), black_box(vip)).unwrap();
        })
    });
    // 10.2.0.0/16 holds no workload: the answer for traffic leaving the mesh.
    let outside = u32::from_be_bytes([10, 2, 0, 0]);
    group.bench_function("workload_by_address_miss", |b| {
        b.iter(|| {
            let ip = IpAddr::V4(Ipv4Addr::from(outside + key(&mut iteration, WORKLOADS)));
            assert!(
                state
                    .workload_by_address(black_box(""), black_box(ip))
                    .is_none()
            );
        })
    });
    group.finish();
}

fn update(c: &mut Criterion) {
    let mut state = store();
    let mut group = c.benchmark_group("update");
    // The middle of the store: nothing special about it, and fixed.
    let existing = typed_workload(WORKLOADS / 2);
    let new = typed_workload(WORKLOADS);
    let message = proto::Address {
        r#type: Some(proto::address::Type::Workload(workload(WORKLOADS / 2))),
    };

    // Cloning the input is set-up, and the replaced value is dropped
    // outside the timing, so each measures the store's work alone.
    group.bench_function("replace_workload", |b| {
        b.iter_batched(
            || existing.clone(),
            |workload| state.insert_workload(workload).unwrap(),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("insert_remove_workload", |b| {
        b.iter_batched(
            || new.clone(),
            |workload| {
                let uid = workload.uid.clone();
                assert!(state.insert_workload(workload).is_none());
                state.remove_workload(&uid).unwrap()
            },
            BatchSize::SmallInput,
        )
    });
    group.bench_function("convert_and_replace_workload", |b| {
        b.iter(|| {
            let resource = AddressResource::try_from(black_box(&message)).unwrap();
            state.insert_address(resource);
        })
    });
    group.finish();
    assert_eq!(state.workloads().count(), WORKLOADS as usize);
}

criterion_group! {
    name = benches;
    // Each operation takes well under a microsecond: 100 samples over 2 s
    // give a stable median and keep the seven cases near half a minute.
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    targets = lookup, update
}
criterion_main!(benches);
