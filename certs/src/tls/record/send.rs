//! The sending half of the record layer: our traffic key with its sequence
//! number and key updates, and the buffer of sealed records waiting for the
//! transport.
//!
//! Each record is sealed from the caller's slice straight into the buffer,
//! so a byte sent is read once, from where the caller holds it. The buffer
//! is one contiguous run of records, written with one `poll_write` as far
//! as the transport takes it, and kept only while it holds something.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use aws_lc_rs::aead::{Aad, NONCE_LEN, TlsProtocolId, TlsRecordSealingKey};
use rustls::{AlertDescription, ConnectionTrafficSecrets};
use tokio::io::AsyncWrite;

use super::spare::{self, Spare};
use super::{
    ALERT, APPLICATION_DATA, HANDSHAKE, HEADER_LEN, KEY_UPDATE, Kernel, LEGACY_VERSION,
    MAX_PLAINTEXT, MAX_RECORD, RecordError, nonce, traffic_key,
};

/// Sealed bytes queued for the transport beyond which no new plaintext is
/// taken, so that a slow peer holds the writer back. Each write to the
/// transport takes all that is queued, so this is also the largest write:
/// 256 KiB lets TCP build full 64 KiB packets. A stream's buffer grows to
/// at most this plus one record and the control records after it.
pub(super) const SEND_BUFFER: usize = 256 * 1024;

/// KeyUpdate(update_not_requested) (RFC 8446 §4.6.3): type, 24-bit length,
/// request_update 0.
const KEY_UPDATE_NOT_REQUESTED: [u8; 5] = [KEY_UPDATE, 0, 0, 1, 0];

/// close_notify (RFC 8446 §6.1): level warning, description 0.
const CLOSE_NOTIFY: [u8; 2] = [1, 0];

/// The level of error alerts (RFC 8446 §6).
const FATAL: u8 = 2;

/// The sending half: the key and the queued records.
pub(super) struct Sender {
    sealer: Sealer,
    queue: Queue,
}

impl Sender {
    /// A sender whose key comes from `secrets`, first sealing record `seq`,
    /// which may seal `limit` records before it is updated.
    pub(super) fn new(
        secrets: &ConnectionTrafficSecrets,
        seq: u64,
        limit: u64,
    ) -> Result<Sender, RecordError> {
        Ok(Sender {
            sealer: Sealer::new(secrets, seq, limit)?,
            queue: Queue::default(),
        })
    }

    /// Whether new plaintext may be sealed: the queue is below its limit.
    pub(super) fn has_room(&self) -> bool {
        self.queue.queued() < SEND_BUFFER
    }

    /// Notes that the peer asked us to update our key: the update goes out
    /// before our next record. Several requests before it make one update,
    /// as RFC 8446 §4.6.3 allows.
    pub(super) fn owe_update(&mut self) {
        self.sealer.update_owed = true;
    }

    /// Seals as much of `bufs` as the queue takes, each slice cut into
    /// records of its own, and returns how many bytes that was.
    pub(super) fn seal_application_data(
        &mut self,
        kernel: &mut Kernel,
        bufs: &[IoSlice<'_>],
    ) -> Result<usize, RecordError> {
        let mut taken = 0;
        for chunk in bufs.iter().flat_map(|buf| buf.chunks(MAX_PLAINTEXT)) {
            if !self.has_room() {
                break;
            }
            self.seal(kernel, APPLICATION_DATA, chunk)?;
            taken += chunk.len();
        }
        Ok(taken)
    }

    /// Queues close_notify, whatever the queue holds: it is small, and
    /// comes once.
    pub(super) fn seal_close_notify(&mut self, kernel: &mut Kernel) -> Result<(), RecordError> {
        self.seal(kernel, ALERT, &CLOSE_NOTIFY)
    }

    /// Queues a fatal alert, after whatever the queue holds.
    pub(super) fn seal_alert(
        &mut self,
        kernel: &mut Kernel,
        description: AlertDescription,
    ) -> Result<(), RecordError> {
        self.seal(kernel, ALERT, &[FATAL, u8::from(description)])
    }

    /// Writes queued records to `io` until none is left or it would block.
    pub(super) fn poll_drain<IO: AsyncWrite>(
        &mut self,
        io: Pin<&mut IO>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        self.queue.poll_drain(io, cx)
    }

    /// Queues one record, first updating the key when it is due.
    fn seal(
        &mut self,
        kernel: &mut Kernel,
        content_type: u8,
        content: &[u8],
    ) -> Result<(), RecordError> {
        if self.sealer.update_due() {
            // The KeyUpdate is the old key's last record; rustls hands out
            // the next secret with sequence number 0.
            self.seal_with_current_key(HANDSHAKE, &KEY_UPDATE_NOT_REQUESTED)?;
            let (seq, secrets) = kernel.next_tx_secret()?;
            self.sealer = Sealer::new(&secrets, seq, self.sealer.limit)?;
        }
        self.seal_with_current_key(content_type, content)
    }

    /// Queues one record sealed with the current key.
    fn seal_with_current_key(
        &mut self,
        content_type: u8,
        content: &[u8],
    ) -> Result<(), RecordError> {
        let len = self.sealer.record_len(content.len());
        self.sealer
            .seal(content_type, content, self.queue.slot(len)?)?;
        self.queue.commit(len);
        Ok(())
    }

    /// Lowers the records a key may seal, so that tests cross the limit
    /// in a few MiB.
    #[cfg(test)]
    pub(super) fn set_limit(&mut self, limit: u64) {
        self.sealer.limit = limit;
    }

    /// The queue's buffer, for tests of its memory.
    #[cfg(test)]
    pub(super) fn buffer_capacity(&self) -> usize {
        self.queue.buf.capacity()
    }
}

/// Our traffic key, with the sequence number of the next record it seals.
struct Sealer {
    /// aws-lc's TLS 1.3 record key: it refuses a nonce not above the last
    /// one it sealed, so a sequence number is never used twice.
    key: TlsRecordSealingKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
    /// Records one key may seal (the suite's confidentiality limit).
    limit: u64,
    /// A key update must come before the next record: the peer asked for
    /// one, or this key's first sequence number is not 0 (a server that
    /// sent session tickets). aws-lc's nonce check takes the first nonce a
    /// key seals as sequence number 0, so a key that starts later sends
    /// only its KeyUpdate.
    update_owed: bool,
}

impl Sealer {
    fn new(
        secrets: &ConnectionTrafficSecrets,
        seq: u64,
        limit: u64,
    ) -> Result<Sealer, RecordError> {
        let (algorithm, key, iv) = traffic_key(secrets)?;
        let key = TlsRecordSealingKey::new(algorithm, TlsProtocolId::TLS13, key)
            .map_err(|_| RecordError::UnsupportedSuite)?;
        Ok(Sealer {
            key,
            iv,
            seq,
            limit,
            update_owed: seq != 0,
        })
    }

    /// Whether the key must be updated before the next record: owed, or
    /// the next record would leave no room for the KeyUpdate below the
    /// limit.
    fn update_due(&self) -> bool {
        self.update_owed || self.seq.saturating_add(2) > self.limit
    }

    /// A record's length on the wire for `content_len` bytes of content:
    /// header, content, content type, tag.
    fn record_len(&self, content_len: usize) -> usize {
        HEADER_LEN + content_len + 1 + self.key.algorithm().tag_len()
    }

    /// Seals `content` of `content_type` as the next record into `record`,
    /// which is exactly [`Sealer::record_len`] long.
    fn seal(
        &mut self,
        content_type: u8,
        content: &[u8],
        record: &mut [u8],
    ) -> Result<(), RecordError> {
        let sealed_len = record
            .len()
            .checked_sub(HEADER_LEN)
            .and_then(|len| u16::try_from(len).ok())
            .ok_or(RecordError::Seal)?;
        let [len_high, len_low] = sealed_len.to_be_bytes();
        let [version_major, version_minor] = LEGACY_VERSION;
        let header = [
            APPLICATION_DATA,
            version_major,
            version_minor,
            len_high,
            len_low,
        ];
        let (header_out, sealed) = record
            .split_at_mut_checked(HEADER_LEN)
            .ok_or(RecordError::Seal)?;
        header_out.copy_from_slice(&header);
        let (ciphertext, type_and_tag) = sealed
            .split_at_mut_checked(content.len())
            .ok_or(RecordError::Seal)?;
        // TLSInnerPlaintext (RFC 8446 §5.2): the content, then its type,
        // no padding; the header is the additional data.
        self.key
            .seal_out_of_place_scatter(
                nonce(&self.iv, self.seq),
                Aad::from(header),
                content,
                ciphertext,
                &[content_type],
                type_and_tag,
            )
            .map_err(|_| RecordError::Seal)?;
        self.seq = self
            .seq
            .checked_add(1)
            .ok_or(RecordError::SequenceExhausted)?;
        Ok(())
    }
}

/// Sealed records waiting for the transport: `buf[written..filled]`.
///
/// `buf`'s length is how much of it was ever written (and so is
/// initialized); records are sealed over old bytes, never over a fresh
/// fill of zeros. It comes from the thread's spare buffers when the first
/// record is queued and goes back when the last one is written, so an idle
/// stream holds none.
#[derive(Default)]
struct Queue {
    buf: Vec<u8>,
    filled: usize,
    written: usize,
}

impl Queue {
    /// Bytes sealed and not yet written.
    fn queued(&self) -> usize {
        self.filled - self.written
    }

    /// The `len` bytes after the queued records, to seal the next record
    /// into: written bytes are moved out of the way, or the buffer grown.
    fn slot(&mut self, len: usize) -> Result<&mut [u8], RecordError> {
        let needed = self.filled + len;
        if needed > self.buf.len() && self.written > 0 {
            // Only when the transport is slower than the writer: the copy
            // is no more than what is queued, and the socket is the wait.
            self.buf.copy_within(self.written..self.filled, 0);
            self.filled -= self.written;
            self.written = 0;
        }
        if self.buf.is_empty() {
            self.buf = spare::take(Spare::Send);
        }
        let needed = self.filled + len;
        if needed > self.buf.len() {
            // Doubling keeps the zero fills to a few per buffer's life.
            let grown = (self.buf.len() * 2).clamp(MAX_RECORD, SEND_BUFFER + MAX_RECORD);
            self.buf.resize(needed.max(grown), 0);
        }
        self.buf
            .get_mut(self.filled..needed)
            .ok_or(RecordError::Seal)
    }

    /// Adds the `len` bytes of the last slot to the queue.
    fn commit(&mut self, len: usize) {
        self.filled += len;
    }

    /// Writes the queue to `io` until it is empty, then gives the buffer
    /// back.
    fn poll_drain<IO: AsyncWrite>(
        &mut self,
        mut io: Pin<&mut IO>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while let Some(pending) = self.buf.get(self.written..self.filled)
            && !pending.is_empty()
        {
            match io.as_mut().poll_write(cx, pending) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(written)) => {
                    self.written = self.written.saturating_add(written).min(self.filled);
                }
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.filled = 0;
        self.written = 0;
        spare::give(Spare::Send, std::mem::take(&mut self.buf));
        Poll::Ready(Ok(()))
    }
}
