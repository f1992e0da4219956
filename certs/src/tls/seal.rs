//! TLS 1.3 record sealing for the provider's two AES-GCM suites.
//!
//! The suites are aws-lc-rs's own with one part replaced: the record
//! encrypter. rustls's encrypter copies each record's plaintext into the
//! record's buffer and encrypts it there, so every byte sent is read twice;
//! ours encrypts the plaintext from where the caller holds it straight into
//! the record's buffer. The ciphertext is the same, byte for byte. Key
//! schedule, decryption, secret extraction and QUIC stay aws-lc-rs's.
//!
//! Assembling the provider from these suites is `tls.rs`'s.

use std::iter;

use aws_lc_rs::aead::{self, Aad, TlsProtocolId, TlsRecordSealingKey};
use rustls::crypto::aws_lc_rs::cipher_suite;
use rustls::crypto::cipher::{
    AeadKey, Iv, MessageDecrypter, MessageEncrypter, Nonce, OutboundChunks, OutboundOpaqueMessage,
    OutboundPlainMessage, PrefixedPayload, Tls13AeadAlgorithm, UnsupportedOperationError,
    make_tls13_aad,
};
use rustls::{
    CipherSuiteCommon, ConnectionTrafficSecrets, ContentType, Error, ProtocolVersion,
    SupportedCipherSuite, Tls13CipherSuite,
};

/// TLS_AES_256_GCM_SHA384 with the out-of-place record encrypter.
pub(crate) static TLS13_AES_256_GCM_SHA384: SupportedCipherSuite =
    SupportedCipherSuite::Tls13(&AES_256_GCM_SHA384);

/// TLS_AES_128_GCM_SHA256 with the out-of-place record encrypter.
pub(crate) static TLS13_AES_128_GCM_SHA256: SupportedCipherSuite =
    SupportedCipherSuite::Tls13(&AES_128_GCM_SHA256);

static AES_256_GCM_SHA384: Tls13CipherSuite =
    with_aead(tls13(cipher_suite::TLS13_AES_256_GCM_SHA384), &AES_256_GCM);

static AES_128_GCM_SHA256: Tls13CipherSuite =
    with_aead(tls13(cipher_suite::TLS13_AES_128_GCM_SHA256), &AES_128_GCM);

static AES_256_GCM: OutOfPlaceGcm = OutOfPlaceGcm {
    algorithm: &aead::AES_256_GCM,
    stock: tls13(cipher_suite::TLS13_AES_256_GCM_SHA384).aead_alg,
};

static AES_128_GCM: OutOfPlaceGcm = OutOfPlaceGcm {
    algorithm: &aead::AES_128_GCM,
    stock: tls13(cipher_suite::TLS13_AES_128_GCM_SHA256).aead_alg,
};

/// The TLS 1.3 suite inside one of rustls's `SupportedCipherSuite`s.
// Evaluated only in the statics above, at compile time: the panic is a
// build error if a TLS 1.2 suite is ever named here, never a runtime one.
#[allow(clippy::panic)]
const fn tls13(suite: SupportedCipherSuite) -> &'static Tls13CipherSuite {
    match suite.tls13() {
        Some(suite) => suite,
        None => panic!("not a TLS 1.3 cipher suite"),
    }
}

/// `stock` with its AEAD replaced by `aead_alg`, every other part shared.
const fn with_aead(
    stock: &'static Tls13CipherSuite,
    aead_alg: &'static dyn Tls13AeadAlgorithm,
) -> Tls13CipherSuite {
    Tls13CipherSuite {
        common: CipherSuiteCommon {
            suite: stock.common.suite,
            hash_provider: stock.common.hash_provider,
            confidentiality_limit: stock.common.confidentiality_limit,
        },
        hkdf_provider: stock.hkdf_provider,
        aead_alg,
        quic: stock.quic,
    }
}

/// An AES-GCM TLS 1.3 AEAD whose encrypter seals out of place; all else is
/// aws-lc-rs's AEAD for the same algorithm.
struct OutOfPlaceGcm {
    /// The AEAD our encrypter's key is made for.
    algorithm: &'static aead::Algorithm,
    /// aws-lc-rs's AEAD for the same algorithm, which decrypts, reports key
    /// length and FIPS status, and extracts secrets.
    stock: &'static dyn Tls13AeadAlgorithm,
}

impl Tls13AeadAlgorithm for OutOfPlaceGcm {
    fn encrypter(&self, key: AeadKey, iv: Iv) -> Box<dyn MessageEncrypter> {
        match OutOfPlaceEncrypter::new(self.algorithm, key.as_ref(), iv) {
            Ok(encrypter) => Box::new(encrypter),
            Err(_) => Box::new(RefusingEncrypter {
                tag_len: self.algorithm.tag_len(),
            }),
        }
    }

    fn decrypter(&self, key: AeadKey, iv: Iv) -> Box<dyn MessageDecrypter> {
        self.stock.decrypter(key, iv)
    }

    fn key_len(&self) -> usize {
        self.stock.key_len()
    }

    fn extract_keys(
        &self,
        key: AeadKey,
        iv: Iv,
    ) -> Result<ConnectionTrafficSecrets, UnsupportedOperationError> {
        self.stock.extract_keys(key, iv)
    }

    fn fips(&self) -> bool {
        self.stock.fips()
    }
}

/// Seals TLS 1.3 records, encrypting a plaintext that lies in one buffer
/// from there into the record.
///
/// The key is aws-lc-rs's TLS record key, which refuses a nonce whose
/// sequence number is not above the last one it sealed: a reused or earlier
/// sequence number fails the record instead of repeating a nonce. Its count
/// starts at the first record sealed, which rustls numbers 0 under every
/// new key (after the handshake and after each key update), and each key
/// update brings a new encrypter with a new count.
struct OutOfPlaceEncrypter {
    /// The traffic key, with its nonce check.
    key: TlsRecordSealingKey,
    /// The traffic IV, XORed with the sequence number for each nonce.
    iv: Iv,
}

impl OutOfPlaceEncrypter {
    /// An encrypter for the traffic key `key` of `algorithm`; fails when
    /// `key` is not that algorithm's key length.
    fn new(
        algorithm: &'static aead::Algorithm,
        key: &[u8],
        iv: Iv,
    ) -> Result<OutOfPlaceEncrypter, aws_lc_rs::error::Unspecified> {
        let key = TlsRecordSealingKey::new(algorithm, TlsProtocolId::TLS13, key)?;
        Ok(OutOfPlaceEncrypter { key, iv })
    }
}

impl MessageEncrypter for OutOfPlaceEncrypter {
    fn encrypt(
        &mut self,
        msg: OutboundPlainMessage<'_>,
        seq: u64,
    ) -> Result<OutboundOpaqueMessage, Error> {
        // TLSInnerPlaintext (RFC 8446 §5.2): the content, then its type.
        let content_type = [u8::from(msg.typ)];
        let record_len = self.encrypted_payload_len(msg.payload.len());
        let nonce = aead::Nonce::assume_unique_for_key(Nonce::new(&self.iv, seq).0);
        let aad = Aad::from(make_tls13_aad(record_len));
        let mut record = PrefixedPayload::with_capacity(record_len);

        let sealed = match contiguous(&msg.payload) {
            Some(plaintext) => {
                // The only way rustls lets a record's bytes be written is to
                // append them; zeros compile to a fill, which is cheaper
                // than copying the plaintext in.
                record.extend(iter::repeat_n(&0, record_len));
                match record.as_mut().split_at_mut_checked(plaintext.len()) {
                    Some((ciphertext, type_and_tag)) => self.key.seal_out_of_place_scatter(
                        nonce,
                        aad,
                        plaintext,
                        ciphertext,
                        &content_type,
                        type_and_tag,
                    ),
                    None => return Err(Error::EncryptError),
                }
            }
            // Records that span the caller's buffers are copied together and
            // sealed in place, with the same key and so the same nonce count.
            None => {
                record.extend_from_chunks(&msg.payload);
                record.extend_from_slice(&content_type);
                self.key.seal_in_place_append_tag(nonce, aad, &mut record)
            }
        };
        sealed.map_err(|_| Error::EncryptError)?;

        // TLS 1.3 records all carry application data and TLS 1.2 as their
        // outer type and version (RFC 8446 §5.1, §5.2).
        Ok(OutboundOpaqueMessage::new(
            ContentType::ApplicationData,
            ProtocolVersion::TLSv1_2,
            record,
        ))
    }

    fn encrypted_payload_len(&self, payload_len: usize) -> usize {
        payload_len + 1 + self.key.algorithm().tag_len()
    }
}

/// Stands in for an encrypter whose key aws-lc-rs refused, which happens
/// only if rustls hands over a key of the wrong length: every record fails,
/// and the connection with it.
struct RefusingEncrypter {
    /// The AEAD's tag length, for the record length rustls asks for.
    tag_len: usize,
}

impl MessageEncrypter for RefusingEncrypter {
    fn encrypt(
        &mut self,
        _msg: OutboundPlainMessage<'_>,
        _seq: u64,
    ) -> Result<OutboundOpaqueMessage, Error> {
        Err(Error::EncryptError)
    }

    fn encrypted_payload_len(&self, payload_len: usize) -> usize {
        payload_len + 1 + self.tag_len
    }
}

/// The record's plaintext as one slice, when it lies within one of the
/// caller's buffers. rustls cuts a vectored write (h2's frame header, then
/// its payload) into records at fixed offsets, so most records of a large
/// frame lie inside the payload even though they come as `Multiple`.
fn contiguous<'a>(payload: &OutboundChunks<'a>) -> Option<&'a [u8]> {
    match *payload {
        OutboundChunks::Single(chunk) => Some(chunk),
        OutboundChunks::Multiple { chunks, start, end } => {
            // `start` and `end` count from the first chunk's first byte.
            let mut chunk_start = 0;
            for chunk in chunks {
                let chunk_end = chunk_start + chunk.len();
                if start >= chunk_start && end <= chunk_end {
                    return chunk.get(start - chunk_start..end - chunk_start);
                }
                if start < chunk_end {
                    // Starts in this chunk and ends past it.
                    return None;
                }
                chunk_start = chunk_end;
            }
            None
        }
    }
}

#[cfg(test)]
mod tests;
