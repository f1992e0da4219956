#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! `/debug/pprof/heap` of a real `ztunnel` process, whose allocator is
//! sampled: a dedicated proxy loads a local file of 5,000 workloads, and
//! Go's own `go tool pprof` reads the live heap it reports, naming the
//! proxy's functions that hold it. With `ZTUNNEL_HEAP_SAMPLE_BYTES=0`
//! nothing is sampled and the endpoint says so. Skips with the reason
//! where Go is not installed.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use ztunnel_test_support::ports::unused_loopback_port;
use ztunnel_test_support::process::LoggedChild;
use ztunnel_test_support::skip::skip;
use ztunnel_test_support::wait;

/// Workloads in the local file: enough that the state is most of the heap.
const WORKLOADS: usize = 5_000;
/// Bound on the proxy's start and on each request.
const PATIENCE: Duration = Duration::from_secs(30);

/// A running `ztunnel` and its admin address.
struct Ztunnel {
    _process: LoggedChild,
    admin: SocketAddr,
}

/// The local file: the proxy's own workload and [`WORKLOADS`] others.
fn local_file(dir: &Path) -> std::path::PathBuf {
    let mut text = String::from("workloads:\n");
    for index in 0..=WORKLOADS {
        let name = if index == 0 {
            "app-0".to_owned()
        } else {
            format!("w-{index}")
        };
        let _ = write!(
            text,
            "- uid: uid-{name}\n  name: {name}\n  namespace: default\n  serviceAccount: app\n  workloadIps: [10.{}.{}.{}]\n  protocol: HBONE\n  node: node-b\n  services: {{}}\n",
            index >> 16,
            (index >> 8) & 0xff,
            index & 0xff,
        );
    }
    let path = dir.join("local.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A root certificate for the CA client's configuration, inline.
fn root_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["ca.example".to_owned()]).unwrap();
    params.self_signed(&key).unwrap().pem()
}

fn spawn_ztunnel(dir: &Path, sample_bytes: &str) -> Ztunnel {
    let log = dir.join(format!("ztunnel-{sample_bytes}.log"));
    let file = std::fs::File::create(&log).unwrap();
    let port = || unused_loopback_port().unwrap();
    let admin = port();
    let child = Command::new(env!("CARGO_BIN_EXE_ztunnel"))
        .env_clear()
        .env("PROXY_MODE", "dedicated")
        .env("PROXY_WORKLOAD_INFO", "default/app-0/app")
        .env("LOCAL_XDS_PATH", local_file(dir))
        // Nothing answers there: the certificate never comes, which the
        // heap profile does not need.
        .env("CA_ADDRESS", format!("https://{}", port()))
        .env("CA_ROOT_CA", root_pem())
        .env("ZTUNNEL_HEAP_SAMPLE_BYTES", sample_bytes)
        .env("ZTUNNEL_OUTBOUND_ADDR", "127.0.0.1:0")
        .env("ZTUNNEL_INBOUND_ADDR", "127.0.0.1:0")
        .env("ZTUNNEL_INBOUND_PLAINTEXT_ADDR", "127.0.0.1:0")
        .env("DNS_PROXY", "false")
        .env("ZTUNNEL_ADMIN_ADDR", admin.to_string())
        .env("ZTUNNEL_STATS_ADDR", port().to_string())
        .env("ZTUNNEL_READINESS_ADDR", port().to_string())
        .env("ZTUNNEL_WORKER_THREADS", "1")
        .env("RUST_LOG", "info")
        .current_dir(dir)
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    Ztunnel {
        _process: LoggedChild::new("ztunnel", child, log),
        admin,
    }
}

/// `GET path` on the admin port: the status and the body's bytes, once
/// the admin answers.
fn get(ztunnel: &Ztunnel, path: &str) -> (u16, Vec<u8>) {
    let mut answer = None;
    let answered = wait::until(PATIENCE, || {
        let Ok(mut stream) = TcpStream::connect(ztunnel.admin) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(PATIENCE));
        let head = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
        let mut raw = Vec::new();
        if stream.write_all(head.as_bytes()).is_err() || stream.read_to_end(&mut raw).is_err() {
            return false;
        }
        let Some(split) = raw.windows(4).position(|window| window == b"\r\n\r\n") else {
            return false;
        };
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let status = head.split(' ').nth(1).and_then(|code| code.parse().ok());
        answer = status.map(|status| (status, raw[split + 4..].to_vec()));
        answer.is_some()
    });
    assert!(answered, "the admin answers {path}");
    answer.unwrap()
}

/// Where `go` is: on PATH, or the usual install path.
fn go() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([std::path::PathBuf::from("/usr/local/go/bin")])
        .map(|dir| dir.join("go"))
        .find(|candidate| candidate.is_file())
}

#[test]
fn the_heap_profile_of_a_running_proxy_reads_in_go_tool_pprof() {
    let Some(go) = go() else {
        skip("reading the heap profile with go tool pprof: `go` is not installed");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ztunnel = spawn_ztunnel(dir.path(), &(64 * 1024).to_string());
    // The state is loaded before the admin listens.
    let (status, profile) = get(&ztunnel, "/debug/pprof/heap");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&profile));
    let file = dir.path().join("heap.pb");
    std::fs::write(&file, &profile).unwrap();
    let output = Command::new(&go)
        .args(["tool", "pprof", "-top", "-sample_index=inuse_space"])
        .arg(&file)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "go tool pprof: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        shown.contains("ztunnel_proxy::"),
        "the proxy's own functions hold the heap:\n{shown}"
    );
    assert!(
        !shown.contains("memory::sampler"),
        "the sampler's frames are cut:\n{shown}"
    );
    // The total is the state's order of magnitude: at least 100 bytes a
    // workload, well under the process's whole address space.
    let total = shown
        .lines()
        .find_map(|line| line.split("% of ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_default()
        .to_owned();
    let bytes = parse_size(&total).unwrap_or_else(|| panic!("a total in:\n{shown}"));
    assert!(
        bytes > 100.0 * WORKLOADS as f64 && bytes < 1024.0 * 1024.0 * 1024.0,
        "{total} in use:\n{shown}"
    );

    let off = spawn_ztunnel(dir.path(), "0");
    let (status, body) = get(&off, "/debug/pprof/heap");
    assert_eq!(status, 501);
    assert!(String::from_utf8_lossy(&body).contains("ZTUNNEL_HEAP_SAMPLE_BYTES=0"));
}

/// pprof's sizes: `12.34MB`, `512kB`, `100B`.
fn parse_size(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "B" => 1.0,
        "kB" => 1024.0,
        "MB" => 1024.0 * 1024.0,
        "GB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(number.parse::<f64>().ok()? * scale)
}
