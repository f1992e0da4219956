//! The TLS stream under h2, with each frame's header written as a TLS
//! record of its own.
//!
//! h2 writes a large DATA frame as two buffers: its own, holding the frame
//! header (after any small frames queued before it), and the payload it was
//! given. Written together, the two are cut into TLS records from the first
//! byte of the header, so the first record of every frame holds bytes of
//! both buffers; the record encrypter (`ztunnel_certs::tls`'s seal) must
//! copy such a record together before sealing it, up to 16 KiB per frame.
//! Written apart, the header becomes a small record of its own and every
//! record of the payload lies inside the payload's buffer, sealed from where
//! h2 holds it. The price is one record's framing and tag (22 bytes) per
//! frame of up to `H2Settings::max_frame_size`.
//!
//! What goes into a record, and how it is sealed, is rustls's and the seal's.

use std::io::{self, IoSlice, Write};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A payload shorter than this is written together with what comes before
/// it. h2 copies payloads of up to 256 bytes into its own buffer, so a
/// separate payload buffer is always larger; below 4 KiB the copy a split
/// saves is no dearer than the extra record's seal.
const SPLIT_FROM: usize = 4096;

/// A TLS session whose plaintext can be queued without writing to the
/// socket: rustls's `Writer` seals what it is given into records and keeps
/// them until the stream's next write sends them.
pub trait QueuedPlaintext {
    /// Seals as much of `plaintext` as the session's buffer limit takes, and
    /// returns how much that was (0 when the buffer is full).
    fn queue(&mut self, plaintext: &[u8]) -> io::Result<usize>;
}

impl<IO> QueuedPlaintext for tokio_rustls::client::TlsStream<IO> {
    fn queue(&mut self, plaintext: &[u8]) -> io::Result<usize> {
        self.get_mut().1.writer().write(plaintext)
    }
}

impl<IO> QueuedPlaintext for tokio_rustls::server::TlsStream<IO> {
    fn queue(&mut self, plaintext: &[u8]) -> io::Result<usize> {
        self.get_mut().1.writer().write(plaintext)
    }
}

/// A TLS stream that writes the buffer before a large payload as records
/// of its own, so that the payload's records start at its first byte.
#[derive(Debug)]
pub struct RecordAligned<S> {
    /// The TLS stream; everything but the split is its own.
    inner: S,
}

impl<S> RecordAligned<S> {
    /// Wraps `inner`, an established TLS stream.
    pub fn new(inner: S) -> RecordAligned<S> {
        RecordAligned { inner }
    }

    /// The TLS stream, for its session's state.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

/// Whether to queue `head` as records of its own before writing `rest`:
/// when a payload large enough to be worth sealing without a copy follows.
fn split_before(head: &[u8], rest: &[IoSlice<'_>]) -> bool {
    !head.is_empty() && rest.iter().map(|buf| buf.len()).sum::<usize>() >= SPLIT_FROM
}

impl<S: AsyncRead + Unpin> AsyncRead for RecordAligned<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + QueuedPlaintext + Unpin> AsyncWrite for RecordAligned<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let [head, rest @ ..] = bufs
            && split_before(head, rest)
        {
            let queued = this.inner.queue(head)?;
            if queued == head.len() {
                // The stream's write sends the queued records first.
                return match Pin::new(&mut this.inner).poll_write_vectored(cx, rest) {
                    Poll::Ready(Ok(written)) => Poll::Ready(Ok(queued + written)),
                    // The head is taken either way; the caller comes back
                    // for the rest and meets the wait or the error then.
                    Poll::Pending | Poll::Ready(Err(_)) => Poll::Ready(Ok(queued)),
                };
            }
            if queued > 0 {
                // Part of the head: the buffer is full, and the next call
                // writes what is queued before it takes more.
                return Poll::Ready(Ok(queued));
            }
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
