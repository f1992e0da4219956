//! The sampler's table and distances, driven directly, and the wrapper
//! around the system allocator with every allocation sampled. The table is
//! process-wide: the tests take turns.

use std::alloc::System;
use std::sync::Mutex;

use super::*;

/// The table is one per process: one test at a time uses it.
static TABLE_IN_USE: Mutex<()> = Mutex::new(());

/// Addresses whose home slot is the same as `first`'s, 16 bytes apart.
fn colliding(first: usize, count: usize) -> Vec<usize> {
    (0..)
        .map(|step| first + step * 16)
        .filter(|address| home(*address) == home(first))
        .take(count)
        .collect()
}

fn sizes_of(samples: &[Sample]) -> Vec<usize> {
    let mut sizes: Vec<usize> = samples.iter().map(|sample| sample.size).collect();
    sizes.sort_unstable();
    sizes
}

#[test]
fn a_sample_is_kept_until_its_address_is_freed_and_a_full_neighbourhood_drops_it() {
    let _turn = TABLE_IN_USE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let before = live_samples().len();
    let addresses = colliding(0x7f00_0000_1000, PROBES + 1);
    for (index, address) in addresses.iter().take(PROBES).enumerate() {
        insert(*address, 1000 + index, &[0xaa, 0xbb]);
    }
    let live = live_samples();
    assert_eq!(live.len(), before + PROBES);
    assert!(live.contains(&Sample {
        size: 1000,
        frames: vec![0xaa, 0xbb]
    }));
    let dropped_before = dropped();
    insert(addresses[PROBES], 5, &[0xcc]);
    assert_eq!(dropped(), dropped_before + 1, "no room within the probes");

    // Freeing the first leaves a hole the others are still found past.
    freed(addresses[0] as *mut u8);
    freed(0x1234_5670 as *mut u8);
    assert_eq!(live_samples().len(), before + PROBES - 1);
    freed(addresses[PROBES - 1] as *mut u8);
    let sizes = sizes_of(&live_samples());
    assert!(!sizes.contains(&1000) && !sizes.contains(&(1000 + PROBES - 1)));
    assert!(sizes.contains(&1001));
    // The hole is reused.
    insert(addresses[PROBES], 5, &[0xcc]);
    assert!(sizes_of(&live_samples()).contains(&5));
    for address in &addresses {
        freed(*address as *mut u8);
    }
    assert_eq!(live_samples().len(), before);
}

#[test]
fn distances_between_samples_average_the_rate() {
    let _turn = TABLE_IN_USE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let previous = sample_bytes();
    set_sample_bytes(512 * 1024);
    let draws = 100_000;
    let total: f64 = (0..draws).map(|_| next_distance() as f64).sum();
    let mean = total / f64::from(draws);
    set_sample_bytes(previous);
    let expected = 512.0 * 1024.0;
    assert!(
        (mean - expected).abs() < expected * 0.02,
        "mean distance {mean}, expected {expected}"
    );
}

#[test]
fn the_wrapped_allocator_records_the_caller_stack_and_forgets_it_on_free() {
    let _turn = TABLE_IN_USE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let previous = sample_bytes();
    // Every allocation of a byte or more is all but certain to be sampled.
    set_sample_bytes(1);
    let allocator = Sampling(System);
    let layout = Layout::from_size_align(4321, 16).unwrap();
    // SAFETY: a non-zero layout; freed below with the same layout.
    let pointer = unsafe { allocator.alloc(layout) };
    assert!(!pointer.is_null());
    // SAFETY: `pointer` is this allocator's, of `layout`; grown in place or moved.
    let grown = unsafe { allocator.realloc(pointer, layout, 8642) };
    set_sample_bytes(previous);
    let live = live_samples();
    let sample = live
        .iter()
        .find(|sample| sample.size == 8642)
        .expect("the grown block is sampled");
    assert!(
        sample.frames.len() > 3,
        "a stack of the caller: {:?}",
        sample.frames
    );
    assert!(
        !live.iter().any(|sample| sample.size == 4321),
        "the block before the move is forgotten"
    );
    // SAFETY: `grown` is this allocator's, of 8642 bytes at that alignment.
    unsafe { allocator.dealloc(grown, Layout::from_size_align(8642, 16).unwrap()) };
    assert!(!live_samples().iter().any(|sample| sample.size == 8642));
}
