//! The gRPC framing of the ADS stream, written here rather than left to
//! tonic's generated server, for memory: tonic's encoder and decoder each
//! keep, per stream, a buffer as large as the largest message the stream
//! ever carried, and the first response of a type is the whole mesh (about
//! 3 MiB for 10,000 pods). For 100 node agents that is hundreds of
//! megabytes held for nothing. Here a response is written from the shared
//! encoded resources of `cache.rs` in bounded chunks as HTTP/2 flow control
//! pulls them, and the request buffer is given back once a large request
//! has been decoded.
//!
//! gRPC framing: each message is a compression flag byte (0), its length as
//! 4 bytes big-endian, then its protobuf bytes; the response ends with
//! trailers carrying `grpc-status`. Compressed requests are refused
//! (ztunnel does not compress).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use hyper::body::{Body, Frame};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use tokio::sync::mpsc;
use tonic::Status;
use tonic::codegen::http::HeaderMap;
use ztunnel_proto::envoy::service::discovery::v3::DeltaDiscoveryRequest;

use super::cache::Entry;
use super::delta::Push;

/// The compression flag and the length before each message.
const PREFIX_BYTES: usize = 5;

/// Size of the chunks a response is handed to HTTP/2 in: a few 16 KiB
/// DATA frames each, few enough copies, and a bound on what one stream
/// holds beyond the shared resources.
const CHUNK_BYTES: usize = 64 * 1024;

/// A request buffer grown beyond this (by a reconnect listing thousands of
/// versions) is given back once its message is decoded; smaller ones are
/// kept for the next request.
const KEPT_REQUEST_BUFFER_BYTES: usize = 64 * 1024;

/// `DeltaDiscoveryResponse` field numbers (WIRE.md §7).
const RESOURCES_FIELD: u32 = 2;
const TYPE_URL_FIELD: u32 = 4;
const NONCE_FIELD: u32 = 5;
const REMOVED_RESOURCES_FIELD: u32 = 6;

/// One response as gRPC-framed bytes, produced chunk by chunk.
#[derive(Debug)]
pub struct PushFrames {
    /// The prefix and every field but the resources; taken by the first
    /// chunk.
    head: Option<BytesMut>,
    /// Resources not yet written.
    resources: std::vec::IntoIter<Arc<Entry>>,
    /// Bytes of the whole frame, prefix included.
    len: usize,
}

impl PushFrames {
    /// Frames `push`; fails only for a message beyond gRPC's 4 GiB.
    pub fn new(push: Push) -> Result<Self, WireError> {
        let message_len = string_len(TYPE_URL_FIELD, &push.type_url)
            + string_len(NONCE_FIELD, &push.nonce)
            + push
                .removed
                .iter()
                .map(|name| string_len(REMOVED_RESOURCES_FIELD, name))
                .sum::<usize>()
            + push
                .resources
                .iter()
                .map(|entry| bytes_len(RESOURCES_FIELD, &entry.encoded))
                .sum::<usize>();
        let prefix_len = u32::try_from(message_len).map_err(|_| WireError::TooLarge {
            len: message_len,
            max: u32::MAX as usize,
        })?;
        let mut head = BytesMut::with_capacity(CHUNK_BYTES);
        head.put_u8(0);
        head.put_u32(prefix_len);
        put_string(TYPE_URL_FIELD, &push.type_url, &mut head);
        put_string(NONCE_FIELD, &push.nonce, &mut head);
        for name in &push.removed {
            put_string(REMOVED_RESOURCES_FIELD, name, &mut head);
        }
        Ok(PushFrames {
            head: Some(head),
            resources: push.resources.into_iter(),
            len: PREFIX_BYTES + message_len,
        })
    }

    /// Bytes of the whole frame, prefix included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the frame is empty (never: a frame has at least its prefix).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Iterator for PushFrames {
    type Item = Bytes;

    /// The next chunk: about `CHUNK_BYTES`, more when one resource is
    /// larger.
    fn next(&mut self) -> Option<Bytes> {
        let mut chunk = self
            .head
            .take()
            .unwrap_or_else(|| BytesMut::with_capacity(CHUNK_BYTES));
        while chunk.len() < CHUNK_BYTES {
            let Some(entry) = self.resources.next() else {
                break;
            };
            encode_key(RESOURCES_FIELD, WireType::LengthDelimited, &mut chunk);
            encode_varint(entry.encoded.len() as u64, &mut chunk);
            chunk.extend_from_slice(&entry.encoded);
        }
        (!chunk.is_empty()).then(|| chunk.freeze())
    }
}

fn string_len(tag: u32, value: &str) -> usize {
    key_len(tag) + encoded_len_varint(value.len() as u64) + value.len()
}

fn bytes_len(tag: u32, value: &[u8]) -> usize {
    key_len(tag) + encoded_len_varint(value.len() as u64) + value.len()
}

fn put_string(tag: u32, value: &str, buffer: &mut BytesMut) {
    encode_key(tag, WireType::LengthDelimited, buffer);
    encode_varint(value.len() as u64, buffer);
    buffer.put_slice(value.as_bytes());
}

/// Splits the request body's bytes into `DeltaDiscoveryRequest`s.
#[derive(Debug)]
pub struct RequestDecoder {
    /// Bytes received and not yet decoded.
    buffer: BytesMut,
    /// Largest message accepted.
    max_message_bytes: usize,
}

impl RequestDecoder {
    /// A decoder refusing messages over `max_message_bytes`.
    pub fn new(max_message_bytes: usize) -> Self {
        RequestDecoder {
            buffer: BytesMut::new(),
            max_message_bytes,
        }
    }

    /// Adds received body bytes.
    pub fn extend(&mut self, data: &[u8]) {
        self.buffer.extend_from_slice(data);
    }

    /// Whether a message has begun and not ended: at the end of the body,
    /// a truncated request.
    pub fn has_partial(&self) -> bool {
        !self.buffer.is_empty()
    }

    /// The next complete request, if one has arrived. Its size is checked
    /// from its prefix, before it is buffered whole.
    pub fn decode(&mut self) -> Result<Option<DeltaDiscoveryRequest>, WireError> {
        let Some(&[flag, a, b, c, d]) = self.buffer.get(..PREFIX_BYTES) else {
            return Ok(None);
        };
        if flag != 0 {
            return Err(WireError::Compressed);
        }
        let len = u32::from_be_bytes([a, b, c, d]) as usize;
        if len > self.max_message_bytes {
            return Err(WireError::TooLarge {
                len,
                max: self.max_message_bytes,
            });
        }
        if self.buffer.len() < PREFIX_BYTES + len {
            return Ok(None);
        }
        let frame = self.buffer.split_to(PREFIX_BYTES + len);
        let request = DeltaDiscoveryRequest::decode(frame.get(PREFIX_BYTES..).unwrap_or_default())
            .map_err(WireError::Decode)?;
        if self.buffer.capacity() > KEPT_REQUEST_BUFFER_BYTES {
            self.buffer = BytesMut::from(&self.buffer[..]);
        }
        Ok(Some(request))
    }
}

/// Why a stream's bytes could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A compressed request; none is negotiated.
    #[error("compressed messages are not accepted")]
    Compressed,
    /// A message beyond the limit.
    #[error("message of {len} bytes is larger than {max}")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A request that is not a `DeltaDiscoveryRequest`.
    #[error("cannot decode the request: {0}")]
    Decode(prost::DecodeError),
    /// The body ended inside a request.
    #[error("the stream ended inside a request")]
    Truncated,
}

impl WireError {
    /// The status that ends a stream for this error.
    pub fn status(&self) -> Status {
        match self {
            WireError::TooLarge { .. } => Status::resource_exhausted(self.to_string()),
            WireError::Compressed => Status::unimplemented(self.to_string()),
            WireError::Decode(_) | WireError::Truncated => {
                Status::invalid_argument(self.to_string())
            }
        }
    }
}

/// The response body of one stream: the frames its task sends, then
/// trailers (`grpc-status` 0 when the task ends normally, or the status it
/// ended with). Chunks are produced as HTTP/2 asks for them.
#[derive(Debug)]
pub struct ResponseBody {
    /// From the stream's task.
    frames: mpsc::Receiver<Result<PushFrames, Status>>,
    /// The frame being written.
    current: Option<PushFrames>,
    /// Trailers were sent.
    finished: bool,
}

impl ResponseBody {
    /// A body writing what arrives on `frames`.
    pub fn new(frames: mpsc::Receiver<Result<PushFrames, Status>>) -> Self {
        ResponseBody {
            frames,
            current: None,
            finished: false,
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        loop {
            if let Some(chunk) = this.current.as_mut().and_then(Iterator::next) {
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            this.current = None;
            if this.finished {
                return Poll::Ready(None);
            }
            let status = match this.frames.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frames))) => {
                    this.current = Some(frames);
                    continue;
                }
                Poll::Ready(Some(Err(status))) => status,
                Poll::Ready(None) => Status::ok(""),
            };
            this.finished = true;
            let mut trailers = HeaderMap::new();
            // Fails only for metadata that is not a valid header; ours has none.
            let _ = status.add_header(&mut trailers);
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
    }
}

#[cfg(test)]
mod tests;
