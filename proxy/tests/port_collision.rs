#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! The inbound plaintext path against the collision of its own dials.
//!
//! The destination ztunnel dials the application from the client's IP
//! (IP_TRANSPARENT, WIRE.md §1) with a source port its kernel picks. On
//! the same node the client's kernel and the dial's are one, and both draw
//! from the same ephemeral sequence for the same (client IP, app IP, app
//! port). A later client connection can therefore come from the port of
//! a dial still open, with exactly the dial's tuple: without a conntrack
//! zone of the dials' own (the agent's rule, `cni/src/agent/rules.rs`),
//! its SYN matches the dial's conntrack entry, is never redirected to
//! 15006, and is never answered.
//!
//! One client pod outside the mesh opens 10,000 connections to a meshed
//! pod's application on the same node, keeping the latest ones open, while
//! a meshed pod on that node talks to the same application over HBONE.
//! Every connection must be answered within a bound. Needs root, `ip`,
//! `iptables` and containernetworking-plugins; skips with the reason
//! otherwise.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use support::{app, delivered_over_mtls, logs, one_node};

#[path = "support/cluster.rs"]
mod support;

/// Plaintext connections the client opens.
const CONNECTIONS: usize = 10_000;
/// How many of the latest the client keeps open, so that the destination
/// ztunnel holds that many dials when later connections are made.
const HELD: usize = 2_000;
/// Connections being opened at once.
const IN_FLIGHT: usize = 32;
/// A connection not answered (connected and echoed) within this has
/// stalled: an unanswered SYN is first sent again after one second.
const ANSWER_WITHIN: Duration = Duration::from_secs(3);
/// The whole run's bound.
const RUN_WITHIN: Duration = Duration::from_secs(300);
/// At most this many HBONE exchanges run beside it.
const MAX_HBONE: usize = 5_000;

/// How one plaintext connection went.
enum Outcome {
    /// Connected and echoed, in this long.
    Answered(TcpStream, Duration),
    /// Not answered within [`ANSWER_WITHIN`].
    Stalled,
    /// Failed with an error.
    Failed(String),
}

async fn open(target: SocketAddr, index: usize) -> Outcome {
    let started = Instant::now();
    let payload = index.to_be_bytes();
    let attempt = async {
        let mut stream = TcpStream::connect(target).await?;
        stream.write_all(&payload).await?;
        let mut back = [0u8; 8];
        stream.read_exact(&mut back).await?;
        if back != payload {
            return Err(std::io::Error::other("echo returned other bytes"));
        }
        Ok(stream)
    };
    match tokio::time::timeout(ANSWER_WITHIN, attempt).await {
        Ok(Ok(stream)) => Outcome::Answered(stream, started.elapsed()),
        Ok(Err(error)) => Outcome::Failed(error.to_string()),
        Err(_) => Outcome::Stalled,
    }
}

/// What the plaintext client saw.
#[derive(Debug, Default)]
struct Tally {
    answered: usize,
    stalled: usize,
    failed: Vec<String>,
    slowest: Duration,
    elapsed: Duration,
}

/// Opens [`CONNECTIONS`] connections to `target` from the current network
/// namespace, [`IN_FLIGHT`] at a time, keeping the latest [`HELD`] open.
fn plaintext_run(target: SocketAddr) -> Tally {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let started = Instant::now();
        let mut tally = Tally::default();
        let mut held = VecDeque::with_capacity(HELD + 1);
        let mut tasks = JoinSet::new();
        let mut next = 0;
        while (next < CONNECTIONS || !tasks.is_empty()) && started.elapsed() < RUN_WITHIN {
            while next < CONNECTIONS && tasks.len() < IN_FLIGHT {
                tasks.spawn(open(target, next));
                next += 1;
            }
            let Some(done) = tasks.join_next().await else {
                break;
            };
            match done.unwrap() {
                Outcome::Answered(stream, took) => {
                    tally.answered += 1;
                    tally.slowest = tally.slowest.max(took);
                    held.push_back(stream);
                    if held.len() > HELD {
                        held.pop_front();
                    }
                }
                Outcome::Stalled => tally.stalled += 1,
                Outcome::Failed(error) => tally.failed.push(error),
            }
        }
        tally.elapsed = started.elapsed();
        tally
    })
}

#[test]
fn plaintext_connections_from_one_client_never_meet_the_proxys_own_dials() {
    let Some(cluster) = one_node("the port collision test", &[]) else {
        return;
    };
    let target = app(&cluster, "server");
    let cluster = Arc::new(cluster);

    // HBONE beside the plaintext run, to the same application, until the
    // run ends.
    let done = Arc::new(AtomicBool::new(false));
    let hbone_ok = Arc::new(AtomicUsize::new(0));
    let hbone_failed = Arc::new(AtomicUsize::new(0));
    let hbone = {
        let (cluster, done) = (Arc::clone(&cluster), Arc::clone(&done));
        let (ok, failed) = (Arc::clone(&hbone_ok), Arc::clone(&hbone_failed));
        std::thread::spawn(move || {
            let meshed = cluster.pod("client").unwrap();
            for _ in 0..MAX_HBONE {
                if done.load(Ordering::SeqCst) {
                    break;
                }
                if meshed.echoes(target) {
                    ok.fetch_add(1, Ordering::SeqCst);
                } else {
                    failed.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };

    let outsider = cluster.pod("outsider").unwrap();
    let tally = outsider.ns.run(move || plaintext_run(target)).unwrap();
    done.store(true, Ordering::SeqCst);
    hbone.join().unwrap();
    let (hbone_ok, hbone_failed) = (
        hbone_ok.load(Ordering::SeqCst),
        hbone_failed.load(Ordering::SeqCst),
    );
    eprintln!(
        "{} plaintext connections in {:.1?} ({} held open at a time): {} answered, \
         slowest {:.0?}, {} stalled, {} failed; beside them {} HBONE exchanges, {} failed",
        CONNECTIONS,
        tally.elapsed,
        HELD,
        tally.answered,
        tally.slowest,
        tally.stalled,
        tally.failed.len(),
        hbone_ok,
        hbone_failed,
    );
    let first_failures: Vec<&String> = tally.failed.iter().take(5).collect();
    assert_eq!(
        (tally.answered, tally.stalled, tally.failed.len()),
        (CONNECTIONS, 0, 0),
        "answered, stalled, failed; first failures {first_failures:?}\n{}",
        logs(&cluster)
    );
    assert!(hbone_ok > 0, "no HBONE exchange succeeded");
    assert_eq!(
        hbone_failed,
        0,
        "HBONE exchanges failed\n{}",
        logs(&cluster)
    );
    // The HBONE exchanges were tunnelled, not passed through as plaintext.
    assert!(
        delivered_over_mtls(&cluster, "node-a", "server", "client") > 0,
        "{}",
        logs(&cluster)
    );
}
