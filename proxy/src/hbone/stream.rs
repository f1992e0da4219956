//! One HBONE tunnel as a byte stream: an h2 CONNECT stream's send and receive
//! halves as a copy [`Side`] that hands out received frames and sends the
//! copy's bytes without copying them, and behind tokio's `AsyncRead` +
//! `AsyncWrite` for any other reader or writer.
//!
//! Flow control: received data is released to the peer as soon as it is
//! handed to the reader (at most one DATA frame is held by the reader), and
//! writes wait for send capacity, so neither side buffers beyond the h2
//! windows.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use h2::{Reason, RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use ztunnel_certs::tls::revocation::Revocation;

use crate::copy::{ReadBuffer, Side};

/// A tunnel over one h2 stream. Dropping it without shutting down resets the
/// stream (RST_STREAM CANCEL).
pub struct H2Stream {
    send: SendStream<Bytes>,
    recv: RecvStream,
    /// The rest of the last DATA frame, not yet read.
    unread: Bytes,
    /// Upper bound for one write: the frame size, so that one write never
    /// asks for more capacity than one frame carries.
    max_write: usize,
    /// Whether END_STREAM was sent; a second shutdown is a no-op.
    write_closed: bool,
    /// Counts this stream on its connection while it lives, for the pool.
    _active: Option<ActiveStream>,
    /// Fires when the client connection this stream runs on is closed for
    /// its server's revocation; `None` where nothing is watched.
    revocation: Option<Revocation>,
}

/// Marks one stream as open on its connection; dropping it releases the slot.
#[derive(Debug)]
pub struct ActiveStream {
    count: Arc<AtomicUsize>,
}

impl ActiveStream {
    /// Takes a slot on `count`.
    pub(crate) fn new(count: Arc<AtomicUsize>) -> ActiveStream {
        count.fetch_add(1, Ordering::AcqRel);
        ActiveStream { count }
    }
}

impl Drop for ActiveStream {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

impl H2Stream {
    /// Wraps the two halves of a stream whose CONNECT was answered with 200.
    pub(crate) fn new(
        send: SendStream<Bytes>,
        recv: RecvStream,
        max_write: usize,
        active: Option<ActiveStream>,
    ) -> H2Stream {
        H2Stream {
            send,
            recv,
            unread: Bytes::new(),
            max_write: max_write.max(1),
            write_closed: false,
            _active: active,
            revocation: None,
        }
    }

    /// Marks the stream as running on a connection watched for its peer's
    /// revocation.
    pub(crate) fn with_revocation(mut self, revocation: Option<Revocation>) -> H2Stream {
        self.revocation = revocation;
        self
    }

    /// What fires when the connection this stream runs on is closed for its
    /// peer's revocation: the copy stops on it, and reports it.
    pub fn revocation(&self) -> Option<&Revocation> {
        self.revocation.as_ref()
    }

    /// Resets the stream with `reason`, e.g. CANCEL when a policy change
    /// revokes the connection.
    pub fn reset(&mut self, reason: Reason) {
        self.send.send_reset(reason);
    }

    /// The next received bytes, their window handed back to the peer; empty
    /// at the end of the stream or after a graceful reset.
    fn poll_received(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
        if !self.unread.is_empty() {
            return Poll::Ready(Ok(std::mem::take(&mut self.unread)));
        }
        // Bounded: each turn takes one frame off the stream's queue.
        loop {
            match ready!(self.recv.poll_data(cx)) {
                None => return Poll::Ready(Ok(Bytes::new())),
                Some(Ok(data)) => {
                    // Hand the window back now: the frame is the reader's,
                    // and holding one frame is all the buffering it does.
                    self.recv
                        .flow_control()
                        .release_capacity(data.len())
                        .map_err(to_io_error)?;
                    // An empty frame before END_STREAM is not the end.
                    if !data.is_empty() {
                        return Poll::Ready(Ok(data));
                    }
                }
                Some(Err(error)) if is_graceful_reset(&error) => {
                    return Poll::Ready(Ok(Bytes::new()));
                }
                Some(Err(error)) => return Poll::Ready(Err(to_io_error(error))),
            }
        }
    }

    /// Sends a prefix of `data` as large as the send capacity allows, up to
    /// `max_write`; returns its length. `data` is not empty.
    fn poll_send(&mut self, cx: &mut Context<'_>, data: &mut Bytes) -> Poll<io::Result<usize>> {
        let capacity = ready!(self.poll_send_capacity(cx, data.len()))?;
        // Zero-copy: the prefix shares `data`'s memory.
        self.send
            .send_data(data.split_to(capacity), false)
            .map_err(to_io_error)?;
        Poll::Ready(Ok(capacity))
    }

    /// Asks for capacity to send `len` bytes (at most `max_write`, so that one
    /// send never asks for more than one frame carries) and waits until some
    /// is granted; returns how much may be sent now, between 1 and that.
    fn poll_send_capacity(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<usize>> {
        let wanted = len.min(self.max_write);
        self.send.reserve_capacity(wanted);
        // Bounded: each turn either returns or has just been woken by new
        // capacity, and h2 never reports capacity it does not have twice.
        loop {
            let capacity = self.send.capacity().min(wanted);
            if capacity > 0 {
                return Poll::Ready(Ok(capacity));
            }
            match ready!(self.send.poll_capacity(cx)) {
                Some(Ok(_)) => continue,
                Some(Err(error)) => return Poll::Ready(Err(to_io_error(error))),
                // The stream can no longer send: the peer reset it.
                None => return Poll::Ready(Err(closed_error(&mut self.send, cx))),
            }
        }
    }
}

/// The copy's fast path: received frames are handed out as they are, and
/// the copy's bytes are sent as they are, split at the send capacity.
impl Side for H2Stream {
    fn poll_read_bytes(
        &mut self,
        cx: &mut Context<'_>,
        _buffer: &mut ReadBuffer,
    ) -> Poll<io::Result<Bytes>> {
        self.poll_received(cx)
    }

    fn poll_write_bytes(
        &mut self,
        cx: &mut Context<'_>,
        bytes: &mut Bytes,
    ) -> Poll<io::Result<usize>> {
        self.poll_send(cx, bytes)
    }
}

impl AsyncRead for H2Stream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.unread.is_empty() {
            this.unread = ready!(this.poll_received(cx))?;
        }
        let take = this.unread.len().min(buf.remaining());
        buf.put_slice(this.unread.get(..take).unwrap_or_default());
        this.unread.advance(take);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for H2Stream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        // Only what is sent is copied: as much as the capacity takes.
        let this = &mut *self;
        let capacity = ready!(this.poll_send_capacity(cx, buf.len()))?;
        let chunk = Bytes::copy_from_slice(buf.get(..capacity).unwrap_or_default());
        this.send.send_data(chunk, false).map_err(to_io_error)?;
        Poll::Ready(Ok(capacity))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The connection task writes frames out as soon as they are queued.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.write_closed {
            return Poll::Ready(Ok(()));
        }
        this.write_closed = true;
        // END_STREAM: the h2 form of shutdown(WR).
        match this.send.send_data(Bytes::new(), true) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(error) if is_graceful_reset(&error) => Poll::Ready(Ok(())),
            Err(error) => Poll::Ready(Err(to_io_error(error))),
        }
    }
}

/// NO_ERROR and CANCEL are how peers end a stream they are done with; both
/// read as EOF (WIRE.md §4: RST and EOF count as a normal close).
fn is_graceful_reset(error: &h2::Error) -> bool {
    matches!(error.reason(), Some(Reason::NO_ERROR | Reason::CANCEL))
}

/// The error a write on a stream that can no longer send gets.
fn closed_error(send: &mut SendStream<Bytes>, cx: &mut Context<'_>) -> io::Error {
    match send.poll_reset(cx) {
        Poll::Ready(Ok(reason)) => io::Error::new(
            io::ErrorKind::ConnectionReset,
            h2::Error::from(reason).to_string(),
        ),
        Poll::Ready(Err(error)) => to_io_error(error),
        Poll::Pending => io::ErrorKind::BrokenPipe.into(),
    }
}

/// Maps h2 errors onto the io error kinds `copy.rs` tells apart: resets
/// become `ConnectionReset`, I/O errors keep their kind.
fn to_io_error(error: h2::Error) -> io::Error {
    if error.is_io() {
        return error
            .into_io()
            .unwrap_or_else(|| io::ErrorKind::Other.into());
    }
    if error.is_reset() || error.is_go_away() {
        return io::Error::new(io::ErrorKind::ConnectionReset, error);
    }
    io::Error::other(error)
}

#[cfg(test)]
mod tests;
