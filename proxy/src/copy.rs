//! Bidirectional byte copy between two connections (an h2 stream and a TCP
//! socket, or two sockets), with buffers that grow with the traffic, half-close
//! propagated each way, and byte counts for each direction.
//!
//! Who the two sides are is the caller's business; this module only moves
//! bytes. Each direction holds what it read as [`Bytes`] until the other
//! side has taken it: bytes read from a socket are copied once, into the
//! direction's [`ReadBuffer`], and an h2 stream sends that memory as it is
//! and hands over its received frames the same way (`copy/side.rs` for the
//! two kinds of side, `hbone/stream.rs` for the HBONE one).

use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;

mod side;

pub use side::{ReadBuffer, Side};

/// The buffer a direction starts with. Most mesh connections are small
/// request/response exchanges or idle keep-alives.
const INITIAL_BUFFER: usize = 1024;

/// The most a direction's buffer grows to. 256 KiB is a quarter of the h2
/// frame size and enough per read to keep a 10 Gbit/s stream busy without
/// per-read syscall cost dominating; larger buffers only add memory.
const MAX_BUFFER: usize = 256 * 1024;

/// Buffers up to this size are given back whenever their direction has
/// nothing to read, and taken again on the next readable event: an idle
/// connection then holds no copy buffer at all, and taking one this small
/// costs far less than the read that follows. Larger buffers belong to
/// bulk traffic and are kept.
const RELEASE_UP_TO: usize = 16 * 1024;

/// Bytes moved by a finished copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Transferred {
    /// Bytes read from `a` and written to `b`.
    pub a_to_b: u64,
    /// Bytes read from `b` and written to `a`.
    pub b_to_a: u64,
}

impl Transferred {
    /// These counts added to `before`'s, for a connection carried in two
    /// stretches.
    pub fn after(self, before: Transferred) -> Transferred {
        Transferred {
            a_to_b: before.a_to_b + self.a_to_b,
            b_to_a: before.b_to_a + self.b_to_a,
        }
    }
}

/// Which way the failing bytes were going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// From `a` to `b`.
    AToB,
    /// From `b` to `a`.
    BToA,
}

/// Why a copy stopped before both sides closed; carries the bytes moved so
/// far, so that access logs and metrics count them anyway.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// Reading from the source side failed with something other than a reset.
    #[error("reading ({direction:?}) failed after {transferred:?}")]
    Read {
        /// The direction whose source failed.
        direction: Way,
        /// Bytes moved before the failure.
        transferred: Transferred,
        /// The underlying error.
        source: io::Error,
    },
    /// Writing to the destination side failed: the bytes read could not be delivered.
    #[error("writing ({direction:?}) failed after {transferred:?}")]
    Write {
        /// The direction whose destination failed.
        direction: Way,
        /// Bytes moved before the failure.
        transferred: Transferred,
        /// The underlying error.
        source: io::Error,
    },
    /// The proxy stopped the copy: its drain was forced, or the workload
    /// it served was removed.
    #[error("stopped by the proxy after {transferred:?}")]
    Stopped {
        /// Bytes moved before the stop.
        transferred: Transferred,
    },
}

impl CopyError {
    /// This error with its counts added to `before`'s (see
    /// [`Transferred::after`]).
    pub fn after(mut self, before: Transferred) -> CopyError {
        let (CopyError::Read { transferred, .. }
        | CopyError::Write { transferred, .. }
        | CopyError::Stopped { transferred }) = &mut self;
        *transferred = transferred.after(before);
        self
    }

    /// The bytes moved before the copy stopped.
    pub fn transferred(&self) -> Transferred {
        match self {
            CopyError::Read { transferred, .. }
            | CopyError::Write { transferred, .. }
            | CopyError::Stopped { transferred } => *transferred,
        }
    }
}

/// Copies `a` to `b` and `b` to `a` at once until both directions reached
/// EOF. An EOF on one side shuts down the write half of the other side, and
/// the other direction keeps going. A reset while reading counts as EOF,
/// like a clean close (WIRE.md §4).
pub fn copy_bidirectional<'a, A, B>(
    a: &'a mut A,
    b: &'a mut B,
) -> impl Future<Output = Result<Transferred, CopyError>> + 'a
where
    A: Side + ?Sized,
    B: Side + ?Sized,
{
    // The future itself, not an async fn awaiting it (see below).
    copy_bidirectional_until(a, b, std::future::pending())
}

/// [`copy_bidirectional`] that gives up with [`CopyError::Stopped`] as soon
/// as `stop` resolves; the caller then drops both sides, which closes them.
pub async fn copy_bidirectional_until<A, B, S>(
    a: &mut A,
    b: &mut B,
    stop: S,
) -> Result<Transferred, CopyError>
where
    A: Side + ?Sized,
    B: Side + ?Sized,
    S: Future<Output = ()>,
{
    // Each of these functions polls the copy itself rather than awaiting
    // another async fn: a wrapping async fn keeps its arguments (the stop
    // future among them) beside the inner future's copy of them, in every
    // open connection's task.
    let mut copy = Copy::new();
    let mut stop = std::pin::pin!(stop);
    poll_fn(|cx| {
        copy.poll(cx, stop.as_mut(), a, b, None)
            .map_ok(Ended::moved)
    })
    .await
}

/// How [`copy_bidirectional_until_quiet`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Both sides closed.
    Closed(Transferred),
    /// Each direction had read its share of times and both were waiting
    /// for their source with nothing read and not yet written: the caller
    /// may carry on with the two sides by other means.
    Quiet(Transferred),
}

impl Ended {
    /// The bytes moved, however it ended.
    pub fn moved(self) -> Transferred {
        match self {
            Ended::Closed(moved) | Ended::Quiet(moved) => moved,
        }
    }
}

/// [`copy_bidirectional_until`] that, given `quiet`, also returns with
/// [`Ended::Quiet`] at the first moment each direction has read at least
/// `quiet` times and both wait for their source with nothing pending.
pub async fn copy_bidirectional_until_quiet<A, B, S>(
    a: &mut A,
    b: &mut B,
    stop: S,
    quiet: Option<u8>,
) -> Result<Ended, CopyError>
where
    A: Side + ?Sized,
    B: Side + ?Sized,
    S: Future<Output = ()>,
{
    let mut copy = Copy::new();
    let mut stop = std::pin::pin!(stop);
    poll_fn(|cx| copy.poll(cx, stop.as_mut(), a, b, quiet)).await
}

/// Both directions of a copy.
struct Copy {
    a_to_b: OneWay,
    b_to_a: OneWay,
}

impl Copy {
    fn new() -> Copy {
        Copy {
            a_to_b: OneWay::new(),
            b_to_a: OneWay::new(),
        }
    }

    fn transferred(&self) -> Transferred {
        Transferred {
            a_to_b: self.a_to_b.moved,
            b_to_a: self.b_to_a.moved,
        }
    }

    /// Moves what can be moved now. `quiet`: the reads each direction must
    /// make before the copy may end quiet; `None`, it never does.
    fn poll<A, B, S>(
        &mut self,
        cx: &mut Context<'_>,
        stop: Pin<&mut S>,
        a: &mut A,
        b: &mut B,
        quiet: Option<u8>,
    ) -> Poll<Result<Ended, CopyError>>
    where
        A: Side + ?Sized,
        B: Side + ?Sized,
        S: Future<Output = ()>,
    {
        if stop.poll(cx).is_ready() {
            return Poll::Ready(Err(CopyError::Stopped {
                transferred: self.transferred(),
            }));
        }
        let forward = self.a_to_b.poll(cx, &mut *a, &mut *b);
        let backward = self.b_to_a.poll(cx, &mut *b, &mut *a);
        let transferred = self.transferred();
        let fail = |direction, failure| match failure {
            Failure::Read(source) => CopyError::Read {
                direction,
                transferred,
                source,
            },
            Failure::Write(source) => CopyError::Write {
                direction,
                transferred,
                source,
            },
        };
        let waits = |reads| self.a_to_b.waits_after(reads) && self.b_to_a.waits_after(reads);
        match (forward, backward) {
            (Poll::Ready(Err(failure)), _) => Poll::Ready(Err(fail(Way::AToB, failure))),
            (_, Poll::Ready(Err(failure))) => Poll::Ready(Err(fail(Way::BToA, failure))),
            (Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => {
                Poll::Ready(Ok(Ended::Closed(transferred)))
            }
            (Poll::Pending, Poll::Pending) if quiet.is_some_and(waits) => {
                Poll::Ready(Ok(Ended::Quiet(transferred)))
            }
            _ => Poll::Pending,
        }
    }
}

/// What went wrong in one direction.
enum Failure {
    Read(io::Error),
    Write(io::Error),
}

/// Where one direction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading and writing.
    Copying,
    /// The source reached EOF and everything read was written; shutting down
    /// the destination's write half.
    ShuttingDown,
    /// The destination's write half is shut down.
    Done,
}

/// One direction of the copy: what it read and has not yet written.
struct OneWay {
    /// Where a socket source reads to; untouched when the source hands out
    /// chunks of its own (an h2 stream).
    buffer: ReadBuffer,
    /// Read and not yet written. Empty holds no memory, so that the buffer
    /// can reuse all of its allocation once the destination let go of it.
    pending: Bytes,
    moved: u64,
    /// Reads that returned bytes, up to `u8::MAX`: only a few are ever
    /// asked for, and a byte fits beside `phase` in the padding.
    reads: u8,
    phase: Phase,
}

impl OneWay {
    fn new() -> OneWay {
        OneWay {
            buffer: ReadBuffer::new(),
            pending: Bytes::new(),
            moved: 0,
            reads: 0,
            phase: Phase::Copying,
        }
    }

    /// Whether this direction read at least `reads` times and now waits
    /// for its source with everything it read written.
    fn waits_after(&self, reads: u8) -> bool {
        self.phase == Phase::Copying && self.pending.is_empty() && self.reads >= reads
    }

    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        reader: &mut R,
        writer: &mut W,
    ) -> Poll<Result<(), Failure>>
    where
        R: Side + ?Sized,
        W: Side + ?Sized,
    {
        loop {
            match self.phase {
                Phase::Done => return Poll::Ready(Ok(())),
                Phase::ShuttingDown => {
                    ready!(Pin::new(&mut *writer).poll_shutdown(cx)).map_err(Failure::Write)?;
                    self.phase = Phase::Done;
                }
                Phase::Copying if !self.pending.is_empty() => {
                    let written = ready!(writer.poll_write_bytes(cx, &mut self.pending))
                        .map_err(Failure::Write)?;
                    self.moved += written as u64;
                    if self.pending.is_empty() {
                        self.pending = Bytes::new();
                    }
                }
                Phase::Copying => match reader.poll_read_bytes(cx, &mut self.buffer) {
                    Poll::Ready(Ok(bytes)) if bytes.is_empty() => self.phase = Phase::ShuttingDown,
                    Poll::Ready(Ok(bytes)) => {
                        self.pending = bytes;
                        self.reads = self.reads.saturating_add(1);
                    }
                    Poll::Ready(Err(error)) if is_reset(&error) => {
                        self.phase = Phase::ShuttingDown;
                    }
                    Poll::Ready(Err(error)) => return Poll::Ready(Err(Failure::Read(error))),
                    Poll::Pending => {
                        // Nothing to read: push out what the writer buffered.
                        ready!(Pin::new(&mut *writer).poll_flush(cx)).map_err(Failure::Write)?;
                        return Poll::Pending;
                    }
                },
            }
        }
    }
}

/// A reset from the peer ends a direction like EOF does: the peer is gone
/// either way, and WIRE.md §4 counts both as a normal close.
fn is_reset(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
    )
}

#[cfg(test)]
mod tests;
