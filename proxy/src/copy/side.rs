//! The two ends of a copy as the copy loop sees them: [`Side`], which reads
//! owned chunks of bytes and writes them, and [`ReadBuffer`], the memory a
//! side that reads from a socket reads into.
//!
//! A socket is a `Side` through the trait's defaults: it reads into the
//! copy's buffer, which is then frozen and handed to the other side whole.
//! A side that receives and sends owned [`Bytes`] itself (the HBONE stream,
//! `hbone/stream.rs`) overrides both methods, so that a byte is copied once,
//! from the kernel into the buffer, between the socket and h2.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, SimplexStream};
use tokio::net::TcpStream;

use super::{INITIAL_BUFFER, MAX_BUFFER, RELEASE_UP_TO};

/// One end of a copy: the copy reads chunks from it and writes the other
/// end's chunks to it. The defaults suit any socket (`impl Side for T {}`).
pub trait Side: AsyncRead + AsyncWrite + Unpin {
    /// Reads the next bytes, or an empty [`Bytes`] at EOF. The default reads
    /// into `buffer` and hands out the part it filled; a side that receives
    /// owned chunks hands those out and leaves `buffer` alone.
    fn poll_read_bytes(
        &mut self,
        cx: &mut Context<'_>,
        buffer: &mut ReadBuffer,
    ) -> Poll<io::Result<Bytes>> {
        buffer.poll_read_from(cx, Pin::new(self))
    }

    /// Writes a non-empty prefix of `bytes`, takes it off the front of
    /// `bytes`, and returns its length; never called with nothing to write.
    fn poll_write_bytes(
        &mut self,
        cx: &mut Context<'_>,
        bytes: &mut Bytes,
    ) -> Poll<io::Result<usize>> {
        let written = ready!(Pin::new(self).poll_write(cx, bytes))?.min(bytes.len());
        if written == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        bytes.advance(written);
        Poll::Ready(Ok(written))
    }
}

impl Side for TcpStream {}

impl Side for DuplexStream {}

impl Side for SimplexStream {}

/// The memory one direction of a copy reads a socket into. It grows with the
/// traffic from 1 KiB to 256 KiB and, while no bigger than 16 KiB, is given
/// back whenever the direction waits (`copy.rs` says why). Each read's bytes are split off and frozen: the other
/// side sends or writes that part as it is, and the rest of the allocation
/// takes the next read. Once the other side has let go of every part, the
/// whole allocation is reused from its start.
#[derive(Debug)]
pub struct ReadBuffer {
    /// Room for the next read; empty and unallocated while given back.
    bytes: BytesMut,
    /// The most one read takes: doubles when a read fills it, up to
    /// [`MAX_BUFFER`].
    size: usize,
}

/// A read never goes into less room than this: with less left in the
/// current allocation, the next read takes a fresh one. It bounds both the
/// reads a small tail would cost and the waste when parts of many
/// allocations are queued in h2.
const MIN_READ: usize = INITIAL_BUFFER;

impl ReadBuffer {
    pub(super) fn new() -> ReadBuffer {
        ReadBuffer {
            bytes: BytesMut::new(),
            size: INITIAL_BUFFER,
        }
    }

    /// Reads at most `size` bytes from `reader` and hands them out frozen;
    /// empty at EOF. A reader with nothing to read gets back a small buffer.
    fn poll_read_from<R>(
        &mut self,
        cx: &mut Context<'_>,
        reader: Pin<&mut R>,
    ) -> Poll<io::Result<Bytes>>
    where
        R: AsyncRead + ?Sized,
    {
        self.make_room();
        let limit = self.size.min(self.bytes.capacity());
        let mut room = (&mut self.bytes).limit(limit);
        match tokio_util::io::poll_read_buf(reader, cx, &mut room) {
            Poll::Ready(Ok(0)) => Poll::Ready(Ok(Bytes::new())),
            Poll::Ready(Ok(filled)) => {
                if filled >= self.size {
                    // A read that filled the buffer: the traffic is bulk.
                    self.size = (self.size * 2).min(MAX_BUFFER);
                }
                Poll::Ready(Ok(self.bytes.split().freeze()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => {
                if self.size <= RELEASE_UP_TO {
                    self.bytes = BytesMut::new();
                }
                Poll::Pending
            }
        }
    }

    /// Ensures room for the next read: the current allocation from its start
    /// when nothing else holds a part of it, else its tail when at least
    /// [`MIN_READ`] is left there, else a new allocation of `size`.
    fn make_room(&mut self) {
        if self.bytes.try_reclaim(self.size) || self.bytes.capacity() >= MIN_READ {
            return;
        }
        self.bytes = BytesMut::with_capacity(self.size);
    }

    /// The most the next read takes.
    #[cfg(test)]
    pub(super) fn size(&self) -> usize {
        self.size
    }

    /// Whether the next read goes into memory the buffer already holds.
    #[cfg(test)]
    pub(super) fn holds_room(&mut self) -> bool {
        self.bytes.try_reclaim(MIN_READ)
    }
}
