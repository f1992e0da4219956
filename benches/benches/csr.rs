#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench set-up: a panic is a failed run
//! The two ends of a certificate request, measured apart.
//!
//! `csr` is the proxy's side, once per workload identity and rotation:
//! `key_generation` is the P-256 key alone (rcgen, as `csr.rs` makes it),
//! `generate` the whole `CertRequest::generate`, key, CSR, signature and PEM.
//!
//! `sign` is the CA's side, once per request it receives: `validate` is
//! `SigningRequest::from_pem` (PEM and DER parsing, signature check, key
//! policy), `sign_workload` is `Issuer::sign_workload` on an already
//! validated request (leaf certificate, signature, PEM chain), and
//! `validate_and_sign` is the two together, the CA's cost per request
//! before authentication and I/O.
//!
//! The CA signs with a root generated at set-up; an intermediate would add
//! only a cloned PEM string to the chain. Keys and serial numbers are random
//! by design, but their sizes are fixed, so the work per iteration is too.

use std::hint::black_box;
use std::time::{Duration, UNIX_EPOCH};

use criterion::{Criterion, criterion_group, criterion_main};
use ztunnel_certs::csr::CertRequest;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::issuer::{Issuer, SigningMaterial, SigningRequest, generate_root};

/// A fixed "now" (2025-01-01T00:00:00Z), so that validity periods are the
/// same on every run.
const NOW: Duration = Duration::from_secs(1_735_689_600);
/// Workload certificate lifetime: istiod's default of 24 hours.
const TTL: Duration = Duration::from_secs(24 * 3600);

fn identity() -> Identity {
    "spiffe://cluster.local/ns/payments/sa/ledger"
        .parse()
        .unwrap()
}

fn csr(c: &mut Criterion) {
    let identity = identity();
    let mut group = c.benchmark_group("csr");
    group.bench_function("key_generation", |b| {
        b.iter(|| rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap())
    });
    group.bench_function("generate", |b| {
        b.iter(|| CertRequest::generate(black_box(&identity)).unwrap())
    });
    group.finish();
}

fn sign(c: &mut Criterion) {
    let now = UNIX_EPOCH + NOW;
    let identity = identity();
    let root = generate_root("cluster.local", now).unwrap();
    let issuer = Issuer::new(&SigningMaterial {
        root_cert_pem: root.cert_pem,
        root_key_pem: Some(root.key_pem),
        ..SigningMaterial::default()
    })
    .unwrap();
    let csr_pem = CertRequest::generate(&identity)
        .unwrap()
        .csr_pem()
        .to_owned();
    let request = SigningRequest::from_pem(&csr_pem).unwrap();
    // Leaf, then the root bundle: no intermediates.
    assert_eq!(
        issuer
            .sign_workload(&request, &identity, TTL, now)
            .unwrap()
            .len(),
        2
    );

    let mut group = c.benchmark_group("sign");
    group.bench_function("validate", |b| {
        b.iter(|| SigningRequest::from_pem(black_box(&csr_pem)).unwrap())
    });
    group.bench_function("sign_workload", |b| {
        b.iter(|| {
            issuer
                .sign_workload(black_box(&request), &identity, TTL, now)
                .unwrap()
        })
    });
    group.bench_function("validate_and_sign", |b| {
        b.iter(|| {
            let request = SigningRequest::from_pem(black_box(&csr_pem)).unwrap();
            issuer.sign_workload(&request, &identity, TTL, now).unwrap()
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    // Each operation takes tens of microseconds: 100 samples over 3 s give
    // a stable median and keep the five cases well under a minute.
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = csr, sign
}
criterion_main!(benches);
