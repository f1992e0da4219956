//! Keeping the heap's resident memory close to what it holds: no
//! transparent huge pages, and giving memory back to the system after a
//! burst of short-lived allocations: loading the state from a large local file or a large xDS
//! response parses far more than it keeps, and mimalloc (the binary's
//! allocator, `main.rs`) holds the freed pages for reuse until the same
//! thread allocates again, which a control-plane thread may not do for a
//! long time. Measured with 10,000 workloads in the local file: 59 MB of
//! resident memory before this, 43 MB after (benches/README.md).
//!
//! Heap profiles: the binary's allocator is sampled (`memory/sampler.rs`),
//! and the live samples are written in pprof's format
//! (`memory/heap_profile.rs`).

pub mod heap_profile;
pub mod sampler;

/// The live heap as sampled so far, in pprof's protobuf format
/// (uncompressed); `None` when sampling is off and nothing was sampled.
/// Symbolizes every sampled stack: call it on a blocking thread.
pub fn heap_profile() -> Option<Vec<u8>> {
    use pprof::protos::Message;

    let samples = sampler::live_samples();
    let sample_bytes = sampler::sample_bytes();
    if sample_bytes == 0 && samples.is_empty() {
        return None;
    }
    let profile = heap_profile::build(&samples, sample_bytes, heap_profile::symbolize);
    Some(profile.encode_to_vec())
}

/// Returns to the system what the calling thread's heap has freed. Costs a
/// walk of that heap (milliseconds): call it after a large state change,
/// never on the data path. Harmless under another allocator (tests), where
/// mimalloc's heap is empty.
pub fn give_back() {
    // SAFETY: `mi_collect` takes no pointers and may be called from any
    // thread at any time; it only frees what the allocator already owns.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// When [`give_back_soon`] collects after the first time: what the end of
/// a flood frees does not all come back at once (the last connections'
/// tasks finish after the count that marks the end, and their access-log
/// lines are freed once the log writer has written them), and memory freed
/// after a collection stays with the allocator.
const GIVE_BACK_AGAIN: [std::time::Duration; 2] = [
    std::time::Duration::from_millis(250),
    std::time::Duration::from_secs(1),
];

/// [`give_back`] now and twice more shortly after, on the runtime of the
/// caller (on this thread's heap when there is none): for the end of a
/// burst, whose last frees trail it.
pub fn give_back_soon() {
    give_back();
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async {
        for delay in GIVE_BACK_AGAIN {
            tokio::time::sleep(delay).await;
            give_back();
        }
    });
}

/// Keeps the process off transparent huge pages. A huge page is resident
/// whole (2 MiB) once any byte of it is touched, and a heap of small
/// objects that come and go (the state's workloads, connections) touches
/// most of them: with huge pages, a proxy knowing 10,000 workloads was
/// resident at about 34 MB, 19.7 MB with none; without, 23.4 and 12.9 MB
/// (benches/README.md). mimalloc is built not to ask for them (its
/// `no_thp` feature); this also covers a kernel that gives them unasked
/// (`transparent_hugepage/enabled` set to `always`). Call it first in
/// `main`: it applies to pages touched from then on.
pub fn no_huge_pages() {
    // A kernel without the flag (before 3.15) keeps its own setting, which
    // costs memory, not correctness.
    let _ = nix::sys::prctl::set_thp_disable(true);
}
