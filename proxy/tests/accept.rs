//! The shared accept loop with the process out of file descriptors: a
//! queued connection cannot be accepted (`EMFILE`), and the loop must pause
//! rather than spin, log the episode once, count every error, and accept the
//! connection once descriptors are free again.
//!
//! Its own test binary: it lowers the process's descriptor limit, which
//! would break any test running beside it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::resource::{Resource, UsageWho, getrlimit, getrusage, setrlimit};
use prometheus_client::registry::Registry;
use socket2::{Domain, Socket, Type};
use tokio::net::TcpListener;
use ztunnel_proxy::accept;
use ztunnel_proxy::drain;
use ztunnel_proxy::metrics::Metrics;

/// How long the loop runs out of descriptors before they are freed.
const STARVED: Duration = Duration::from_millis(1500);

/// The log lines written, for counting.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// `ztunnel_accept_errors_total` for `listener` and `kind`, 0 when absent.
fn accept_errors(registry: &Registry, listener: &str, kind: &str) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    let wanted = format!("ztunnel_accept_errors_total{{listener=\"{listener}\",kind=\"{kind}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&wanted))
        .map_or(0, |value| value.parse().unwrap())
}

/// User plus system CPU time of this process so far.
fn cpu_time() -> Duration {
    let usage = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let micros = |time: nix::sys::time::TimeVal| {
        Duration::from_secs(time.tv_sec() as u64) + Duration::from_micros(time.tv_usec() as u64)
    };
    micros(usage.user_time()) + micros(usage.system_time())
}

#[test]
fn out_of_descriptors_the_loop_pauses_logs_once_and_recovers() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry, "test");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (trigger, watcher) = drain::channel();
        let (accepted_tx, mut accepted) = tokio::sync::mpsc::unbounded_channel::<SocketAddr>();
        let server = tokio::spawn(async move {
            accept::serve(
                listener,
                "outbound",
                watcher,
                &metrics,
                || Some(()),
                move |_tcp, peer, ()| {
                    let _ = accepted_tx.send(peer);
                },
            )
            .await;
        });

        // The client's socket exists before the descriptors run out; then
        // every free descriptor is taken, up to a lowered limit.
        let client = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let in_use = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
        setrlimit(Resource::RLIMIT_NOFILE, in_use + 64, hard).unwrap();
        let mut hoard = Vec::new();
        while let Ok(file) = File::open("/dev/null") {
            hoard.push(file);
        }
        assert!(!hoard.is_empty(), "no descriptor was free to take");
        // Queued by the kernel; the proxy's accept fails with EMFILE.
        client.connect(&address.into()).unwrap();

        let cpu_before = cpu_time();
        tokio::time::sleep(STARVED).await;
        let cpu_used = cpu_time() - cpu_before;
        let errors = accept_errors(&registry, "outbound", "exhausted");
        assert!(
            accepted.try_recv().is_err(),
            "accepted with no descriptor free"
        );
        // Pauses of 10, 20, 40 … ms: about 8 tries in 1.5 s; a spin makes
        // hundreds of thousands.
        assert!(
            (1..=20).contains(&errors),
            "{errors} accept errors in {STARVED:?}"
        );
        assert!(
            cpu_used < STARVED / 2,
            "{cpu_used:?} of CPU in {STARVED:?}: spinning"
        );
        let warnings = lines.text().matches("cannot accept connections").count();
        assert_eq!(warnings, 1, "one warning per episode:\n{}", lines.text());

        drop(hoard);
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
        let peer = tokio::time::timeout(accept::MAX_PAUSE * 5, accepted.recv())
            .await
            .expect("the queued connection is accepted once descriptors are free")
            .unwrap();
        assert_eq!(peer, client.local_addr().unwrap().as_socket().unwrap());
        assert!(
            lines.text().contains("accepting connections again"),
            "{}",
            lines.text()
        );

        let _outcome = trigger.drain(Duration::from_secs(5)).await;
        server.await.unwrap();
    });
}
