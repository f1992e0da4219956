//! The receiving half of the record layer: the bytes read from the
//! transport, each record's header checked and its body opened in place
//! with the peer's traffic key (RFC 8446 §5), and what the records carry:
//! application data for the reader, alerts, and the handshake messages
//! that may follow the handshake (KeyUpdate, NewSessionTicket; §4.6).
//!
//! Anything else is fatal: whatever is in doubt is refused.

use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::task::{Context, Poll};

use aws_lc_rs::aead::{Aad, NONCE_LEN, TlsProtocolId, TlsRecordOpeningKey};
use rustls::{AlertDescription, ConnectionTrafficSecrets};
use tokio::io::{AsyncRead, ReadBuf};

use super::spare::{self, Spare};
use super::{
    ALERT, APPLICATION_DATA, HANDSHAKE, HEADER_LEN, KEY_UPDATE, Kernel, LEGACY_VERSION,
    MAX_CIPHERTEXT, MAX_PLAINTEXT, MAX_RECORD, NEW_SESSION_TICKET, RecordError, nonce, traffic_key,
};

/// The receive buffer: four of the largest records, so that one read from
/// the transport brings several, and the partial record left at the end of
/// a read, moved to the front before the next, is a small share of it.
const RECEIVE_BUFFER: usize = 4 * MAX_RECORD;

/// The longest handshake message body accepted: rustls's own bound on a
/// handshake message, so no session ticket rustls would take is refused.
const MAX_HANDSHAKE_MESSAGE: usize = 0xffff;

/// A handshake message's header: type and 24-bit length.
const HANDSHAKE_HEADER_LEN: usize = 4;

/// Empty records in a row tolerated (rustls's number): TLS allows empty
/// application data, but a stream of them is a peer making us spin.
const MAX_EMPTY_RECORDS: u8 = 32;

/// KeyUpdates tolerated between two application data records (rustls's
/// and BoringSSL's number): each costs a key derivation.
const MAX_KEY_UPDATES: u8 = 32;

/// NewSessionTickets tolerated between two application data records. A
/// server sends a few after the handshake (OpenSSL two by default); rustls
/// sets no bound, but each costs it a ticket to parse and store, so a
/// flood is refused as a KeyUpdate flood is.
const MAX_SESSION_TICKETS: u8 = 32;

/// Warning alerts (in TLS 1.3 only user_canceled) tolerated over the
/// connection's life (rustls's and BoringSSL's number).
const MAX_WARNING_ALERTS: u8 = 4;

/// Alert levels (RFC 8446 §6).
const WARNING: u8 = 1;
const FATAL: u8 = 2;

/// What opening the next record did.
pub(super) enum Opened {
    /// A record was taken: its plaintext, if any, waits for the reader,
    /// and a close_notify ended the stream.
    Record,
    /// A KeyUpdate asked us to update our own key.
    UpdateRequested,
    /// No whole record is buffered: read more.
    NeedMore,
}

/// The receiving half: the peer's key and the bytes read.
pub(super) struct Receiver {
    opener: Opener,
    /// Bytes read from the transport. `buf[start..end]` is not opened yet;
    /// `buf[plaintext]` is opened application data the reader has not
    /// taken. Taken from the thread's spare buffers when a read needs it,
    /// given back whenever nothing is buffered and the transport has
    /// nothing to read, so an idle stream holds none.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    plaintext: Range<usize>,
    /// The first fragments of a handshake message that continues in the
    /// next record; empty (and unallocated) almost always.
    handshake: Vec<u8>,
    /// Empty records received in a row.
    empty_records: u8,
    /// KeyUpdates and NewSessionTickets since the last application data.
    key_updates: u8,
    session_tickets: u8,
    /// Warning alerts received.
    warning_alerts: u8,
    /// close_notify came: the reader sees the end of the stream, and what
    /// follows is ignored (RFC 8446 §6.1).
    closed: bool,
}

impl Receiver {
    /// A receiver whose key comes from `secrets`, first opening record
    /// `seq`, with `received` the bytes read beyond the handshake.
    pub(super) fn new(
        secrets: &ConnectionTrafficSecrets,
        seq: u64,
        received: &[u8],
    ) -> Result<Receiver, RecordError> {
        let mut receiver = Receiver {
            opener: Opener::new(secrets, seq)?,
            buf: Vec::new(),
            start: 0,
            end: 0,
            plaintext: 0..0,
            handshake: Vec::new(),
            empty_records: 0,
            key_updates: 0,
            session_tickets: 0,
            warning_alerts: 0,
            closed: false,
        };
        if !received.is_empty() {
            receiver.take_buffer(received.len());
            if let Some(head) = receiver.buf.get_mut(..received.len()) {
                head.copy_from_slice(received);
                receiver.end = received.len();
            }
        }
        Ok(receiver)
    }

    /// Whether close_notify came.
    pub(super) fn is_closed(&self) -> bool {
        self.closed
    }

    /// Moves opened application data into `out`; false when there is none.
    pub(super) fn read_plaintext(&mut self, out: &mut ReadBuf<'_>) -> bool {
        let Some(plaintext) = self.buf.get(self.plaintext.clone()) else {
            return false;
        };
        let len = plaintext.len().min(out.remaining());
        match plaintext.get(..len) {
            Some(taken) if len > 0 => {
                out.put_slice(taken);
                self.plaintext.start += len;
                true
            }
            _ => false,
        }
    }

    /// Opens the next buffered record and acts on what it carries.
    pub(super) fn open_next(&mut self, kernel: &mut Kernel) -> Result<Opened, RecordError> {
        let unread = self.buf.get_mut(self.start..self.end).unwrap_or_default();
        let Some((header, sealed_len)) = checked_header(unread)? else {
            return Ok(Opened::NeedMore);
        };
        let record_len = HEADER_LEN + sealed_len;
        let Some(sealed) = unread.get_mut(HEADER_LEN..record_len) else {
            return Ok(Opened::NeedMore);
        };
        let inner = self.opener.open(header, sealed)?;
        // TLSInnerPlaintext (RFC 8446 §5.2, §5.4): the content, its type,
        // then zeros; the content at most 2^14 bytes.
        if inner.len() > MAX_PLAINTEXT + 1 {
            return Err(RecordError::RecordOverflow);
        }
        let content_len = inner
            .iter()
            .rposition(|&byte| byte != 0)
            .ok_or(RecordError::NoContentType)?;
        let inner_type = inner
            .get(content_len)
            .copied()
            .ok_or(RecordError::NoContentType)?;
        let content_start = self.start + HEADER_LEN;
        self.start += record_len;
        self.take_content(
            kernel,
            inner_type,
            content_start..content_start + content_len,
        )
    }

    /// Acts on the content of an opened record, `buf[content]`.
    fn take_content(
        &mut self,
        kernel: &mut Kernel,
        content_type: u8,
        content: Range<usize>,
    ) -> Result<Opened, RecordError> {
        if content_type != HANDSHAKE && !self.handshake.is_empty() {
            return Err(RecordError::Interleaved);
        }
        if content.is_empty() {
            // Only application data may be empty (RFC 8446 §5.1, §5.4).
            if content_type != APPLICATION_DATA {
                return Err(RecordError::Malformed("empty record"));
            }
            if self.empty_records >= MAX_EMPTY_RECORDS {
                return Err(RecordError::TooManyEmptyRecords);
            }
            self.empty_records += 1;
            return Ok(Opened::Record);
        }
        self.empty_records = 0;
        match content_type {
            APPLICATION_DATA => {
                self.plaintext = content;
                self.key_updates = 0;
                self.session_tickets = 0;
                Ok(Opened::Record)
            }
            ALERT => {
                let Some(&[level, description]) = self.buf.get(content) else {
                    return Err(RecordError::Malformed("alert"));
                };
                if level != WARNING && level != FATAL {
                    return Err(RecordError::IllegalParameter("alert level"));
                }
                // In TLS 1.3 the description decides, whatever the level
                // (RFC 8446 §6), except that a user_canceled sent as fatal
                // ends the stream, as rustls has it.
                match AlertDescription::from(description) {
                    AlertDescription::CloseNotify => {
                        // Nothing buffered is read any more.
                        self.closed = true;
                        self.release();
                    }
                    AlertDescription::UserCanceled if level == WARNING => {
                        if self.warning_alerts >= MAX_WARNING_ALERTS {
                            return Err(RecordError::TooManyWarningAlerts);
                        }
                        self.warning_alerts += 1;
                    }
                    other => return Err(RecordError::Alert(other)),
                }
                Ok(Opened::Record)
            }
            HANDSHAKE => self.take_handshake(kernel, content),
            other => Err(RecordError::UnexpectedContentType(other)),
        }
    }

    /// Adds a record's handshake fragment to what came before, and handles
    /// each whole message.
    fn take_handshake(
        &mut self,
        kernel: &mut Kernel,
        fragment: Range<usize>,
    ) -> Result<Opened, RecordError> {
        self.handshake
            .extend_from_slice(self.buf.get(fragment).unwrap_or_default());
        let mut opened = Opened::Record;
        let mut offset = 0;
        while let Some(&[message_type, len_high, len_mid, len_low]) =
            self.handshake.get(offset..offset + HANDSHAKE_HEADER_LEN)
        {
            let len = u32::from_be_bytes([0, len_high, len_mid, len_low]);
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            // The type and length are checked at the header, before a body
            // is waited for: no bytes are buffered for a message that will
            // be refused.
            Self::check_handshake_header(kernel, message_type, len)?;
            let body_start = offset + HANDSHAKE_HEADER_LEN;
            let Some(body) = self.handshake.get(body_start..body_start + len) else {
                break;
            };
            offset = body_start + len;
            match message_type {
                KEY_UPDATE => {
                    Self::count(
                        &mut self.key_updates,
                        MAX_KEY_UPDATES,
                        RecordError::TooManyKeyUpdates,
                    )?;
                    let requested = match body {
                        [0] => false,
                        [1] => true,
                        _ => return Err(RecordError::IllegalParameter("KeyUpdate request")),
                    };
                    // The next record is sealed with the new key, so
                    // nothing may follow in this one (RFC 8446 §5.1).
                    if offset != self.handshake.len() {
                        return Err(RecordError::Interleaved);
                    }
                    let (seq, secrets) = kernel.next_rx_secret()?;
                    self.opener = Opener::new(&secrets, seq)?;
                    if requested {
                        opened = Opened::UpdateRequested;
                    }
                }
                NEW_SESSION_TICKET => {
                    Self::count(
                        &mut self.session_tickets,
                        MAX_SESSION_TICKETS,
                        RecordError::TooManySessionTickets,
                    )?;
                    kernel.session_ticket(body)?;
                }
                other => return Err(RecordError::UnexpectedHandshake(other)),
            }
        }
        self.handshake.drain(..offset);
        if self.handshake.is_empty() {
            self.handshake = Vec::new();
        }
        Ok(opened)
    }

    /// Refuses a post-handshake message at its header: a type other than
    /// KeyUpdate and (to a client) NewSessionTicket, a KeyUpdate body that
    /// is not one byte, a message longer than rustls takes. Called again
    /// for a message whose body is still coming, so it counts nothing.
    fn check_handshake_header(
        kernel: &Kernel,
        message_type: u8,
        len: usize,
    ) -> Result<(), RecordError> {
        match message_type {
            KEY_UPDATE if len != 1 => Err(RecordError::Malformed("KeyUpdate")),
            KEY_UPDATE => Ok(()),
            NEW_SESSION_TICKET if kernel.takes_tickets() => {
                if len > MAX_HANDSHAKE_MESSAGE {
                    return Err(RecordError::HandshakeTooLong(len));
                }
                Ok(())
            }
            other => Err(RecordError::UnexpectedHandshake(other)),
        }
    }

    /// Counts one more KeyUpdate or NewSessionTicket since the last
    /// application data; past `max`, the peer is flooding: `error`.
    fn count(counter: &mut u8, max: u8, error: RecordError) -> Result<(), RecordError> {
        if *counter >= max {
            return Err(error);
        }
        *counter += 1;
        Ok(())
    }

    /// Reads more from `io` after the unopened bytes; `Ok(false)` at the
    /// end of the stream. Called only when no whole record is buffered and
    /// the reader has taken all plaintext.
    pub(super) fn poll_fill<IO: AsyncRead>(
        &mut self,
        io: Pin<&mut IO>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<bool>> {
        self.plaintext = 0..0;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        self.take_buffer(RECEIVE_BUFFER);
        if self.buf.len() - self.start < MAX_RECORD {
            // The partial record moves to the front, so that the whole
            // record fits after it.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let mut free = ReadBuf::new(self.buf.get_mut(self.end..).unwrap_or_default());
        match io.poll_read(cx, &mut free) {
            Poll::Ready(Ok(())) => {
                let read = free.filled().len();
                self.end += read;
                Poll::Ready(Ok(read > 0))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error)),
            Poll::Pending => {
                if self.start == self.end {
                    self.release();
                }
                Poll::Pending
            }
        }
    }

    /// The error for an end of stream before close_notify.
    pub(super) fn end_of_file(&self) -> RecordError {
        if self.start == self.end && self.handshake.is_empty() {
            RecordError::NoCloseNotify
        } else {
            RecordError::Truncated
        }
    }

    /// Gives the buffer back, with whatever it holds.
    fn release(&mut self) {
        spare::give(Spare::Receive, std::mem::take(&mut self.buf));
        self.start = 0;
        self.end = 0;
        self.plaintext = 0..0;
    }

    /// Makes sure the buffer is there and at least `len` long.
    fn take_buffer(&mut self, len: usize) {
        if self.buf.is_empty() {
            self.buf = spare::take(Spare::Receive);
        }
        if self.buf.len() < len {
            self.buf.resize(len, 0);
        }
    }

    /// The buffer's capacity, for tests of its memory.
    #[cfg(test)]
    pub(super) fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }
}

/// The header at the front of `unread`, if it is all there, and the length
/// of the sealed body after it: an encrypted TLS 1.3 record of at most the
/// longest ciphertext allowed (RFC 8446 §5.2).
fn checked_header(unread: &[u8]) -> Result<Option<([u8; HEADER_LEN], usize)>, RecordError> {
    let Some(&header) = unread.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let [
        content_type,
        version_major,
        version_minor,
        len_high,
        len_low,
    ] = header;
    if content_type != APPLICATION_DATA || [version_major, version_minor] != LEGACY_VERSION {
        return Err(RecordError::BadHeader {
            content_type,
            version: u16::from_be_bytes([version_major, version_minor]),
        });
    }
    let sealed_len = usize::from(u16::from_be_bytes([len_high, len_low]));
    if sealed_len > MAX_CIPHERTEXT {
        return Err(RecordError::RecordOverflow);
    }
    Ok(Some((header, sealed_len)))
}

/// The peer's traffic key, with the sequence number of the next record it
/// opens.
struct Opener {
    key: TlsRecordOpeningKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
}

impl Opener {
    fn new(secrets: &ConnectionTrafficSecrets, seq: u64) -> Result<Opener, RecordError> {
        let (algorithm, key, iv) = traffic_key(secrets)?;
        let key = TlsRecordOpeningKey::new(algorithm, TlsProtocolId::TLS13, key)
            .map_err(|_| RecordError::UnsupportedSuite)?;
        Ok(Opener { key, iv, seq })
    }

    /// Opens the record with `header` in place, and returns its
    /// TLSInnerPlaintext; the header is the additional data.
    fn open<'a>(
        &mut self,
        header: [u8; HEADER_LEN],
        sealed: &'a mut [u8],
    ) -> Result<&'a mut [u8], RecordError> {
        let inner = self
            .key
            .open_in_place(nonce(&self.iv, self.seq), Aad::from(header), sealed)
            .map_err(|_| RecordError::BadRecordMac)?;
        self.seq = self
            .seq
            .checked_add(1)
            .ok_or(RecordError::SequenceExhausted)?;
        Ok(inner)
    }
}
