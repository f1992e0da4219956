//! The [`Waypoint`] as the process of a pod (`ztunnel-test-waypoint`, in
//! the image `ztunnel-test-app`), for the real cluster, where a waypoint
//! must be a pod a kubelet runs: started from its arguments (the pod's IP
//! and port from the downward API, its certificate from a mounted Secret,
//! its routes and deny list), it prints one JSON line once it listens and
//! one for every CONNECT it saw, which the test reads from the pod's log;
//! it stops on SIGTERM or SIGINT. The rules are fixed for the process's
//! life: a test changes them by recreating the pod.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use nix::sys::signal::{SigSet, Signal};
use tokio_rustls::rustls::pki_types::PrivateKeyDer;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use ztunnel_certs::cert::{WorkloadCertificate, parse_pem_bundle};
use ztunnel_certs::identity::Identity;
use ztunnel_certs::issuer::pem_certificate;

use super::{Record, RouteSpec, Waypoint};

/// How often new records are printed: a test polls the log far more
/// slowly.
const PRINT_EVERY: Duration = Duration::from_millis(100);

/// `ztunnel-test-waypoint`'s arguments.
#[derive(Debug, Parser)]
#[command(
    name = "ztunnel-test-waypoint",
    about = "An HBONE waypoint for tests: forwards by route, refuses denied identities, prints what it saw"
)]
pub struct Cli {
    /// The address to listen on and dial from: the pod's IP, port 15008.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Its certificate, then any intermediates, PEM.
    #[arg(long)]
    pub cert_chain: PathBuf,
    /// The certificate's private key, PEM (PKCS#8, SEC1 or PKCS#1).
    #[arg(long)]
    pub key: PathBuf,
    /// The roots clients and upstreams are verified against, PEM.
    #[arg(long)]
    pub roots: PathBuf,
    /// A route: `AUTHORITY=DIAL,UPSTREAM_AUTHORITY,IDENTITY[,IDENTITY...]`.
    #[arg(long = "route")]
    pub routes: Vec<RouteSpec>,
    /// An identity to refuse (403), whatever it asks for.
    #[arg(long = "deny")]
    pub denied: Vec<Identity>,
}

/// Runs the waypoint until SIGTERM or SIGINT.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    let cert = certificate(&cli.cert_chain, &cli.key, &cli.roots)?;
    let routes: HashMap<_, _> = cli
        .routes
        .into_iter()
        .map(|spec| (spec.authority, spec.route))
        .collect();
    // Blocked before any thread starts, so every thread inherits the mask
    // and the signals wait for the main thread's `wait`.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals
        .thread_block()
        .context("blocking SIGTERM and SIGINT")?;
    let waypoint = Waypoint::start(cli.listen, cert, routes)?;
    for identity in &cli.denied {
        waypoint.deny(identity.clone());
    }
    let denied: Vec<&str> = cli.denied.iter().map(Identity::as_str).collect();
    println!(
        "{}",
        serde_json::json!({
            "listening": waypoint.addr().to_string(),
            "identity": waypoint.identity().as_str(),
            "denied": denied,
        })
    );
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| print_records(&waypoint, &stop));
        let signal = signals.wait();
        stop.store(true, Ordering::Relaxed);
        signal
    })
    .context("waiting for SIGTERM")?;
    Ok(())
}

/// The waypoint's certificate from its files.
fn certificate(chain: &Path, key: &Path, roots: &Path) -> anyhow::Result<WorkloadCertificate> {
    let read =
        |path: &Path| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    let chain_pem = read(chain)?;
    let certs = parse_pem_bundle(&String::from_utf8_lossy(&chain_pem))
        .with_context(|| format!("parsing {}", chain.display()))?;
    // The CA response's shape: each certificate, then the root bundle.
    let mut response: Vec<String> = certs.iter().map(|der| pem_certificate(der)).collect();
    response.push(String::from_utf8_lossy(&read(roots)?).into_owned());
    let key = PrivateKeyDer::from_pem_slice(&read(key)?)
        .with_context(|| format!("parsing the key in {}", key.display()))?;
    Ok(WorkloadCertificate::from_ca_response(&response, key, None)?)
}

/// Prints every record as it comes, until `stop`, then what came last.
fn print_records(waypoint: &Waypoint, stop: &AtomicBool) {
    let mut seen = 0;
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        let (records, total) = waypoint.records_since(seen);
        seen = total;
        for record in &records {
            println!("{}", record_line(record));
        }
        if stopping {
            return;
        }
        std::thread::sleep(PRINT_EVERY);
    }
}

/// One record as a JSON line.
fn record_line(record: &Record) -> serde_json::Value {
    serde_json::json!({
        "identity": record.identity.as_str(),
        "peer": record.peer.to_string(),
        "authority": record.authority,
        "forwarded": record.forwarded,
        "outcome": format!("{:?}", record.outcome),
    })
}
