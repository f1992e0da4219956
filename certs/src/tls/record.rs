//! A TLS 1.3 record layer of our own for established connections, the
//! userspace counterpart of kernel TLS: rustls runs the handshake
//! (`record/handshake.rs`), then the connection's traffic secrets are taken
//! out of rustls and every record is sealed and opened here with aws-lc-rs
//! (RFC 8446 §5). rustls keeps only the key schedule, for key updates, and
//! the client's session-ticket store.
//!
//! What it saves over rustls's buffered connection: a record is sealed
//! straight from the caller's buffer into one contiguous output buffer, with
//! no allocation, zero fill or copy per record, and everything queued goes
//! to the socket in one write. Records never span two of the caller's
//! buffers, so nothing is copied before sealing either.
//!
//! Sealing and the send buffer are `record/send.rs`; opening, the receive
//! buffer and the handshake messages that follow the handshake are
//! `record/receive.rs`; the per-thread cache of idle buffers is
//! `record/spare.rs`. The rustls configurations are `tls/client.rs` and
//! `tls/server.rs`.

use std::fmt;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use aws_lc_rs::aead::{self, NONCE_LEN};
use rustls::client::ClientConnectionData;
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{AlertDescription, ConnectionTrafficSecrets, ExtractedSecrets, ProtocolVersion};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

mod handshake;
mod receive;
mod send;
mod spare;

pub use handshake::{HandshakeError, Negotiated, accept, connect};

use receive::{Opened, Receiver};
use send::Sender;

/// A record's header: outer content type, legacy version, length
/// (RFC 8446 §5.1).
const HEADER_LEN: usize = 5;

/// The most plaintext one record carries (RFC 8446 §5.1).
const MAX_PLAINTEXT: usize = 1 << 14;

/// The longest ciphertext a peer may send in one record: the plaintext, its
/// content type, padding and tag (RFC 8446 §5.2).
const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;

/// The longest record on the wire.
const MAX_RECORD: usize = HEADER_LEN + MAX_CIPHERTEXT;

/// The outer version of every TLS 1.3 record (RFC 8446 §5.1).
const LEGACY_VERSION: [u8; 2] = [3, 3];

/// Content types (RFC 8446 §5.1). TLS 1.3 records all carry
/// application_data outside; the real type is sealed inside.
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;

/// Handshake message types that may follow the handshake (RFC 8446 §4.6).
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;

/// Why a record stream failed. Every error is final: once one is met, each
/// later read and write fails with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecordError {
    /// A record did not authenticate: corrupted on the way or forged.
    #[error("a TLS record failed authentication (bad_record_mac)")]
    BadRecordMac,
    /// A record, or the plaintext inside one, is longer than TLS 1.3 allows.
    #[error("a TLS record is longer than TLS 1.3 allows (record_overflow)")]
    RecordOverflow,
    /// A record's header is not that of an encrypted TLS 1.3 record:
    /// another outer content type or version, so a plaintext record or no
    /// TLS at all.
    #[error(
        "a TLS record arrived with outer type {content_type} and version {version:#06x}, \
         not as an encrypted TLS 1.3 record (unexpected_message)"
    )]
    BadHeader {
        /// The record's outer content type.
        content_type: u8,
        /// The record's legacy version.
        version: u16,
    },
    /// A record's plaintext is all zeros: padding with no content type.
    #[error("a TLS record carries no content type (unexpected_message)")]
    NoContentType,
    /// A record's content type is not one TLS 1.3 allows after the
    /// handshake (ChangeCipherSpec included).
    #[error("a TLS record of content type {0} arrived after the handshake (unexpected_message)")]
    UnexpectedContentType(u8),
    /// A handshake message other than KeyUpdate, or a NewSessionTicket
    /// sent to a server.
    #[error("a handshake message of type {0} arrived after the handshake (unexpected_message)")]
    UnexpectedHandshake(u8),
    /// A message that does not parse: named here.
    #[error("a malformed TLS {0} arrived (decode_error)")]
    Malformed(&'static str),
    /// A record of another type arrived between the fragments of a
    /// handshake message, or a KeyUpdate did not end its record: either
    /// would mix bytes of two keys (RFC 8446 §5.1).
    #[error("a TLS handshake message was interleaved with other records (unexpected_message)")]
    Interleaved,
    /// A handshake message longer than rustls's own bound.
    #[error("a TLS handshake message of {0} bytes is longer than allowed (unexpected_message)")]
    HandshakeTooLong(usize),
    /// Empty records in a row beyond reason: a peer making us spin.
    #[error("too many empty TLS records in a row (unexpected_message)")]
    TooManyEmptyRecords,
    /// KeyUpdates beyond rustls's bound with no application data between
    /// them: each costs a key derivation.
    #[error("too many TLS KeyUpdates without application data (unexpected_message)")]
    TooManyKeyUpdates,
    /// NewSessionTickets beyond the bound with no application data between
    /// them: each costs rustls a ticket to parse and store.
    #[error("too many TLS session tickets without application data (unexpected_message)")]
    TooManySessionTickets,
    /// Warning alerts (user_canceled) beyond rustls's bound.
    #[error("too many TLS warning alerts (unexpected_message)")]
    TooManyWarningAlerts,
    /// A field holds a value its message does not allow (RFC 8446 §4.6.3,
    /// §6): named here.
    #[error("a TLS {0} holds a value that is not allowed (illegal_parameter)")]
    IllegalParameter(&'static str),
    /// The peer sent an error alert.
    #[error("the peer sent the TLS alert {0:?}")]
    Alert(AlertDescription),
    /// The connection ended in the middle of a record.
    #[error("the connection closed in the middle of a TLS record")]
    Truncated,
    /// The connection ended without close_notify, so the data may have been
    /// cut short.
    #[error("the peer closed the connection without a TLS close_notify")]
    NoCloseNotify,
    /// rustls could not derive the next traffic secret.
    #[error("deriving the next TLS traffic key failed")]
    KeyUpdate(#[source] rustls::Error),
    /// rustls refused a session ticket the server sent.
    #[error("the server's TLS session ticket was refused")]
    SessionTicket(#[source] rustls::Error),
    /// The session is not TLS 1.3 with AES-GCM, the only suites our records
    /// are sealed with.
    #[error("the TLS session's protocol version or cipher suite has no record layer here")]
    UnsupportedSuite,
    /// aws-lc refused to seal a record: a sequence number not above the
    /// last one sealed with the key, which would repeat a nonce.
    #[error("sealing a TLS record failed")]
    Seal,
    /// A key's sequence numbers ran out (2^64 records).
    #[error("the TLS record sequence number is exhausted")]
    SequenceExhausted,
    /// Reading or writing the connection failed earlier; the first call saw
    /// the transport's own error.
    #[error("the connection failed earlier: {0}")]
    Transport(io::ErrorKind),
    /// Data was written after the stream was shut down.
    #[error("the TLS stream was shut down for writing")]
    WriteAfterShutdown,
}

impl RecordError {
    /// The alert that tells the peer of this error, when the peer's bytes
    /// caused it and the peer can still hear (RFC 8446 §6.2).
    fn alert(&self) -> Option<AlertDescription> {
        match self {
            RecordError::BadRecordMac => Some(AlertDescription::BadRecordMac),
            RecordError::RecordOverflow => Some(AlertDescription::RecordOverflow),
            RecordError::BadHeader { .. }
            | RecordError::NoContentType
            | RecordError::UnexpectedContentType(_)
            | RecordError::UnexpectedHandshake(_)
            | RecordError::Interleaved
            | RecordError::HandshakeTooLong(_)
            | RecordError::TooManyEmptyRecords
            | RecordError::TooManyKeyUpdates
            | RecordError::TooManySessionTickets
            | RecordError::TooManyWarningAlerts => Some(AlertDescription::UnexpectedMessage),
            RecordError::IllegalParameter(_) => Some(AlertDescription::IllegalParameter),
            RecordError::Malformed(_) | RecordError::SessionTicket(_) => {
                Some(AlertDescription::DecodeError)
            }
            RecordError::KeyUpdate(_) | RecordError::SequenceExhausted => {
                Some(AlertDescription::InternalError)
            }
            RecordError::Alert(_)
            | RecordError::Truncated
            | RecordError::NoCloseNotify
            | RecordError::UnsupportedSuite
            | RecordError::Seal
            | RecordError::Transport(_)
            | RecordError::WriteAfterShutdown => None,
        }
    }

    /// The kind of the `io::Error` this error is reported as.
    fn kind(&self) -> io::ErrorKind {
        match self {
            RecordError::Truncated | RecordError::NoCloseNotify => io::ErrorKind::UnexpectedEof,
            RecordError::Transport(kind) => *kind,
            RecordError::WriteAfterShutdown => io::ErrorKind::BrokenPipe,
            _ => io::ErrorKind::InvalidData,
        }
    }
}

impl From<RecordError> for io::Error {
    fn from(error: RecordError) -> io::Error {
        io::Error::new(error.kind(), error)
    }
}

/// An established TLS 1.3 connection over `IO` whose records are sealed and
/// opened here. Made by [`connect`] or [`accept`].
pub struct RecordStream<IO> {
    /// The transport.
    io: IO,
    /// What rustls keeps of the session.
    kernel: Kernel,
    /// Our sending key and the records queued for the transport.
    sender: Sender,
    /// The peer's sending key and the bytes read from the transport.
    receiver: Receiver,
    /// The first error; every later call fails with it.
    failed: Option<RecordError>,
    /// close_notify is sealed: nothing more may be written.
    closing: bool,
    /// The transport's write side is shut down.
    shut_down: bool,
}

impl<IO> RecordStream<IO> {
    /// Takes over a session whose handshake is complete: its secrets,
    /// rustls's remains, and `received`, the bytes read beyond the
    /// handshake (whole or partial records, opened like any later ones).
    fn new(
        io: IO,
        kernel: Kernel,
        secrets: ExtractedSecrets,
        received: &[u8],
    ) -> Result<RecordStream<IO>, RecordError> {
        let limit = kernel.confidentiality_limit()?;
        let (tx_seq, tx) = secrets.tx;
        let (rx_seq, rx) = secrets.rx;
        Ok(RecordStream {
            io,
            kernel,
            sender: Sender::new(&tx, tx_seq, limit)?,
            receiver: Receiver::new(&rx, rx_seq, received)?,
            failed: None,
            closing: false,
            shut_down: false,
        })
    }

    /// Fails the stream with `error`, for this call and every later one.
    fn fail(&mut self, error: RecordError) -> io::Error {
        self.failed = Some(error.clone());
        error.into()
    }

    /// Fails the stream after the transport failed: this call reports the
    /// transport's error, later ones its kind. Bytes of a record may have
    /// been sent or read in part, so the stream cannot go on.
    fn fail_transport(&mut self, error: io::Error) -> io::Error {
        self.failed = Some(RecordError::Transport(error.kind()));
        error
    }

    /// The error the stream failed with, if it did.
    fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some(error) => Err(error.clone().into()),
            None => Ok(()),
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> RecordStream<IO> {
    /// Fails the stream with `error`, the peer's fault, after sending the
    /// alert that tells it why as far as the transport takes it now: best
    /// effort, since the stream is done either way.
    fn fail_and_tell(&mut self, error: RecordError, cx: &mut Context<'_>) -> io::Error {
        if let Some(alert) = error.alert()
            && !self.closing
            && self.sender.seal_alert(&mut self.kernel, alert).is_ok()
        {
            let _ = self.sender.poll_drain(Pin::new(&mut self.io), cx);
        }
        self.fail(error)
    }

    /// Writes queued records until none is left, or the transport would
    /// block; fails the stream if the transport fails.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.sender.poll_drain(Pin::new(&mut self.io), cx) {
            Poll::Ready(Err(error)) => Poll::Ready(Err(self.fail_transport(error))),
            other => other,
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for RecordStream<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check()?;
        // Plaintext goes to the reader from as many buffered records as it
        // has room for; the transport is read only when none is left.
        let mut delivered = false;
        loop {
            delivered |= this.receiver.read_plaintext(buf);
            if buf.remaining() == 0 || this.receiver.is_closed() {
                return Poll::Ready(Ok(()));
            }
            match this.receiver.open_next(&mut this.kernel) {
                Ok(Opened::Record) => {}
                // Answered before our next record (RFC 8446 §4.6.3): sent
                // with the next write or shutdown.
                Ok(Opened::UpdateRequested) => this.sender.owe_update(),
                Ok(Opened::NeedMore) if delivered => return Poll::Ready(Ok(())),
                Ok(Opened::NeedMore) => match this.receiver.poll_fill(Pin::new(&mut this.io), cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(true)) => {}
                    Poll::Ready(Ok(false)) => {
                        let error = this.receiver.end_of_file();
                        return Poll::Ready(Err(this.fail(error)));
                    }
                    Poll::Ready(Err(error)) => {
                        return Poll::Ready(Err(this.fail_transport(error)));
                    }
                },
                Err(error) => {
                    let error = this.fail_and_tell(error, cx);
                    // What came before the fault is the reader's; the
                    // fault is the next call's.
                    return Poll::Ready(if delivered { Ok(()) } else { Err(error) });
                }
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RecordStream<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check()?;
        if this.closing {
            return Poll::Ready(Err(RecordError::WriteAfterShutdown.into()));
        }
        if bufs.iter().all(|buf| buf.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        if !this.sender.has_room() {
            // Full: new plaintext waits until the transport takes some of
            // what is queued; its waker is registered when it cannot.
            if let Poll::Ready(Err(error)) = this.poll_send(cx) {
                return Poll::Ready(Err(error));
            }
            if !this.sender.has_room() {
                return Poll::Pending;
            }
        }
        let taken = match this.sender.seal_application_data(&mut this.kernel, bufs) {
            Ok(taken) => taken,
            Err(error) => return Poll::Ready(Err(this.fail(error))),
        };
        // One write for everything queued. The plaintext is taken either
        // way: a transport that would block is written to by a later call,
        // and one that failed fails that call.
        let _ = this.poll_send(cx);
        Poll::Ready(Ok(taken))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check()?;
        std::task::ready!(this.poll_send(cx))?;
        match Pin::new(&mut this.io).poll_flush(cx) {
            Poll::Ready(Err(error)) => Poll::Ready(Err(this.fail_transport(error))),
            other => other,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check()?;
        if !this.closing {
            if let Err(error) = this.sender.seal_close_notify(&mut this.kernel) {
                return Poll::Ready(Err(this.fail(error)));
            }
            this.closing = true;
        }
        std::task::ready!(this.poll_send(cx))?;
        if !this.shut_down {
            match Pin::new(&mut this.io).poll_shutdown(cx) {
                Poll::Ready(Ok(())) => this.shut_down = true,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(this.fail_transport(error))),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: fmt::Debug> fmt::Debug for RecordStream<IO> {
    /// Leaves the keys out: they must never reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordStream")
            .field("io", &self.io)
            .field("failed", &self.failed)
            .field("closing", &self.closing)
            .finish_non_exhaustive()
    }
}

/// What rustls keeps of a session once its secrets are taken out: the key
/// schedule, for key updates, and on the client the session-ticket store.
enum Kernel {
    /// The dialing side.
    Client(KernelConnection<ClientConnectionData>),
    /// The accepting side.
    Server(KernelConnection<ServerConnectionData>),
}

impl Kernel {
    /// Records one key may seal: the confidentiality limit of the
    /// negotiated suite (rustls leaves counting them to us).
    fn confidentiality_limit(&self) -> Result<u64, RecordError> {
        let (version, suite) = match self {
            Kernel::Client(kernel) => (kernel.protocol_version(), kernel.negotiated_cipher_suite()),
            Kernel::Server(kernel) => (kernel.protocol_version(), kernel.negotiated_cipher_suite()),
        };
        match (version, suite.tls13()) {
            (ProtocolVersion::TLSv1_3, Some(suite)) => Ok(suite.common.confidentiality_limit),
            _ => Err(RecordError::UnsupportedSuite),
        }
    }

    /// Our next sending secret and its first sequence number.
    fn next_tx_secret(&mut self) -> Result<(u64, ConnectionTrafficSecrets), RecordError> {
        match self {
            Kernel::Client(kernel) => kernel.update_tx_secret(),
            Kernel::Server(kernel) => kernel.update_tx_secret(),
        }
        .map_err(RecordError::KeyUpdate)
    }

    /// The peer's next sending secret and its first sequence number.
    fn next_rx_secret(&mut self) -> Result<(u64, ConnectionTrafficSecrets), RecordError> {
        match self {
            Kernel::Client(kernel) => kernel.update_rx_secret(),
            Kernel::Server(kernel) => kernel.update_rx_secret(),
        }
        .map_err(RecordError::KeyUpdate)
    }

    /// Whether this side takes session tickets: only a server sends them.
    fn takes_tickets(&self) -> bool {
        matches!(self, Kernel::Client(_))
    }

    /// Hands a NewSessionTicket's body to rustls's ticket store. Only a
    /// server sends tickets, so a server refuses one.
    fn session_ticket(&mut self, body: &[u8]) -> Result<(), RecordError> {
        match self {
            Kernel::Client(kernel) => kernel
                .handle_new_session_ticket(body)
                .map_err(RecordError::SessionTicket),
            Kernel::Server(_) => Err(RecordError::UnexpectedHandshake(NEW_SESSION_TICKET)),
        }
    }
}

/// One direction's AEAD, key bytes and IV, from its traffic secret; AES-GCM
/// only, as the provider's suites (`tls.rs`).
fn traffic_key(
    secrets: &ConnectionTrafficSecrets,
) -> Result<(&'static aead::Algorithm, &[u8], [u8; NONCE_LEN]), RecordError> {
    let (algorithm, key, iv) = match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
        _ => return Err(RecordError::UnsupportedSuite),
    };
    let iv = iv
        .as_ref()
        .try_into()
        .map_err(|_| RecordError::UnsupportedSuite)?;
    Ok((algorithm, key.as_ref(), iv))
}

/// The nonce of record `seq` under a key with `iv` (RFC 8446 §5.3): the
/// sequence number, big-endian and left-padded, XORed into the IV.
fn nonce(iv: &[u8; NONCE_LEN], seq: u64) -> aead::Nonce {
    let mut nonce = *iv;
    let seq_offset = NONCE_LEN - size_of::<u64>();
    for (byte, seq_byte) in nonce.iter_mut().skip(seq_offset).zip(seq.to_be_bytes()) {
        *byte ^= seq_byte;
    }
    aead::Nonce::assume_unique_for_key(nonce)
}

#[cfg(test)]
mod tests;
