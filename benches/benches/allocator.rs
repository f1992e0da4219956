#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench set-up: a panic is a failed run
//! What heap sampling (`proxy/src/memory/sampler.rs`) costs the proxy's
//! allocator on every allocation and free: a 64-byte and a 4 KiB block
//! allocated and freed through mimalloc alone, through the sampling layer
//! turned off, and at the default rate (one sample per 512 KiB), whose
//! recorded stacks are in the figure at their real frequency.

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use mimalloc::MiMalloc;
use ztunnel_proxy::memory::sampler::{self, Sampling};

fn round_trip(allocator: &impl GlobalAlloc, layout: Layout) {
    // SAFETY: a non-zero layout, freed at once with the same layout.
    unsafe {
        let block = allocator.alloc(layout);
        assert!(!block.is_null());
        allocator.dealloc(black_box(block), layout);
    }
}

fn allocator(c: &mut Criterion) {
    let mut group = c.benchmark_group("allocator");
    group.measurement_time(Duration::from_secs(3));
    let sampled = Sampling(MiMalloc);
    for size in [64, 4096] {
        let layout = Layout::from_size_align(size, 8).unwrap();
        group.bench_function(format!("mimalloc/{size}"), |b| {
            b.iter(|| round_trip(&MiMalloc, layout));
        });
        sampler::set_sample_bytes(0);
        group.bench_function(format!("sampling_off/{size}"), |b| {
            b.iter(|| round_trip(&sampled, layout));
        });
        sampler::set_sample_bytes(512 * 1024);
        group.bench_function(format!("sampling_512k/{size}"), |b| {
            b.iter(|| round_trip(&sampled, layout));
        });
        sampler::set_sample_bytes(0);
    }
    group.finish();
}

criterion_group!(benches, allocator);
criterion_main!(benches);
