//! The built `ztunnel-ca serve` as a child process on free loopback ports:
//! started with a test's source flags, its addresses read back from the
//! line it prints, killed when the test ends however it ends.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_ztunnel-ca");

/// Kills the server when the test ends, however it ends.
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `serve` with its state in `state` and the mesh source `source`
/// (e.g. `--mesh FILE`, `--kubeconfig FILE`), logging at `log`; returns
/// the server and its gRPC and metrics addresses.
pub fn start<S: AsRef<OsStr>>(
    state: &Path,
    source: &[S],
    log: &str,
) -> (Server, SocketAddr, SocketAddr) {
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .arg("--state-dir")
        .arg(state)
        .args(source)
        .env("RUST_LOG", log)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let addresses = addresses(&mut child);
    let server = Server(child);
    let (grpc, http) = addresses.expect("serve printed its addresses");
    (server, grpc, http)
}

/// The gRPC and metrics addresses from the first line `serve` prints on
/// its (piped) stdout, "ztunnel-ca listening on <grpc> metrics <http>";
/// `None` when no such line comes within 60 s.
pub fn addresses(child: &mut Child) -> Option<(SocketAddr, SocketAddr)> {
    let stdout = child.stdout.take()?;
    let (line_tx, line_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = line_tx.send(line);
    });
    let line = line_rx.recv_timeout(Duration::from_secs(60)).ok()?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let address = |at: usize| words.get(at)?.parse().ok();
    Some((address(3)?, address(5)?))
}
