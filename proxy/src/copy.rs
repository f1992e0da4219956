//! Bidirectional byte copy between two connections (an h2 stream and a TCP
//! socket, or two sockets), with buffers that grow with the traffic, half-close
//! propagated each way, and byte counts for each direction.
//!
//! Who the two sides are is the caller's business; this module only moves
//! bytes. The HBONE stream adapter lives in `hbone/stream.rs`.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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
pub async fn copy_bidirectional<A, B>(a: &mut A, b: &mut B) -> Result<Transferred, CopyError>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
{
    copy_bidirectional_until(a, b, std::future::pending()).await
}

/// [`copy_bidirectional`] that gives up with [`CopyError::Stopped`] as soon
/// as `stop` resolves; the caller then drops both sides, which closes them.
pub async fn copy_bidirectional_until<A, B, S>(
    a: &mut A,
    b: &mut B,
    stop: S,
) -> Result<Transferred, CopyError>
where
    A: AsyncRead + AsyncWrite + Unpin + ?Sized,
    B: AsyncRead + AsyncWrite + Unpin + ?Sized,
    S: Future<Output = ()>,
{
    let mut a_to_b = OneWay::new();
    let mut b_to_a = OneWay::new();
    let mut stop = std::pin::pin!(stop);
    poll_fn(|cx| {
        if stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(CopyError::Stopped {
                transferred: Transferred {
                    a_to_b: a_to_b.moved,
                    b_to_a: b_to_a.moved,
                },
            }));
        }
        let forward = a_to_b.poll(cx, Pin::new(&mut *a), Pin::new(&mut *b));
        let backward = b_to_a.poll(cx, Pin::new(&mut *b), Pin::new(&mut *a));
        let transferred = Transferred {
            a_to_b: a_to_b.moved,
            b_to_a: b_to_a.moved,
        };
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
        match (forward, backward) {
            (Poll::Ready(Err(failure)), _) => Poll::Ready(Err(fail(Way::AToB, failure))),
            (_, Poll::Ready(Err(failure))) => Poll::Ready(Err(fail(Way::BToA, failure))),
            (Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => Poll::Ready(Ok(transferred)),
            _ => Poll::Pending,
        }
    })
    .await
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

/// One direction of the copy: a buffer that grows when reads fill it.
struct OneWay {
    /// Empty while the direction waits with nothing buffered (see
    /// [`RELEASE_UP_TO`]); otherwise `size` bytes.
    buffer: Vec<u8>,
    /// The buffer's size when it is held.
    size: usize,
    /// Start of the bytes read but not yet written.
    start: usize,
    /// End of the bytes read but not yet written.
    end: usize,
    moved: u64,
    phase: Phase,
    /// Set when a read filled the buffer: traffic is bulk, so the buffer
    /// doubles once its bytes are written.
    grow_after_write: bool,
}

impl OneWay {
    fn new() -> OneWay {
        OneWay {
            buffer: Vec::new(),
            size: INITIAL_BUFFER,
            start: 0,
            end: 0,
            moved: 0,
            phase: Phase::Copying,
            grow_after_write: false,
        }
    }

    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut reader: Pin<&mut R>,
        mut writer: Pin<&mut W>,
    ) -> Poll<Result<(), Failure>>
    where
        R: AsyncRead + ?Sized,
        W: AsyncWrite + ?Sized,
    {
        loop {
            match self.phase {
                Phase::Done => return Poll::Ready(Ok(())),
                Phase::ShuttingDown => {
                    ready!(writer.as_mut().poll_shutdown(cx)).map_err(Failure::Write)?;
                    self.phase = Phase::Done;
                }
                Phase::Copying if self.start < self.end => {
                    let pending = self.buffer.get(self.start..self.end).unwrap_or_default();
                    let written =
                        ready!(writer.as_mut().poll_write(cx, pending)).map_err(Failure::Write)?;
                    if written == 0 {
                        return Poll::Ready(Err(Failure::Write(io::ErrorKind::WriteZero.into())));
                    }
                    self.start += written;
                    self.moved += written as u64;
                }
                Phase::Copying => {
                    self.start = 0;
                    self.end = 0;
                    if self.buffer.is_empty() {
                        self.buffer = vec![0; self.size];
                    }
                    let mut read_buf = ReadBuf::new(&mut self.buffer);
                    match reader.as_mut().poll_read(cx, &mut read_buf) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(error)) if is_reset(&error) => {}
                        Poll::Ready(Err(error)) => return Poll::Ready(Err(Failure::Read(error))),
                        Poll::Pending => {
                            if self.size <= RELEASE_UP_TO {
                                self.buffer = Vec::new();
                            }
                            // Nothing to read: push out what the writer buffered.
                            ready!(writer.as_mut().poll_flush(cx)).map_err(Failure::Write)?;
                            return Poll::Pending;
                        }
                    }
                    let filled = read_buf.filled().len();
                    if filled == 0 {
                        self.phase = Phase::ShuttingDown;
                        continue;
                    }
                    self.end = filled;
                    if filled == self.size && self.size < MAX_BUFFER {
                        self.grow_after_write = true;
                    }
                }
            }
            if self.grow_after_write && self.start == self.end {
                self.grow_after_write = false;
                self.size = (self.size * 2).min(MAX_BUFFER);
                self.buffer.resize(self.size, 0);
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
