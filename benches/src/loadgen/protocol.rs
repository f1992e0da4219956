//! The wire protocol between `ztunnel-loadgen` clients and its server: the
//! 16-byte header a client writes first, and the fixed-length messages of
//! the echo mode.
//!
//! The header layout (big-endian):
//!
//! ```text
//! 0..4    magic "ZLG1"
//! 4       mode: 1 = sink, 2 = source, 3 = echo
//! 5       flags: bit 0 = the server closes after its first response (echo only)
//! 6..8    reserved, zero
//! 8..12   request size in bytes (echo; zero otherwise)
//! 12..16  response size in bytes (echo; zero otherwise)
//! ```
//!
//! What the server does with each mode lives in `server.rs`.

use std::io;
use std::num::NonZeroU32;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The header's length on the wire.
pub const HEADER_LEN: usize = 16;

/// The first four bytes of every connection. A version digit in the magic
/// lets a future layout be told apart from this one.
const MAGIC: [u8; 4] = *b"ZLG1";

/// The largest request or response an echo header may ask for. 64 MiB is far
/// above any message a proxy benchmark needs, and bounds how long one
/// malformed header can keep the server writing.
pub const MAX_MESSAGE: u32 = 64 * 1024 * 1024;

/// Flag bit: the server closes the connection after its first response, so
/// that it, not the client, is the side that sends the first FIN.
const FLAG_CLOSE_AFTER_RESPONSE: u8 = 0x01;

/// Mode byte values.
const MODE_SINK: u8 = 1;
/// See [`MODE_SINK`].
const MODE_SOURCE: u8 = 2;
/// See [`MODE_SINK`].
const MODE_ECHO: u8 = 3;

/// What a connection asks the server to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// Read and discard until the client closes.
    Sink,
    /// Write as fast as possible until the client closes.
    Source,
    /// Answer each request with a response, both of fixed length.
    Echo(Exchange),
}

/// The shape of an echo conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exchange {
    /// Bytes in each request.
    pub request: NonZeroU32,
    /// Bytes in each response.
    pub response: NonZeroU32,
    /// The server closes after the first response. The connect mode uses it
    /// so that TIME_WAIT lands on the server and not on the client's
    /// ephemeral ports.
    pub close_after_response: bool,
}

/// Why a header was refused.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    /// The connection does not speak this protocol (or another version of it).
    #[error("bad magic {0:02x?}")]
    Magic([u8; 4]),
    /// The mode byte names no known mode.
    #[error("unknown mode {0}")]
    Mode(u8),
    /// Flags or reserved bytes that this version does not define are set.
    #[error("reserved bits set (flags {flags:#04x}, reserved {reserved:02x?})")]
    Reserved {
        /// The flags byte as received.
        flags: u8,
        /// The two reserved bytes as received.
        reserved: [u8; 2],
    },
    /// An echo header with a zero-length request or response, which would
    /// make the server spin.
    #[error("echo needs non-zero sizes (request {request}, response {response})")]
    EmptyMessage {
        /// The request size received.
        request: u32,
        /// The response size received.
        response: u32,
    },
    /// A message size above [`MAX_MESSAGE`].
    #[error("message size {0} is above the limit of {MAX_MESSAGE}")]
    TooLarge(u32),
    /// The client closed after part of a header.
    #[error("closed after {0} of {HEADER_LEN} header bytes")]
    Truncated(usize),
    /// Reading the header failed.
    #[error("reading the header")]
    Read(#[from] io::Error),
}

impl Header {
    /// The header as written on the wire.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut bytes = [0u8; HEADER_LEN];
        bytes[0..4].copy_from_slice(&MAGIC);
        match self {
            Header::Sink => bytes[4] = MODE_SINK,
            Header::Source => bytes[4] = MODE_SOURCE,
            Header::Echo(exchange) => {
                bytes[4] = MODE_ECHO;
                if exchange.close_after_response {
                    bytes[5] = FLAG_CLOSE_AFTER_RESPONSE;
                }
                bytes[8..12].copy_from_slice(&exchange.request.get().to_be_bytes());
                bytes[12..16].copy_from_slice(&exchange.response.get().to_be_bytes());
            }
        }
        bytes
    }

    /// Parses a header received from a client.
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Result<Header, HeaderError> {
        let [
            m0,
            m1,
            m2,
            m3,
            mode,
            flags,
            r0,
            r1,
            q0,
            q1,
            q2,
            q3,
            s0,
            s1,
            s2,
            s3,
        ] = *bytes;
        if [m0, m1, m2, m3] != MAGIC {
            return Err(HeaderError::Magic([m0, m1, m2, m3]));
        }
        let request = u32::from_be_bytes([q0, q1, q2, q3]);
        let response = u32::from_be_bytes([s0, s1, s2, s3]);
        let allowed_flags = if mode == MODE_ECHO {
            FLAG_CLOSE_AFTER_RESPONSE
        } else {
            0
        };
        if flags & !allowed_flags != 0 || [r0, r1] != [0, 0] {
            return Err(HeaderError::Reserved {
                flags,
                reserved: [r0, r1],
            });
        }
        match mode {
            // Sizes mean nothing to sink and source; a client that sets them
            // is confused, but serving it does no harm.
            MODE_SINK => Ok(Header::Sink),
            MODE_SOURCE => Ok(Header::Source),
            MODE_ECHO => {
                for size in [request, response] {
                    if size > MAX_MESSAGE {
                        return Err(HeaderError::TooLarge(size));
                    }
                }
                match (NonZeroU32::new(request), NonZeroU32::new(response)) {
                    (Some(request), Some(response)) => Ok(Header::Echo(Exchange {
                        request,
                        response,
                        close_after_response: flags & FLAG_CLOSE_AFTER_RESPONSE != 0,
                    })),
                    _ => Err(HeaderError::EmptyMessage { request, response }),
                }
            }
            other => Err(HeaderError::Mode(other)),
        }
    }
}

/// Reads a header from a client; `None` if the client closed or reset the
/// connection before its first byte: a port probe, or a client that gave up
/// on a connection at the end of its run, not a malformed client.
pub async fn read_header<S>(stream: &mut S) -> Result<Option<Header>, HeaderError>
where
    S: AsyncRead + Unpin,
{
    let mut bytes = [0u8; HEADER_LEN];
    let mut filled = 0;
    while filled < HEADER_LEN {
        match stream.read(&mut bytes[filled..]).await {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => return Err(HeaderError::Truncated(filled)),
            Ok(read) => filled += read,
            Err(err) if filled == 0 && err.kind() == io::ErrorKind::ConnectionReset => {
                return Ok(None);
            }
            Err(err) => return Err(err.into()),
        }
    }
    Header::decode(&bytes).map(Some)
}

/// Writes `len` bytes taken from `buf`, reusing it as many times as needed,
/// so a large message needs no buffer of its own size. `buf` must not be
/// empty.
pub async fn write_message<S>(stream: &mut S, buf: &[u8], len: u32) -> io::Result<()>
where
    S: AsyncWrite + Unpin,
{
    let mut remaining = len as usize;
    while remaining > 0 {
        let chunk = remaining.min(buf.len());
        stream.write_all(&buf[..chunk]).await?;
        remaining -= chunk;
    }
    Ok(())
}

/// Reads and discards exactly `len` bytes into `buf` (reused as many times as
/// needed). Returns `Ok(false)` if the peer closed cleanly before the first
/// byte, the normal end of an echo conversation; a close inside the message
/// is an `UnexpectedEof` error. `buf` must not be empty.
pub async fn read_message<S>(stream: &mut S, buf: &mut [u8], len: u32) -> io::Result<bool>
where
    S: AsyncRead + Unpin,
{
    let mut remaining = len as usize;
    let mut first = true;
    while remaining > 0 {
        let chunk = remaining.min(buf.len());
        let read = stream.read(&mut buf[..chunk]).await?;
        if read == 0 {
            if first {
                return Ok(false);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        first = false;
        remaining -= read;
    }
    Ok(true)
}

#[cfg(test)]
mod tests;
