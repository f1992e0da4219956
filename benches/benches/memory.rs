#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench set-up: a panic is a failed run
//! Heap bytes per known workload: what the state store holds for each
//! workload of the mesh (the typed workload, its strings, its identity and
//! every index entry), counted by a global allocator that adds up the bytes
//! requested and subtracts the bytes freed.
//!
//! The store is filled with `WORKLOADS` workloads behind `SERVICES`
//! services (`common/mesh.rs`) and compared with the same store holding
//! the services only; the difference over `WORKLOADS` is the figure. It is
//! the requested size: the allocator's size classes and page overhead come
//! on top, which the harness's resident-memory figure (`--mesh-size`)
//! includes.
//!
//! The same figure for the path the harness's `--mesh-size` takes: a local
//! config file of workloads on other nodes, parsed and loaded as ztunnel
//! does at start-up, with the peak the load reached (what the parse
//! allocates and frees on the way, which the allocator may keep).
//!
//! `cargo bench -p ztunnel-benches --bench memory` prints two lines.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

#[path = "common/mesh.rs"]
mod mesh;

/// The system allocator, counting live bytes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

/// The highest `LIVE` since it was last reset.
static PEAK: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counter is only arithmetic on the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        PEAK.fetch_max(live + layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let grown = new_size as isize - layout.size() as isize;
        let live = LIVE.fetch_add(grown, Ordering::Relaxed);
        PEAK.fetch_max(live + grown, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Live heap bytes held by what `build` returns.
fn held_by<T>(build: impl FnOnce() -> T) -> (T, isize) {
    let before = LIVE.load(Ordering::Relaxed);
    let value = build();
    (value, LIVE.load(Ordering::Relaxed) - before)
}

/// The live heap after loading a local file with `count` workloads on other
/// nodes, as the harness's `--mesh-size` writes it, and what the load
/// allocated at its peak.
fn local_file_load(count: usize) -> (isize, isize) {
    use ztunnel_test_support::cluster::{ConfigSource, MeshFile};
    let dir = tempfile::tempdir().unwrap();
    let mut file = MeshFile::new(
        dir.path().join("mesh.yaml"),
        ConfigSource::LocalFile,
        &[],
        &[],
    )
    .unwrap();
    file.set_remote_workloads(count).unwrap();
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let (state, version) = ztunnel_proxy::discovery::load_local_file(file.path()).unwrap();
    let held = LIVE.load(Ordering::Relaxed) - before;
    let peak = PEAK.load(Ordering::Relaxed) - before;
    drop((state, version));
    (held, peak)
}

fn main() {
    let (empty, _) = local_file_load(0);
    let (full, peak) = local_file_load(mesh::WORKLOADS as usize);
    println!(
        "local file: {} workloads on other nodes (the harness's --mesh-size): {:.0} bytes of heap per workload kept, {:.0} allocated at the load's peak",
        mesh::WORKLOADS,
        (full - empty) as f64 / f64::from(mesh::WORKLOADS),
        peak as f64 / f64::from(mesh::WORKLOADS),
    );
    let (services_only, base) = held_by(|| mesh::store_of(0));
    let (full, with_workloads) = held_by(|| mesh::store_of(mesh::WORKLOADS));
    let per_workload = (with_workloads - base) as f64 / f64::from(mesh::WORKLOADS);
    println!(
        "state: {} workloads behind {} services: {:.0} bytes of heap per workload ({} KiB in all, {} KiB for the services alone)",
        mesh::WORKLOADS,
        mesh::SERVICES,
        per_workload,
        with_workloads / 1024,
        base / 1024,
    );
    drop((services_only, full));
}
