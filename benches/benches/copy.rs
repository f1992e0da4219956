#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // bench set-up: a panic is a failed run
//! Throughput of the proxy's bidirectional copy loop (`copy::copy_bidirectional`)
//! on one bulk stream: 64 MiB from `a` to `b`, the reverse direction idle and
//! closed at once, as in a download.
//!
//! Both sides are in-memory pipes (`tokio::io::duplex`), not loopback TCP:
//! on TCP each byte costs two syscalls and two kernel copies, which would
//! dominate the result and vary with whatever else the shared cores run,
//! while a pipe leaves mostly the loop's own work (its polling, buffer
//! growth, and the copies into and out of its buffer). Tokio's
//! `copy_bidirectional` (fixed 8 KiB buffers) over the same pipes is
//! measured beside it, so that the pipes' share can be told apart from the
//! loop's.
//!
//! Without syscalls the result depends on where the bytes sit, so each loop
//! runs with two pipe sizes (see `PIPES`): one whose working set stays in
//! the L2 cache, where the per-call cost of the loop shows, and one that
//! does not, where the size of the loop's buffer shows. Neither is the
//! loop's throughput on a socket; a change to the loop should move both
//! the way it is meant to.
//!
//! Everything runs in one task on a current-thread runtime: the writer, the
//! loop and the reader take turns, so the number is CPU cost per byte, not
//! how well two cores overlap.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bytes moved per iteration: long enough that set-up and the buffer's
/// growth from 1 KiB are noise, short enough that an iteration takes
/// milliseconds.
const TRANSFER: usize = 64 * 1024 * 1024;
/// The writer's and the reader's chunk: 64 KiB, the largest GRO aggregate
/// (without BIG TCP), the unit a receiving socket is usually filled in.
const CHUNK: usize = 64 * 1024;
/// Capacity of each pipe direction, by name: one chunk, so that two pipes
/// and the loop's buffer fit in a 512 KiB L2 cache; and 1 MiB, four times
/// the loop's largest buffer, like a socket buffer that lets the writer run
/// ahead, so that the two pipes alone outgrow a 1 MiB L2 cache.
const PIPES: [(&str, usize); 2] = [("pipe_64KiB", CHUNK), ("pipe_1MiB", 1024 * 1024)];

/// The two copy loops compared.
#[derive(Clone, Copy)]
enum Loop {
    Proxy,
    Tokio,
}

/// Moves `TRANSFER` bytes through `copy` and checks they all arrived.
async fn transfer(copy: Loop, pipe: usize, chunk: &[u8]) {
    let (mut source, mut a) = tokio::io::duplex(pipe);
    let (mut b, mut destination) = tokio::io::duplex(pipe);
    let write = async move {
        for _ in 0..TRANSFER / CHUNK {
            source.write_all(chunk).await.unwrap();
        }
        source.shutdown().await.unwrap();
        // Keep `source` open for reading until the loop closes it, so that
        // the reverse direction ends in EOF rather than a broken pipe.
        let mut rest = Vec::new();
        source.read_to_end(&mut rest).await.unwrap();
    };
    let read = async move {
        // The reverse direction carries nothing: close it at once.
        destination.shutdown().await.unwrap();
        let mut sink = vec![0; CHUNK];
        let mut received = 0;
        loop {
            match destination.read(&mut sink).await.unwrap() {
                0 => return received,
                n => received += n,
            }
        }
    };
    let run = async move {
        match copy {
            Loop::Proxy => {
                let moved = ztunnel_proxy::copy::copy_bidirectional(&mut a, &mut b)
                    .await
                    .unwrap();
                (moved.a_to_b, moved.b_to_a)
            }
            Loop::Tokio => tokio::io::copy_bidirectional(&mut a, &mut b).await.unwrap(),
        }
    };
    let ((), received, moved) = tokio::join!(write, read, run);
    assert_eq!(received, TRANSFER);
    assert_eq!(moved, (TRANSFER as u64, 0));
}

fn copy(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let chunk = &vec![0x5a; CHUNK];
    let mut group = c.benchmark_group("copy");
    group.throughput(Throughput::Bytes(TRANSFER as u64));
    for (pipe_name, pipe) in PIPES {
        for (name, copy) in [("proxy", Loop::Proxy), ("tokio", Loop::Tokio)] {
            group.bench_function(BenchmarkId::new(name, pipe_name), |b| {
                b.to_async(&runtime).iter(|| transfer(copy, pipe, chunk))
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // One iteration moves 64 MiB (a few milliseconds): criterion's
    // minimum of 10 samples over 3 s is enough for a stable median and
    // keeps the four cases under 20 s.
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = copy
}
criterion_main!(benches);
