//! The out-of-place encrypter against aws-lc-rs's own: the same record
//! bytes, records the stock decrypter opens, the nonce rule, and whole
//! connections between our provider and the stock one.

use std::io::{ErrorKind, IoSlice, Read, Write};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::crypto::cipher::InboundOpaqueMessage;
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig};
use rustls::{ServerConnection, version};
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

use super::*;

/// The largest TLS record payload (RFC 8446 §5.1).
const MAX_FRAGMENT: usize = 16 * 1024;

/// One of our suites, the stock suite it is made from, and its AEAD.
type SuitePair = (
    SupportedCipherSuite,
    SupportedCipherSuite,
    &'static OutOfPlaceGcm,
);

fn suite_pairs() -> [SuitePair; 2] {
    [
        (
            TLS13_AES_256_GCM_SHA384,
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            &AES_256_GCM,
        ),
        (
            TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            &AES_128_GCM,
        ),
    ]
}

/// A provider of aws-lc-rs's with `suite` its only cipher suite.
fn only(provider: CryptoProvider, suite: SupportedCipherSuite) -> CryptoProvider {
    CryptoProvider {
        cipher_suites: vec![suite],
        ..provider
    }
}

/// A client and a server, each with its own provider, that have finished a
/// TLS 1.3 handshake in memory.
fn connected(
    client_provider: CryptoProvider,
    server_provider: CryptoProvider,
    extract_secrets: bool,
) -> (Connection, Connection) {
    let certified = rcgen::generate_simple_self_signed(["localhost".to_owned()]).unwrap();
    let cert = certified.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    let mut roots = RootCertStore::empty();
    roots.add(cert.clone()).unwrap();

    let mut client_config = ClientConfig::builder_with_provider(Arc::new(client_provider))
        .with_protocol_versions(&[&version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client_config.enable_secret_extraction = extract_secrets;
    let mut server_config = ServerConfig::builder_with_provider(Arc::new(server_provider))
        .with_protocol_versions(&[&version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    server_config.enable_secret_extraction = extract_secrets;

    let name = ServerName::try_from("localhost").unwrap();
    let mut client: Connection = ClientConnection::new(Arc::new(client_config), name)
        .unwrap()
        .into();
    let mut server: Connection = ServerConnection::new(Arc::new(server_config))
        .unwrap()
        .into();
    // Two round trips and the tickets; the bound only stops a broken set-up.
    for _ in 0..10 {
        deliver(&mut client, &mut server, &mut Vec::new());
        deliver(&mut server, &mut client, &mut Vec::new());
    }
    assert!(!client.is_handshaking() && !server.is_handshaking());
    (client, server)
}

/// Moves every record `from` has queued into `to`, and whatever plaintext
/// that releases onto the end of `received`.
fn deliver(from: &mut Connection, to: &mut Connection, received: &mut Vec<u8>) {
    let mut wire = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut wire).unwrap();
    }
    let mut pending = &wire[..];
    let mut buffer = vec![0; 64 * 1024];
    while !pending.is_empty() {
        to.read_tls(&mut pending).unwrap();
        to.process_new_packets().unwrap();
        loop {
            match to.reader().read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
                Err(error) if error.kind() == ErrorKind::WouldBlock => break,
                Err(error) => panic!("reading plaintext: {error}"),
            }
        }
    }
}

/// One traffic key of `suite` twice, and its IV: rustls hands out a key of
/// the suite's length only by extracting a connection's secrets, and the
/// client's sending key is the server's receiving key.
fn traffic_key(suite: SupportedCipherSuite) -> (AeadKey, AeadKey, [u8; 12]) {
    let stock = rustls::crypto::aws_lc_rs::default_provider;
    let (client, server) = connected(only(stock(), suite), only(stock(), suite), true);
    let (_, sending) = client.dangerous_extract_secrets().unwrap().tx;
    let (_, receiving) = server.dangerous_extract_secrets().unwrap().rx;
    let (
        ConnectionTrafficSecrets::Aes256Gcm { key, iv }
        | ConnectionTrafficSecrets::Aes128Gcm { key, iv },
        ConnectionTrafficSecrets::Aes256Gcm { key: copy, .. }
        | ConnectionTrafficSecrets::Aes128Gcm { key: copy, .. },
    ) = (sending, receiving)
    else {
        panic!("not an AES-GCM secret");
    };
    (key, copy, iv.as_ref().try_into().unwrap())
}

/// Our encrypter, the stock one and the stock decrypter, all with one
/// traffic key of one suite.
struct Sealers {
    ours: OutOfPlaceEncrypter,
    stock: Box<dyn MessageEncrypter>,
    opener: Box<dyn MessageDecrypter>,
}

impl Sealers {
    fn new((_, stock, gcm): SuitePair) -> Sealers {
        let (key, copy, iv) = traffic_key(stock);
        // rustls's keys cannot be copied: ours is built from the key's bytes.
        let ours = OutOfPlaceEncrypter::new(gcm.algorithm, key.as_ref(), Iv::from(iv)).unwrap();
        let stock = tls13(stock).aead_alg;
        Sealers {
            ours,
            stock: stock.encrypter(key, Iv::from(iv)),
            opener: stock.decrypter(copy, Iv::from(iv)),
        }
    }

    /// Seals `payload` as record `seq` with both encrypters, checks that
    /// the records are the same bytes of the expected length, and returns
    /// what the stock decrypter opens from ours: its type and plaintext.
    fn seal_and_open(
        &mut self,
        typ: ContentType,
        payload: OutboundChunks<'_>,
        seq: u64,
        case: &str,
    ) -> (ContentType, Vec<u8>) {
        let len = payload.len();
        let message = || OutboundPlainMessage {
            typ,
            version: ProtocolVersion::TLSv1_3,
            payload: payload.clone(),
        };
        let mut record = self.ours.encrypt(message(), seq).unwrap().encode();
        let stock_record = self.stock.encrypt(message(), seq).unwrap().encode();
        assert_eq!(record, stock_record, "{case}");
        let header_len = 5;
        let expected_len = header_len + self.ours.encrypted_payload_len(len);
        assert_eq!(record.len(), expected_len, "{case}");

        let message = InboundOpaqueMessage::new(
            ContentType::ApplicationData,
            ProtocolVersion::TLSv1_2,
            &mut record[header_len..],
        );
        let plain = self.opener.decrypt(message, seq).unwrap();
        (plain.typ, plain.payload.to_vec())
    }
}

/// A plaintext whose bytes all differ from their neighbours', so a
/// shifted or reordered byte shows.
fn plaintext(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn records_are_the_stock_records_byte_for_byte_and_open_with_the_stock_decrypter() {
    let lengths = [0, 1, 15, 16, 17, 1000, MAX_FRAGMENT];
    let types = [
        ContentType::ApplicationData,
        ContentType::Handshake,
        ContentType::Alert,
    ];
    for pair in suite_pairs() {
        let mut sealers = Sealers::new(pair);
        for (seq, &len) in (0..).zip(&lengths) {
            let typ = types[len % types.len()];
            let data = plaintext(len);
            let case = format!("{:?}, {len} bytes", pair.0.suite());
            let opened = sealers.seal_and_open(typ, OutboundChunks::Single(&data), seq, &case);
            assert_eq!(opened, (typ, data), "{case}");
        }
    }
}

#[test]
fn a_record_across_several_buffers_is_the_stock_record() {
    // A frame header and its payload, as h2 writes them.
    let header = plaintext(9);
    let payload = plaintext(3 * MAX_FRAGMENT);
    let chunks: [&[u8]; 3] = [&header, &payload, &[]];
    let whole = [&header[..], &payload[..]].concat();
    let end = whole.len();
    let windows = [
        (0, MAX_FRAGMENT, "header and payload"),
        (109, 109 + MAX_FRAGMENT, "inside the payload"),
        (end - MAX_FRAGMENT, end, "the payload's end"),
        (0, 9, "the header alone"),
        (9, 9, "empty, at a boundary"),
        (end, end, "empty, at the end"),
    ];
    for pair in suite_pairs() {
        let mut sealers = Sealers::new(pair);
        for (seq, &(start, end, case)) in (0..).zip(&windows) {
            let payload = OutboundChunks::Multiple {
                chunks: &chunks,
                start,
                end,
            };
            let typ = ContentType::ApplicationData;
            let opened = sealers.seal_and_open(typ, payload, seq, case);
            assert_eq!(opened, (typ, whole[start..end].to_vec()), "{case}");
        }
    }
}

#[test]
fn contiguous_finds_a_record_inside_one_buffer_only() {
    let (a, b, c) = ([1u8; 4], [2u8; 4], [3u8; 4]);
    let chunks: [&[u8]; 4] = [&a, &[], &b, &c];
    let cases: [(usize, usize, Option<&[u8]>, &str); 7] = [
        (0, 4, Some(&a), "all of the first buffer"),
        (5, 7, Some(&b[1..3]), "inside the third buffer"),
        (8, 12, Some(&c), "all of the last buffer"),
        (4, 4, Some(&[]), "empty"),
        (3, 5, None, "across the first and third"),
        (0, 12, None, "across all"),
        (12, 13, None, "past the end"),
    ];
    for (start, end, expected, case) in cases {
        let payload = OutboundChunks::Multiple {
            chunks: &chunks,
            start,
            end,
        };
        assert_eq!(contiguous(&payload), expected, "{case}");
    }
    assert_eq!(contiguous(&OutboundChunks::Single(&a)), Some(&a[..]));
}

#[test]
fn a_sequence_number_is_never_sealed_twice() {
    let mut encrypter = Sealers::new(suite_pairs()[0]).ours;
    let data = plaintext(100);
    let (header, rest) = data.split_at(9);
    let chunks: [&[u8]; 2] = [header, rest];
    let single = OutboundChunks::Single(&data);
    let multiple = OutboundChunks::Multiple {
        chunks: &chunks,
        start: 0,
        end: data.len(),
    };
    let mut seal = |payload: &OutboundChunks<'_>, seq| {
        let message = OutboundPlainMessage {
            typ: ContentType::ApplicationData,
            version: ProtocolVersion::TLSv1_3,
            payload: payload.clone(),
        };
        encrypter.encrypt(message, seq).map(|_| ())
    };

    // The out-of-place and the in-place seal share one count.
    let steps = [
        (&single, 0, Ok(()), "the first record"),
        (&multiple, 1, Ok(()), "the next, across buffers"),
        (
            &single,
            1,
            Err(Error::EncryptError),
            "the same number again",
        ),
        (
            &multiple,
            1,
            Err(Error::EncryptError),
            "the same, across buffers",
        ),
        (&single, 0, Err(Error::EncryptError), "an earlier number"),
        (&single, 2, Ok(()), "the next number after a refusal"),
        (&multiple, 7, Ok(()), "a gap"),
        (&multiple, 6, Err(Error::EncryptError), "back into the gap"),
        (
            &single,
            u64::MAX,
            Err(Error::EncryptError),
            "the last number",
        ),
    ];
    for (payload, seq, expected, case) in steps {
        assert_eq!(seal(payload, seq), expected, "{case}");
    }
}

#[test]
fn our_suites_are_the_stock_suites_but_for_the_encrypter() {
    for (ours, stock, _) in suite_pairs() {
        let (ours, stock) = (tls13(ours), tls13(stock));
        assert_eq!(ours.common.suite, stock.common.suite);
        assert_eq!(
            ours.common.hash_provider.algorithm(),
            stock.common.hash_provider.algorithm()
        );
        assert_eq!(
            ours.common.confidentiality_limit,
            stock.common.confidentiality_limit
        );
        assert_eq!(ours.aead_alg.key_len(), stock.aead_alg.key_len());
        assert_eq!(ours.fips(), stock.fips());
        assert_eq!(ours.quic.is_some(), stock.quic.is_some());
    }
    // The provider holds these very suites, in this order.
    let provided: Vec<_> = super::super::provider()
        .cipher_suites
        .iter()
        .map(|suite| suite.tls13().unwrap() as *const Tls13CipherSuite)
        .collect();
    let ours: Vec<_> = suite_pairs()
        .iter()
        .map(|(ours, _, _)| tls13(*ours) as *const Tls13CipherSuite)
        .collect();
    assert_eq!(provided, ours);
}

#[test]
fn a_key_of_the_wrong_length_fails_its_records_without_panicking() {
    // A 32-byte key for AES-128: only a rustls bug could hand one over.
    let mut encrypter = AES_128_GCM.encrypter(AeadKey::from([7; 32]), Iv::from([0; 12]));
    let message = OutboundPlainMessage {
        typ: ContentType::ApplicationData,
        version: ProtocolVersion::TLSv1_3,
        payload: OutboundChunks::Single(b"data"),
    };
    assert_eq!(
        encrypter.encrypt(message, 0).err(),
        Some(Error::EncryptError)
    );
    assert_eq!(encrypter.encrypted_payload_len(4), 4 + 1 + 16);
}

/// Sends `data` from `sender` to `receiver` in writes cycling through
/// `sizes`, every other write vectored as h2 writes a frame (its 9-byte
/// header, then its payload), the sender's keys updated halfway. Returns
/// what the receiver read.
fn stream(
    sender: &mut Connection,
    receiver: &mut Connection,
    data: &[u8],
    sizes: &[usize],
) -> Vec<u8> {
    let mut received = Vec::with_capacity(data.len());
    let mut offset = 0;
    let mut updated = false;
    for (write, &size) in sizes.iter().cycle().enumerate() {
        if offset == data.len() {
            break;
        }
        if !updated && offset >= data.len() / 2 {
            sender.refresh_traffic_keys().unwrap();
            updated = true;
        }
        let mut pending = &data[offset..data.len().min(offset + size)];
        offset += pending.len();
        while !pending.is_empty() {
            let written = if write % 2 == 1 && pending.len() > 9 {
                let (header, payload) = pending.split_at(9);
                let slices = [IoSlice::new(header), IoSlice::new(payload)];
                sender.writer().write_vectored(&slices).unwrap()
            } else {
                sender.writer().write(pending).unwrap()
            };
            pending = &pending[written..];
            deliver(sender, receiver, &mut received);
            deliver(receiver, sender, &mut Vec::new());
        }
    }
    received
}

#[test]
fn data_crosses_between_our_provider_and_the_stock_one_intact_in_both_directions() {
    // Sizes around the record size and h2's frames; about 3 MiB each way.
    let sizes = [
        1, 9, 100, 1000, 16383, 16384, 16385, 65536, 100_003, 262_144,
    ];
    let data = plaintext(3 * 1024 * 1024 + 12345);
    let ours = || Arc::unwrap_or_clone(super::super::provider());
    let stock = rustls::crypto::aws_lc_rs::default_provider;
    for (ours_suite, stock_suite, _) in suite_pairs() {
        let sides = [
            (
                "our client, stock server",
                only(ours(), ours_suite),
                only(stock(), stock_suite),
            ),
            (
                "stock client, our server",
                only(stock(), stock_suite),
                only(ours(), ours_suite),
            ),
        ];
        for (case, client_provider, server_provider) in sides {
            let case = format!("{case}, {:?}", ours_suite.suite());
            let (mut client, mut server) = connected(client_provider, server_provider, false);
            assert_eq!(
                client.negotiated_cipher_suite().map(|suite| suite.suite()),
                Some(ours_suite.suite())
            );
            let upstream = stream(&mut client, &mut server, &data, &sizes);
            assert!(upstream == data, "client to server: {case}");
            let downstream = stream(&mut server, &mut client, &data, &sizes);
            assert!(downstream == data, "server to client: {case}");
        }
    }
}
