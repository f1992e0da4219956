#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench set-up: a panic is a failed run
//! One TLS 1.3 record encrypter alone, AES-256-GCM: aws-lc-rs's own, which
//! copies each record's plaintext into the record and seals it there,
//! against the project's (`certs/src/tls/seal.rs`), which seals from the
//! plaintext's buffer into the record.
//!
//! `record` seals one full record from one buffer. `frame` seals what the
//! proxy's HTTP/2 sends for one 256 KiB DATA frame: rustls cuts the
//! vectored write of the 9-byte frame header and the payload into records,
//! the first spanning both buffers (copied by both encrypters), the rest
//! inside the payload.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rustls::crypto::cipher::{AeadKey, Iv, MessageEncrypter, OutboundChunks, OutboundPlainMessage};
use rustls::{CipherSuite, ContentType, ProtocolVersion, SupportedCipherSuite};

/// The proxy's allocator: each record is a fresh allocation, and glibc's
/// malloc would hand the bench pages to fault in that the proxy never sees.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The largest TLS record payload: a tunnel under load fills every record.
const RECORD: usize = 16 * 1024;
/// The proxy's largest copy buffer, and so its largest DATA frame payload
/// (`proxy/src/copy.rs`).
const FRAME: usize = 256 * 1024;
/// An HTTP/2 frame header.
const FRAME_HEADER: usize = 9;

/// The encrypters compared, each with the same key and IV.
fn encrypters() -> [(&'static str, Box<dyn MessageEncrypter>); 2] {
    let encrypter = |suite: &SupportedCipherSuite| {
        let aead = suite.tls13().unwrap().aead_alg;
        aead.encrypter(AeadKey::from([0x42; 32]), Iv::from([0x24; 12]))
    };
    let ours = ztunnel_certs::tls::provider();
    let ours = ours
        .cipher_suites
        .iter()
        .find(|suite| suite.suite() == CipherSuite::TLS13_AES_256_GCM_SHA384)
        .unwrap();
    [
        (
            "stock",
            encrypter(&rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_256_GCM_SHA384),
        ),
        ("ours", encrypter(ours)),
    ]
}

/// Seals `payload` as the record numbered `seq`, and returns the record as
/// rustls queues it to be sent.
fn seal(encrypter: &mut dyn MessageEncrypter, payload: OutboundChunks<'_>, seq: u64) -> Vec<u8> {
    let message = OutboundPlainMessage {
        typ: ContentType::ApplicationData,
        version: ProtocolVersion::TLSv1_3,
        payload,
    };
    encrypter.encrypt(message, seq).unwrap().encode()
}

fn record(c: &mut Criterion) {
    let plaintext = vec![0x5a; RECORD];
    let mut group = c.benchmark_group("record");
    group.throughput(Throughput::Bytes(RECORD as u64));
    for (name, mut encrypter) in encrypters() {
        // The key refuses a sequence number it has sealed before.
        let mut seq = 0;
        group.bench_function(BenchmarkId::new(name, "16 KiB"), |b| {
            b.iter(|| {
                let payload = OutboundChunks::Single(black_box(&plaintext));
                black_box(seal(encrypter.as_mut(), payload, seq));
                seq += 1;
            })
        });
    }
    group.finish();
}

fn frame(c: &mut Criterion) {
    let header = [0u8; FRAME_HEADER];
    let payload = vec![0x5a; FRAME];
    let chunks: [&[u8]; 2] = [&header, &payload];
    let len = FRAME_HEADER + FRAME;
    let mut group = c.benchmark_group("frame");
    group.throughput(Throughput::Bytes(len as u64));
    for (name, mut encrypter) in encrypters() {
        let mut seq = 0;
        // A rustls session with a 256 KiB buffer limit queues a frame's
        // records until the socket takes them all, so they are held
        // together and freed together.
        let mut queued = Vec::with_capacity(len.div_ceil(RECORD));
        group.bench_function(BenchmarkId::new(name, "256 KiB"), |b| {
            b.iter(|| {
                for start in (0..len).step_by(RECORD) {
                    let end = len.min(start + RECORD);
                    let payload = OutboundChunks::Multiple {
                        chunks: black_box(&chunks),
                        start,
                        end,
                    };
                    queued.push(seal(encrypter.as_mut(), payload, seq));
                    seq += 1;
                }
                black_box(&queued);
                queued.clear();
            })
        });
    }
    group.finish();
}

criterion_group!(benches, record, frame);
criterion_main!(benches);
