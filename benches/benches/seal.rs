#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench set-up: a panic is a failed run
//! AES-GCM record sealing through rustls, aws-lc-rs against ring: the number
//! behind choosing aws-lc-rs as the one provider (ARCHITECTURE.md).
//!
//! Each provider gets an in-memory TLS 1.3 client/server pair limited to one
//! suite. `seal` measures the sender alone: plaintext in, records out into a
//! `Vec`. `seal_open` adds the receiver decrypting them, the full cost a
//! tunnel pays per byte in one direction.

use std::hint::black_box;
use std::io::{Read, Write};
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig};
use rustls::{ServerConnection, SupportedCipherSuite};
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

/// The largest TLS record payload: a tunnel under load fills every record.
const RECORD: usize = 16 * 1024;
/// Records per iteration: 1 MiB, enough to swamp per-call overhead.
const RECORDS: usize = 64;

/// A connected client/server pair that has finished its handshake.
struct Pair {
    client: Connection,
    server: Connection,
}

impl Pair {
    fn new(provider: CryptoProvider, suite: SupportedCipherSuite) -> Pair {
        let provider = Arc::new(CryptoProvider {
            cipher_suites: vec![suite],
            ..provider
        });
        let certified = rcgen::generate_simple_self_signed(["localhost".to_owned()]).unwrap();
        let cert = certified.cert.der().clone();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            certified.signing_key.serialize_der(),
        ));

        let mut roots = RootCertStore::empty();
        roots.add(cert.clone()).unwrap();
        let client = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();

        let name = ServerName::try_from("localhost").unwrap();
        let mut pair = Pair {
            client: ClientConnection::new(Arc::new(client), name)
                .unwrap()
                .into(),
            server: ServerConnection::new(Arc::new(server)).unwrap().into(),
        };
        let mut wire = Vec::new();
        // A TLS 1.3 handshake takes two round trips, tickets included; the
        // bound only stops a broken set-up from spinning.
        for _ in 0..10 {
            transfer(&mut pair.client, &mut pair.server, &mut wire);
            transfer(&mut pair.server, &mut pair.client, &mut wire);
            if !pair.client.is_handshaking() && !pair.server.is_handshaking() {
                let negotiated = pair.client.negotiated_cipher_suite().unwrap();
                assert_eq!(negotiated.suite(), suite.suite());
                return pair;
            }
        }
        panic!("handshake did not complete");
    }

    /// Seals `RECORDS` records of `plaintext` into `wire`.
    fn seal(&mut self, plaintext: &[u8], wire: &mut Vec<u8>) {
        wire.clear();
        for _ in 0..RECORDS {
            self.client.writer().write_all(plaintext).unwrap();
            while self.client.wants_write() {
                self.client.write_tls(wire).unwrap();
            }
        }
    }

    /// Opens the records in `wire` on the server, draining the plaintext
    /// into `sink`, and returns how many plaintext bytes came out.
    fn open(&mut self, wire: &[u8], sink: &mut [u8]) -> usize {
        let mut opened = 0;
        let mut pending = wire;
        while !pending.is_empty() {
            self.server.read_tls(&mut pending).unwrap();
            self.server.process_new_packets().unwrap();
            loop {
                match self.server.reader().read(sink) {
                    Ok(0) => break,
                    Ok(n) => opened += n,
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(error) => panic!("reading plaintext: {error}"),
                }
            }
        }
        opened
    }
}

/// Moves everything `from` wants to send into `to`.
fn transfer(from: &mut Connection, to: &mut Connection, wire: &mut Vec<u8>) {
    wire.clear();
    while from.wants_write() {
        from.write_tls(wire).unwrap();
    }
    let mut pending = &wire[..];
    while !pending.is_empty() {
        to.read_tls(&mut pending).unwrap();
        to.process_new_packets().unwrap();
    }
}

/// The providers and suites compared: the project's provider (aws-lc-rs's
/// own suites) and ring's.
fn contenders() -> Vec<(
    &'static str,
    &'static str,
    CryptoProvider,
    SupportedCipherSuite,
)> {
    use rustls::crypto::{aws_lc_rs, ring};
    let ours = || Arc::unwrap_or_clone(ztunnel_certs::tls::provider());
    vec![
        (
            "aws-lc-rs",
            "AES_128_GCM",
            ours(),
            aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256,
        ),
        (
            "aws-lc-rs",
            "AES_256_GCM",
            ours(),
            aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384,
        ),
        (
            "ring",
            "AES_128_GCM",
            ring::default_provider(),
            ring::cipher_suite::TLS13_AES_128_GCM_SHA256,
        ),
        (
            "ring",
            "AES_256_GCM",
            ring::default_provider(),
            ring::cipher_suite::TLS13_AES_256_GCM_SHA384,
        ),
    ]
}

fn seal(c: &mut Criterion) {
    let plaintext = vec![0x5a; RECORD];
    let mut group = c.benchmark_group("seal");
    group.throughput(Throughput::Bytes((RECORD * RECORDS) as u64));
    for (provider_name, suite_name, provider, suite) in contenders() {
        let mut pair = Pair::new(provider, suite);
        let mut wire = Vec::with_capacity(2 * RECORD * RECORDS);
        group.bench_function(BenchmarkId::new(provider_name, suite_name), |b| {
            b.iter(|| {
                pair.seal(&plaintext, &mut wire);
                black_box(wire.len())
            })
        });
    }
    group.finish();
}

fn seal_open(c: &mut Criterion) {
    let plaintext = vec![0x5a; RECORD];
    let mut group = c.benchmark_group("seal_open");
    group.throughput(Throughput::Bytes((RECORD * RECORDS) as u64));
    for (provider_name, suite_name, provider, suite) in contenders() {
        let mut pair = Pair::new(provider, suite);
        let mut wire = Vec::with_capacity(2 * RECORD * RECORDS);
        let mut sink = vec![0; RECORD];
        group.bench_function(BenchmarkId::new(provider_name, suite_name), |b| {
            b.iter(|| {
                pair.seal(&plaintext, &mut wire);
                let opened = pair.open(&wire, &mut sink);
                assert_eq!(opened, RECORD * RECORDS);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, seal, seal_open);
criterion_main!(benches);
