//! A recorded TLS 1.3 session for the record-layer targets (`tls_record`,
//! `tls_record_differential`): what a server sent during one handshake,
//! replayed to any number of clients that all end up with the same keys,
//! and records sealed from fuzzer input with the server's sending key.
//!
//! The clients are deterministic (a fixed random and a fixed X25519 key),
//! so each sends the ClientHello the recording was made with, and the
//! server's flight completes each one's handshake with the traffic secrets
//! of the recording. Our record layer (`connect`) and a stock rustls
//! `ClientConnection` then read the same sealed bytes.

use std::io::{self, Read};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use aws_lc_rs::aead::{Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::agreement::{self, PrivateKey, UnparsedPublicKey, X25519};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{
    ActiveKeyExchange, CryptoProvider, GetRandomFailed, SecureRandom, SharedSecret,
    SupportedKxGroup,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    ClientConfig, ClientConnection, ConnectionTrafficSecrets, DigitallySignedStruct, NamedGroup,
    ServerConfig, ServerConnection, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use ztunnel_certs::tls::record::connect;

/// The most plaintext one record carries (RFC 8446 §5.1).
pub const MAX_PLAINTEXT: usize = 1 << 14;

/// The longest ciphertext of a TLS 1.3 record (RFC 8446 §5.2).
const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;

/// Content types (RFC 8446 §5.1).
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;

/// Reads of the stream beyond which a reader that has not ended is stuck:
/// far more than the records an input of libFuzzer's length can hold.
const MAX_READS: usize = 1 << 20;

/// One recorded handshake: the client config every replay uses, what the
/// server sent, and the server's sending key after it.
pub struct Session {
    /// Deterministic, with ring's AES-GCM suites: the stock reader opens
    /// records with ring, ours with aws-lc-rs.
    pub config: Arc<ClientConfig>,
    /// The server's flight, ServerHello to Finished.
    pub flight: Vec<u8>,
    /// The server's application traffic key and its first sequence number.
    key: (u64, ConnectionTrafficSecrets),
}

/// The session every input of a process replays, recorded once.
pub fn session() -> &'static Session {
    static SESSION: OnceLock<Session> = OnceLock::new();
    SESSION.get_or_init(record_session)
}

fn record_session() -> Session {
    let config = Arc::new(client_config());
    let mut client = ClientConnection::new(Arc::clone(&config), server_name()).unwrap();
    let mut server = ServerConnection::new(Arc::new(server_config())).unwrap();
    let mut flight = Vec::new();
    for _ in 0..16 {
        if !client.is_handshaking() && !server.is_handshaking() {
            break;
        }
        let mut to_server = Vec::new();
        client.write_tls(&mut to_server).unwrap();
        feed(&mut server, &to_server);
        server.process_new_packets().unwrap();
        let start = flight.len();
        server.write_tls(&mut flight).unwrap();
        feed(&mut client, &flight[start..]);
        client.process_new_packets().unwrap();
    }
    assert!(!client.is_handshaking() && !server.is_handshaking());
    let key = server.dangerous_extract_secrets().unwrap().tx;
    let session = Session {
        config,
        flight,
        key,
    };
    // A second client must complete on the recording alone, else the
    // replay is not deterministic and every input would test nothing.
    let replay = stock_client(&session);
    assert!(!replay.is_handshaking(), "the replayed handshake completes");
    session
}

/// Hands all of `bytes` to `connection`.
fn feed<C: std::ops::DerefMut<Target = rustls::ConnectionCommon<D>>, D>(
    connection: &mut C,
    mut bytes: &[u8],
) {
    while !bytes.is_empty() {
        if connection.read_tls(&mut bytes).unwrap() == 0 {
            break;
        }
    }
}

fn server_name() -> ServerName<'static> {
    ServerName::try_from("fuzz.example").unwrap()
}

fn client_config() -> ClientConfig {
    let ring = rustls::crypto::ring::default_provider();
    let provider = CryptoProvider {
        cipher_suites: vec![
            rustls::crypto::ring::cipher_suite::TLS13_AES_256_GCM_SHA384,
            rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256,
        ],
        kx_groups: vec![&FixedX25519],
        secure_random: &FixedRandom,
        ..ring
    };
    let mut config = ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer))
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    config.enable_secret_extraction = true;
    config
}

fn server_config() -> ServerConfig {
    let certified = rcgen::generate_simple_self_signed(vec!["fuzz.example".to_owned()]).unwrap();
    let cert = CertificateDer::from(certified.cert.der().to_vec());
    let key = PrivateKeyDer::try_from(certified.signing_key.serialize_der()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    // Tickets are the input's to send.
    config.send_tls13_tickets = 0;
    config.enable_secret_extraction = true;
    config
}

/// A random source that always gives the same bytes: the client random and
/// session id of every replay are the recording's.
#[derive(Debug)]
struct FixedRandom;

impl SecureRandom for FixedRandom {
    fn fill(&self, buf: &mut [u8]) -> Result<(), GetRandomFailed> {
        buf.fill(0x5a);
        Ok(())
    }
}

/// X25519 with one fixed private key: every replay sends the recording's
/// key share and derives its shared secret.
#[derive(Debug)]
struct FixedX25519;

impl SupportedKxGroup for FixedX25519 {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, rustls::Error> {
        let private = PrivateKey::from_private_key(&X25519, &[7; 32])
            .map_err(|_| rustls::Error::General("x25519 key".into()))?;
        let public = private
            .compute_public_key()
            .map_err(|_| rustls::Error::General("x25519 public key".into()))?
            .as_ref()
            .to_vec();
        Ok(Box::new(FixedShare { private, public }))
    }

    fn name(&self) -> NamedGroup {
        NamedGroup::X25519
    }
}

struct FixedShare {
    private: PrivateKey,
    public: Vec<u8>,
}

impl ActiveKeyExchange for FixedShare {
    fn complete(self: Box<Self>, peer: &[u8]) -> Result<SharedSecret, rustls::Error> {
        agreement::agree(
            &self.private,
            UnparsedPublicKey::new(&X25519, peer),
            rustls::Error::General("x25519 agreement".into()),
            |secret| Ok(SharedSecret::from(secret)),
        )
    }

    fn pub_key(&self) -> &[u8] {
        &self.public
    }

    fn group(&self) -> NamedGroup {
        NamedGroup::X25519
    }
}

/// Accepts any server: the session is the fuzzer's own.
#[derive(Debug)]
struct AnyServer;

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![
            SignatureScheme::ECDSA_NISTP256_SHA256,
            SignatureScheme::ECDSA_NISTP384_SHA384,
            SignatureScheme::ED25519,
            SignatureScheme::RSA_PSS_SHA256,
        ]
    }
}

/// Records sealed with the server's key from fuzzer input, and where each
/// one ends in `bytes`.
pub struct Sealed {
    /// The records, back to back; the last may be cut short.
    pub bytes: Vec<u8>,
    /// The end of each record in `bytes`.
    pub ends: Vec<usize>,
    /// The content of every application data record sealed, in order: what
    /// a reader may deliver, up to the first record it refuses.
    pub application_data: Vec<u8>,
    /// The stream ends before something whose header came is whole: a
    /// record cut short whose header gives a ciphertext longer than TLS 1.3
    /// allows (2^14 + 256, RFC 8446 §5.2), or a handshake message whose
    /// body never comes. We refuse either at its header when it is wrong;
    /// rustls checks only whole records (taking headers up to TLS 1.2's
    /// 2^14 + 2048) and whole messages, so it sees only the end.
    pub ends_in_refusable_header: bool,
    /// A whole record of handshake type carries no content (padding at
    /// most), which RFC 8446 §5.1 forbids sending: we refuse it
    /// (decode_error), rustls skips it.
    pub empty_handshake_record: bool,
}

/// Seals the records `input` describes, each as `[op][len: u16][pad]` and
/// then its content:
/// - `op & 7`: the inner content type: 0–3 application data, 4 alert,
///   5 handshake, 6 none (content and padding only), 7 the content's
///   first byte;
/// - `op & 0x08`: the content is the input's next byte, `len` times
///   (records at the size limit from a short input), else the next `len`
///   bytes, or as many as there are;
/// - `op & 0x10`: one bit of the sealed record flipped;
/// - `op & 0x20`: the record is cut in half and the stream ends.
///
/// `len` is taken modulo 2^14 + 2, so one byte over the limit is reached;
/// `pad` zeros follow the content type.
pub fn seal(mut input: &[u8]) -> Sealed {
    let (seq, secrets) = &session().key;
    let (key, iv) = sealing_key(secrets);
    let mut seq = *seq;
    let mut sealed = Sealed {
        bytes: Vec::new(),
        ends: Vec::new(),
        application_data: Vec::new(),
        ends_in_refusable_header: false,
        empty_handshake_record: false,
    };
    // Handshake bytes of whole records not yet a whole message.
    let mut handshake = Vec::new();
    while let [op, len_high, len_low, pad, rest @ ..] = input {
        let len = usize::from(u16::from_be_bytes([*len_high, *len_low])) % (MAX_PLAINTEXT + 2);
        let (mut content, rest) = if op & 0x08 != 0 {
            let (&byte, rest) = rest.split_first().unwrap_or((&0, &[]));
            (vec![byte; len], rest)
        } else {
            let (content, rest) = rest.split_at(len.min(rest.len()));
            (content.to_vec(), rest)
        };
        input = rest;
        match op & 7 {
            0..=3 => content.push(APPLICATION_DATA),
            4 => content.push(ALERT),
            5 => content.push(HANDSHAKE),
            6 => {}
            _ => {
                let inner_type = content.first().copied().unwrap_or(0);
                content.push(inner_type);
            }
        }
        content.resize(content.len() + usize::from(*pad), 0);
        // The type is the last byte that is not zero (RFC 8446 §5.4).
        if let Some(type_at) = content.iter().rposition(|&byte| byte != 0) {
            match content[type_at] {
                APPLICATION_DATA => sealed
                    .application_data
                    .extend_from_slice(&content[..type_at]),
                HANDSHAKE if op & 0x30 == 0 => {
                    sealed.empty_handshake_record |= type_at == 0;
                    handshake.extend_from_slice(&content[..type_at]);
                    drain_messages(&mut handshake);
                }
                _ => {}
            }
        }
        let tagged_len = content.len() + key.algorithm().tag_len();
        let [high, low] = u16::try_from(tagged_len).unwrap_or(u16::MAX).to_be_bytes();
        let header = [APPLICATION_DATA, 3, 3, high, low];
        key.seal_in_place_append_tag(nonce(&iv, seq), Aad::from(header), &mut content)
            .unwrap();
        seq += 1;
        if op & 0x10 != 0 {
            let at = usize::from(*pad) % content.len();
            content[at] ^= 1 << (op >> 5);
        }
        sealed.bytes.extend_from_slice(&header);
        if op & 0x20 != 0 {
            sealed.ends_in_refusable_header = tagged_len > MAX_CIPHERTEXT;
            sealed
                .bytes
                .extend_from_slice(&content[..content.len() / 2]);
            sealed.ends.push(sealed.bytes.len());
            break;
        }
        sealed.bytes.extend_from_slice(&content);
        sealed.ends.push(sealed.bytes.len());
    }
    if !handshake.is_empty() {
        sealed.ends_in_refusable_header = true;
    }
    sealed
}

/// Takes the whole handshake messages (type, 24-bit length, body) off the
/// front of `handshake`.
fn drain_messages(handshake: &mut Vec<u8>) {
    while let [_, high, mid, low, ..] = handshake[..] {
        let end = 4 + usize::from(u16::from_be_bytes([high, mid])) * 256 + usize::from(low);
        if end > handshake.len() {
            return;
        }
        handshake.drain(..end);
    }
}

fn sealing_key(secrets: &ConnectionTrafficSecrets) -> (LessSafeKey, [u8; NONCE_LEN]) {
    let (algorithm, key, iv) = match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aws_lc_rs::aead::AES_128_GCM, key, iv),
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aws_lc_rs::aead::AES_256_GCM, key, iv),
        _ => panic!("the session negotiated AES-GCM"),
    };
    let key = LessSafeKey::new(UnboundKey::new(algorithm, key.as_ref()).unwrap());
    (key, iv.as_ref().try_into().unwrap())
}

/// The nonce of record `seq` (RFC 8446 §5.3).
fn nonce(iv: &[u8; NONCE_LEN], seq: u64) -> Nonce {
    let mut nonce = *iv;
    for (byte, seq_byte) in nonce[NONCE_LEN - 8..].iter_mut().zip(seq.to_be_bytes()) {
        *byte ^= seq_byte;
    }
    Nonce::assume_unique_for_key(nonce)
}

/// How a reader's stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// close_notify came.
    Closed,
    /// The transport ended without close_notify (or in a record).
    Eof,
    /// The reader refused what came; the error's text.
    Failed(String),
}

/// What a reader made of the stream: the plaintext, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The application data read, in order.
    pub plaintext: Vec<u8>,
    /// How the stream ended.
    pub end: End,
}

/// Our client: the handshake replayed, then `stream` read to its end
/// through a transport whose reads return at most `chunk` bytes (0: as
/// many as asked for). Asserts that a failed stream stays failed.
pub fn read_ours(stream: &[u8], chunk: usize) -> Outcome {
    let session = session();
    let incoming = [session.flight.as_slice(), stream].concat();
    let transport = Replay {
        incoming,
        at: 0,
        chunk,
    };
    runtime().block_on(async {
        let (mut ours, _) = connect(Arc::clone(&session.config), server_name(), transport)
            .await
            .expect("the replayed handshake completes");
        let mut plaintext = Vec::new();
        let mut buf = vec![0; 3 * MAX_PLAINTEXT / 2];
        for _ in 0..MAX_READS {
            match ours.read(&mut buf).await {
                Ok(0) => {
                    return Outcome {
                        plaintext,
                        end: End::Closed,
                    };
                }
                Ok(read) => plaintext.extend_from_slice(&buf[..read]),
                Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
                    return Outcome {
                        plaintext,
                        end: End::Eof,
                    };
                }
                Err(error) => {
                    let again = ours.read(&mut buf).await.expect_err("a failure is final");
                    assert_eq!(again.kind(), error.kind());
                    return Outcome {
                        plaintext,
                        end: End::Failed(error.to_string()),
                    };
                }
            }
        }
        panic!("the stream never ended");
    })
}

/// A stock rustls client with the recording's handshake, given `stream`
/// one record (as `ends` cuts it) at a time, then the end of the
/// transport.
pub fn read_stock(stream: &[u8], ends: &[usize]) -> Outcome {
    let mut client = stock_client(session());
    let mut plaintext = Vec::new();
    let mut start = 0;
    for &end in ends {
        feed(&mut client, &stream[start..end]);
        start = end;
        if let Err(error) = client.process_new_packets() {
            return Outcome {
                plaintext,
                end: End::Failed(error.to_string()),
            };
        }
        if let Some(end) = drain(&mut client, &mut plaintext) {
            return Outcome { plaintext, end };
        }
    }
    // The transport's end.
    let _ = client.read_tls(&mut io::empty());
    if let Err(error) = client.process_new_packets() {
        return Outcome {
            plaintext,
            end: End::Failed(error.to_string()),
        };
    }
    let end = drain(&mut client, &mut plaintext).unwrap_or(End::Eof);
    Outcome { plaintext, end }
}

/// Moves the stock client's plaintext into `plaintext`; the end of the
/// stream, if the client has seen it.
fn drain(client: &mut ClientConnection, plaintext: &mut Vec<u8>) -> Option<End> {
    let mut buf = [0; 4096];
    loop {
        match client.reader().read(&mut buf) {
            Ok(0) => return Some(End::Closed),
            Ok(read) => plaintext.extend_from_slice(&buf[..read]),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return None,
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Some(End::Eof),
            Err(error) => return Some(End::Failed(error.to_string())),
        }
    }
}

/// A stock client whose handshake the recording completed.
fn stock_client(session: &Session) -> ClientConnection {
    let mut client = ClientConnection::new(Arc::clone(&session.config), server_name()).unwrap();
    let mut hello = Vec::new();
    client.write_tls(&mut hello).unwrap();
    feed(&mut client, &session.flight);
    client.process_new_packets().unwrap();
    client
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    })
}

/// The client's transport: reads come from `incoming`, at most `chunk`
/// bytes each, and writes (the client's handshake, alerts) go nowhere.
struct Replay {
    incoming: Vec<u8>,
    at: usize,
    chunk: usize,
}

impl AsyncRead for Replay {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let left = &this.incoming[this.at..];
        let mut len = left.len().min(buf.remaining());
        if this.chunk > 0 {
            len = len.min(this.chunk);
        }
        buf.put_slice(&left[..len]);
        this.at += len;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Replay {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
