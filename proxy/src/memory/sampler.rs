//! A sampling layer over the global allocator, for heap profiles: about one
//! allocation per [`sample_bytes`] bytes allocated (Go's runtime scheme: the
//! distance to the next sample is drawn from an exponential distribution,
//! so every byte is as likely as any other to be the sampled one) keeps its
//! address, size and call stack in a fixed table until it is freed. What
//! the table holds at a moment is the live heap, sampled; `heap_profile.rs`
//! turns it into pprof's format.
//!
//! Nothing here allocates: the table is static, the stack is walked into an
//! array, and a thread's allocations made while it records (the unwinder's
//! own) pass through unsampled. The cost on every allocation is a
//! thread-local countdown; on every free, while samples are live, one
//! probe of a 32 KiB array of addresses.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Live samples the table holds at most: about 2 GiB of live heap at the
/// default rate. A sample that finds no room is counted and not kept.
const SLOTS: usize = 4096;
/// Slots an insert or a lookup probes from the address's own.
const PROBES: usize = 8;
/// Frames kept of a sampled allocation's stack, the allocator's included.
pub const MAX_DEPTH: usize = 48;
/// A slot whose sample was freed: lookups go on past it, inserts reuse it.
const FREED: usize = 1;

/// Where each slot's sample is: 0 empty, [`FREED`], else the address. Dense
/// (8 bytes a slot), so that a free's probe stays in cache.
static ADDRESSES: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
/// What each slot's sample is.
static SAMPLES: [Slot; SLOTS] = [const { Slot::empty() }; SLOTS];
/// Samples in the table.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Samples that found no slot.
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// The mean distance between samples, in bytes; 0 samples nothing.
static SAMPLE_BYTES: AtomicU64 = AtomicU64::new(0);
/// Whether the table may be read: a reader copies each slot twice and
/// keeps it only when both copies agree, so a torn read is dropped.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// A thread's countdown before its first allocation: drawn then, so that a
/// thread's first allocation is no likelier to be sampled than any other.
const UNSET: i64 = i64::MIN;

thread_local! {
    /// Bytes this thread may still allocate before its next sample.
    static COUNTDOWN: Cell<i64> = const { Cell::new(UNSET) };
    /// Set while this thread records a sample: what it allocates meanwhile
    /// passes through.
    static RECORDING: Cell<bool> = const { Cell::new(false) };
    /// This thread's xorshift state; 0 until first seeded.
    static RANDOM: Cell<u64> = const { Cell::new(0) };
}

/// One sample's facts, written by the thread that sampled it.
struct Slot {
    /// The address it is kept for; equal to `ADDRESSES`'s entry once
    /// complete, so a reader can tell a finished slot from one being
    /// written or reused.
    address: AtomicUsize,
    size: AtomicUsize,
    depth: AtomicUsize,
    frames: [AtomicUsize; MAX_DEPTH],
}

impl Slot {
    const fn empty() -> Slot {
        Slot {
            address: AtomicUsize::new(0),
            size: AtomicUsize::new(0),
            depth: AtomicUsize::new(0),
            frames: [const { AtomicUsize::new(0) }; MAX_DEPTH],
        }
    }
}

/// A live sampled allocation, as read from the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Its size in bytes.
    pub size: usize,
    /// Return addresses, innermost first (the allocator's frames first).
    pub frames: Vec<usize>,
}

/// The global allocator `A`, sampled.
pub struct Sampling<A>(pub A);

// SAFETY: every call is forwarded to `A` with the same arguments, and its
// result returned unchanged; the bookkeeping around it never touches the
// memory handed out.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Sampling<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let pointer = unsafe { self.0.alloc(layout) };
        allocated(pointer, layout.size());
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let pointer = unsafe { self.0.alloc_zeroed(layout) };
        allocated(pointer, layout.size());
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // Out of the table before the address can be handed out again.
        freed(pointer);
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.dealloc(pointer, layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let moved = unsafe { self.0.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            // The old block is already free here: another thread may have
            // been given (and sampled) its address meanwhile, and loses
            // that sample. Rare, and a profile is an estimate.
            freed(pointer);
            allocated(moved, new_size);
        }
        moved
    }
}

/// Samples about one allocation per `bytes` allocated from now on; 0 stops
/// sampling (live samples stay until freed).
pub fn set_sample_bytes(bytes: u64) {
    SAMPLE_BYTES.store(bytes, Ordering::Relaxed);
    ENABLED.store(bytes > 0, Ordering::Relaxed);
}

/// The mean distance between samples now, in bytes; 0 when off.
pub fn sample_bytes() -> u64 {
    SAMPLE_BYTES.load(Ordering::Relaxed)
}

/// Samples that found no room in the table since start.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

#[inline]
fn allocated(pointer: *mut u8, size: usize) {
    if pointer.is_null() || !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let size_signed = i64::try_from(size).unwrap_or(i64::MAX);
    let due = COUNTDOWN
        .try_with(|countdown| {
            let mut left = countdown.get();
            if left == UNSET {
                left = next_distance();
            }
            let left = left.saturating_sub(size_signed);
            countdown.set(left);
            left < 0
        })
        .unwrap_or(false);
    if due {
        record(pointer as usize, size);
    }
}

#[inline]
fn freed(pointer: *mut u8) {
    if LIVE.load(Ordering::Relaxed) == 0 {
        return;
    }
    let address = pointer as usize;
    let start = home(address);
    for probe in 0..PROBES {
        let index = (start + probe) % SLOTS;
        match ADDRESSES[index].load(Ordering::Acquire) {
            0 => return,
            found if found == address => {
                SAMPLES[index].address.store(0, Ordering::Release);
                ADDRESSES[index].store(FREED, Ordering::Release);
                LIVE.fetch_sub(1, Ordering::Relaxed);
                return;
            }
            _ => {}
        }
    }
}

/// The slot an address is looked for from: a multiplicative hash of its
/// bits above the 16-byte alignment every block has.
fn home(address: usize) -> usize {
    let mixed = ((address >> 4) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // The top bits of the product are its best mixed; SLOTS is a power of two.
    (mixed >> (64 - SLOTS.trailing_zeros())) as usize
}

#[cold]
fn record(address: usize, size: usize) {
    let entered = RECORDING
        .try_with(|recording| !recording.replace(true))
        .unwrap_or(false);
    if !entered {
        // An allocation of the unwinder's while this thread records.
        return;
    }
    let _ = COUNTDOWN.try_with(|countdown| countdown.set(next_distance()));
    let mut frames = [0usize; MAX_DEPTH];
    let mut depth = 0;
    // SAFETY: the walk reads this thread's own stack; it is not
    // synchronized with other threads' walks, which on Linux (libgcc's
    // unwinder, which locks what it shares) is safe. The closure stores
    // into a local array and never allocates.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            let address = frame.ip() as usize;
            // The outermost frames (past `clone`) have none.
            if address == 0 {
                return false;
            }
            frames[depth] = address;
            depth += 1;
            depth < MAX_DEPTH
        });
    }
    insert(address, size, &frames[..depth]);
    let _ = RECORDING.try_with(|recording| recording.set(false));
}

fn insert(address: usize, size: usize, frames: &[usize]) {
    let start = home(address);
    for probe in 0..PROBES {
        let index = (start + probe) % SLOTS;
        let current = ADDRESSES[index].load(Ordering::Acquire);
        if current > FREED {
            continue;
        }
        if ADDRESSES[index]
            .compare_exchange(current, address, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            continue;
        }
        let slot = &SAMPLES[index];
        slot.size.store(size, Ordering::Relaxed);
        slot.depth.store(frames.len(), Ordering::Relaxed);
        for (kept, frame) in slot.frames.iter().zip(frames) {
            kept.store(*frame, Ordering::Relaxed);
        }
        slot.address.store(address, Ordering::Release);
        LIVE.fetch_add(1, Ordering::Relaxed);
        return;
    }
    DROPPED.fetch_add(1, Ordering::Relaxed);
}

/// Bytes to the next sample: exponential with mean [`sample_bytes`].
fn next_distance() -> i64 {
    let mean = SAMPLE_BYTES.load(Ordering::Relaxed) as f64;
    let random = RANDOM
        .try_with(|state| {
            let mut x = state.get();
            if x == 0 {
                // Seeded from where this thread's stack is: distinct per
                // thread, and never zero.
                x = (&raw const *state as u64) | 1;
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            state.set(x);
            x
        })
        .unwrap_or(1);
    // A uniform in (0, 1]: the top 53 bits, never 0.
    let uniform = ((random >> 11) + 1) as f64 / (1u64 << 53) as f64;
    (-uniform.ln() * mean) as i64
}

/// The live samples, each read whole (a slot being written or freed as it
/// is read is left out). Allocates: call it from a thread that is not
/// recording, never from the allocator.
pub fn live_samples() -> Vec<Sample> {
    let mut samples = Vec::with_capacity(LIVE.load(Ordering::Relaxed));
    for (index, slot) in SAMPLES.iter().enumerate() {
        let address = slot.address.load(Ordering::Acquire);
        if address == 0 {
            continue;
        }
        let size = slot.size.load(Ordering::Relaxed);
        let depth = slot.depth.load(Ordering::Relaxed).min(MAX_DEPTH);
        let frames: Vec<usize> = slot.frames[..depth]
            .iter()
            .map(|frame| frame.load(Ordering::Relaxed))
            .collect();
        // Still the same sample once read: neither freed nor reused.
        if slot.address.load(Ordering::Acquire) == address
            && ADDRESSES[index].load(Ordering::Acquire) == address
        {
            samples.push(Sample { size, frames });
        }
    }
    samples
}

#[cfg(test)]
mod tests;
