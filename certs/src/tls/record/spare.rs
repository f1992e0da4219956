//! The buffers record streams are not using, kept per thread for the next
//! stream that needs one.
//!
//! A stream holds its send and receive buffers only while they hold bytes,
//! because the proxy keeps thousands of idle connections. Freeing them
//! would make every busy spell start with a fresh allocation filled with
//! zeros (safe Rust cannot hand aws-lc or a reader uninitialized memory),
//! which is the very per-record cost the record layer exists to avoid. So
//! a buffer given back waits here, its bytes already initialized, and the
//! memory held is bounded per thread rather than per connection.
//!
//! What a spare buffer holds is stale and never read: streams only read
//! back what they sealed or read into it themselves.

use std::cell::RefCell;
use std::thread::LocalKey;

/// Buffers of each kind kept per thread: enough for the streams a worker
/// thread moves bulk data on at once to trade buffers without allocating;
/// at most 4 × 272 KiB of send buffers and 4 × 65 KiB of receive buffers.
const SPARE_BUFFERS: usize = 4;

/// Which buffers: they differ in size, so they are kept apart.
#[derive(Debug, Clone, Copy)]
pub(super) enum Spare {
    /// Queues of sealed records (`send.rs`).
    Send,
    /// Bytes read from the transport (`receive.rs`).
    Receive,
}

thread_local! {
    static SEND: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    static RECEIVE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A spare buffer of `kind`, or an empty one when there is none.
pub(super) fn take(kind: Spare) -> Vec<u8> {
    cache(kind)
        .try_with(|spare| spare.try_borrow_mut().ok()?.pop())
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Keeps `buf` for the next [`take`] on this thread, if there is room.
pub(super) fn give(kind: Spare, buf: Vec<u8>) {
    if buf.is_empty() {
        return;
    }
    // Failing means the thread is exiting or the cache is full: the
    // buffer is freed instead.
    let _ = cache(kind).try_with(|spare| {
        if let Ok(mut spare) = spare.try_borrow_mut()
            && spare.len() < SPARE_BUFFERS
        {
            spare.push(buf);
        }
    });
}

fn cache(kind: Spare) -> &'static LocalKey<RefCell<Vec<Vec<u8>>>> {
    match kind {
        Spare::Send => &SEND,
        Spare::Receive => &RECEIVE,
    }
}
