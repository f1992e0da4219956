//! The `ztunnel-loadgen` binary end to end on loopback: a real server
//! process, each client mode against it, and the JSON a harness would parse.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use ztunnel_benches::loadgen::{Attempt, Event, FailureKind, Outcome, Report, SoakReport, Step};

/// The longest any client run here may take: every run asks for about a
/// second, so this only trips on a hang.
const RUN_LIMIT: Duration = Duration::from_secs(30);

/// How long to wait for a line the program should print at once.
const LINE_LIMIT: Duration = Duration::from_secs(10);

fn loadgen() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ztunnel-loadgen"))
}

/// A child process killed when the test ends, pass or fail.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads a child's stdout lines on a thread, so reads can time out.
fn line_reader(stdout: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (lines, received) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    received
}

/// Starts a server command (`serve`, `dns-server`) and waits for the
/// address it reports listening on.
fn listening(args: &[&str]) -> (Running, SocketAddr) {
    let mut child = loadgen()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = line_reader(child.stdout.take().unwrap());
    let process = Running(child);
    let line = lines.recv_timeout(LINE_LIMIT).unwrap();
    let Event::Listening { addr } = serde_json::from_str(&line).unwrap() else {
        panic!("expected the listening event, got {line}");
    };
    (process, addr)
}

/// A `serve` process on 127.0.0.1 with an ephemeral port.
struct Server {
    process: Running,
    addr: SocketAddr,
}

impl Server {
    fn start() -> Server {
        Server::start_at(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// A server on `ip`, a loopback address.
    fn start_at(ip: IpAddr) -> Server {
        let (process, addr) =
            listening(&["serve", "--listen", &SocketAddr::new(ip, 0).to_string()]);
        assert_eq!(addr.ip(), ip);
        assert_ne!(addr.port(), 0, "the real port is reported");
        Server { process, addr }
    }

    fn target(&self) -> String {
        self.addr.to_string()
    }

    fn is_running(&mut self) -> bool {
        self.process.0.try_wait().unwrap().is_none()
    }
}

/// Runs a client to completion (within [`RUN_LIMIT`]).
fn run(args: &[&str]) -> Output {
    let child = loadgen()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut running = Running(child);
    let start = Instant::now();
    while running.0.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < RUN_LIMIT, "{args:?} did not finish");
        thread::sleep(Duration::from_millis(20));
    }
    let mut output = Output {
        status: running.0.wait().unwrap(),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    running
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut output.stdout)
        .unwrap();
    running
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut output.stderr)
        .unwrap();
    output
}

/// Runs a client that must succeed and returns its result line, checking
/// that every earlier stdout line is an event.
fn report(args: &[&str]) -> Report {
    let output = run(args);
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let (last, earlier) = lines.split_last().expect("no output");
    for line in earlier {
        serde_json::from_str::<Event>(line).unwrap();
    }
    serde_json::from_str(last).unwrap()
}

#[test]
fn stream_moves_bytes_both_ways() {
    let server = Server::start();
    for direction in ["up", "down"] {
        let args = [
            "stream",
            "--target",
            &server.target(),
            "--connections",
            "2",
            "--duration",
            "0.5",
            "--direction",
            direction,
        ];
        let Report::Stream(stream) = report(&args) else {
            panic!("not a stream report")
        };
        assert_eq!(serde_json::to_value(stream.direction).unwrap(), direction);
        assert_eq!(stream.connections, 2);
        assert!(stream.bytes > 0, "{stream:?}");
        assert!(stream.gbit_per_s > 0.0, "{stream:?}");
        assert_eq!(stream.errors, 0, "{stream:?}");
        assert!(stream.duration_s >= 0.5, "{stream:?}");
    }
}

#[test]
fn stream_stops_at_the_byte_limit() {
    let server = Server::start();
    let args = [
        "stream",
        "--target",
        &server.target(),
        "--duration",
        "20",
        "--direction",
        "up",
        "--max-bytes",
        "1000000",
    ];
    let Report::Stream(stream) = report(&args) else {
        panic!("not a stream report")
    };
    assert_eq!(stream.bytes, 1_000_000);
    assert!(stream.duration_s < 20.0);
}

#[test]
fn rr_answers_requests_closed_loop_and_at_a_rate() {
    let server = Server::start();
    let target = server.target();
    let closed = [
        "rr",
        "--target",
        &target,
        "--size",
        "1024",
        "--connections",
        "2",
        "--duration",
        "0.5",
    ];
    let Report::Rr(rr) = report(&closed) else {
        panic!("not an rr report")
    };
    assert!(rr.requests > 0, "{rr:?}");
    assert!(rr.requests_per_s > 0.0, "{rr:?}");
    assert_eq!(rr.errors, 0, "{rr:?}");
    assert!(rr.latency_us.p50 > 0.0, "{rr:?}");
    assert!(rr.latency_us.p50 <= rr.latency_us.p99, "{rr:?}");
    assert!(rr.latency_us.p99 <= rr.latency_us.max, "{rr:?}");

    let paced = [
        "rr",
        "--target",
        &target,
        "--size",
        "64",
        "--response-size",
        "4096",
        "--connections",
        "2",
        "--duration",
        "1",
        "--rate",
        "200",
    ];
    let Report::Rr(rr) = report(&paced) else {
        panic!("not an rr report")
    };
    assert!(rr.requests > 0, "{rr:?}");
    // 200/s for 1 s: a closed loop would send thousands.
    assert!(rr.requests <= 210, "the rate was not kept: {rr:?}");
    assert!(rr.latency_us.p50 <= rr.latency_us.p99, "{rr:?}");
}

#[test]
fn rr_stops_at_the_request_limit() {
    let server = Server::start();
    let args = [
        "rr",
        "--target",
        &server.target(),
        "--connections",
        "3",
        "--duration",
        "20",
        "--max-requests",
        "100",
    ];
    let Report::Rr(rr) = report(&args) else {
        panic!("not an rr report")
    };
    assert_eq!(rr.requests, 100);
    assert!(rr.duration_s < 20.0);
}

#[test]
fn connect_makes_connections_with_either_close() {
    let server = Server::start();
    let target = server.target();
    for close in ["server", "reset"] {
        let args = [
            "connect",
            "--target",
            &target,
            "--duration",
            "0.5",
            "--concurrency",
            "2",
            "--size",
            "100",
            "--close",
            close,
        ];
        let Report::Connect(connect) = report(&args) else {
            panic!("not a connect report")
        };
        assert!(connect.connections_made > 0, "{close}: {connect:?}");
        assert!(connect.connections_per_s > 0.0, "{close}: {connect:?}");
        assert_eq!(connect.errors, 0, "{close}: {connect:?}");
        // Set-up includes connect() for every sample, so its median does too.
        assert!(
            connect.connect_us.p50 <= connect.setup_us.p50,
            "{close}: {connect:?}"
        );
    }
    let limited = [
        "connect",
        "--target",
        &target,
        "--duration",
        "20",
        "--max-connections",
        "25",
    ];
    let Report::Connect(connect) = report(&limited) else {
        panic!("not a connect report")
    };
    assert_eq!(connect.connections_made, 25);
}

#[test]
fn idle_holds_every_connection_until_stdin_closes() {
    let mut server = Server::start();
    let mut child = loadgen()
        .args([
            "idle",
            "--target",
            &server.target(),
            "--connections",
            "50",
            "--hold",
            "30",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdin: ChildStdin = child.stdin.take().unwrap();
    let lines = line_reader(child.stdout.take().unwrap());
    let mut client = Running(child);

    let holding = lines.recv_timeout(LINE_LIMIT).unwrap();
    assert_eq!(
        serde_json::from_str::<Event>(&holding).unwrap(),
        Event::Holding {
            held: 50,
            errors: 0
        }
    );
    // Still holding: no result yet.
    assert!(lines.recv_timeout(Duration::from_millis(200)).is_err());

    let released = Instant::now();
    drop(stdin);
    let last = lines.recv_timeout(LINE_LIMIT).unwrap();
    let Report::Idle(idle) = serde_json::from_str(&last).unwrap() else {
        panic!("not an idle report: {last}")
    };
    assert_eq!(idle.held, 50);
    assert_eq!(idle.errors, 0);
    assert_eq!(idle.dropped, 0);
    assert!(idle.open_s > 0.0);
    assert!(
        released.elapsed() < Duration::from_secs(10),
        "stdin EOF ended the hold"
    );
    assert!(
        lines.recv_timeout(LINE_LIMIT).is_err(),
        "the result is the last line"
    );
    assert!(client.0.wait().unwrap().success());
    assert!(server.is_running());
}

#[test]
fn a_bad_header_closes_only_its_connection() {
    let mut server = Server::start();
    for garbage in [&b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..], b"ZLG1\x09"] {
        let mut stream = TcpStream::connect(server.addr).unwrap();
        stream.set_read_timeout(Some(LINE_LIMIT)).unwrap();
        stream.write_all(garbage).unwrap();
        // The truncated header is only refused once the client closes; the
        // bad magic may already have been answered with a reset.
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut rest = Vec::new();
        // The server closes (EOF) or resets; either way, it answers nothing.
        let _ = stream.read_to_end(&mut rest);
        assert!(rest.is_empty());
    }
    assert!(server.is_running());
    let args = ["rr", "--target", &server.target(), "--duration", "0.3"];
    let Report::Rr(rr) = report(&args) else {
        panic!("not an rr report")
    };
    assert!(rr.requests > 0, "{rr:?}");
}

#[test]
fn a_run_where_everything_fails_exits_non_zero_after_its_report() {
    // A port that was just free: connecting is refused.
    let target = ztunnel_test_support::ports::unused_loopback_port()
        .unwrap()
        .to_string();
    let output = run(&["rr", "--target", &target, "--duration", "0.3"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("nothing succeeded"), "{stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let Report::Rr(rr) = serde_json::from_str(stdout.lines().last().unwrap()).unwrap() else {
        panic!("not an rr report: {stdout}")
    };
    assert_eq!(rr.requests, 0);
    assert!(rr.errors > 0);
}

#[test]
fn dns_queries_are_answered_by_the_dns_server_with_its_address() {
    let (_server, addr) = listening(&["dns-server", "--listen", "127.0.0.1:0"]);
    let server = addr.to_string();
    let args = [
        "dns",
        "--server",
        &server,
        "--name",
        "outside.example",
        "--name",
        "a.outside.example.",
        "--in-flight",
        "4",
        "--duration",
        "0.5",
    ];
    let Report::Dns(dns) = report(&args) else {
        panic!("not a dns report")
    };
    assert_eq!(dns.server, addr);
    assert!(dns.answered > 0, "{dns:?}");
    assert_eq!(dns.with_address, dns.answered, "{dns:?}");
    assert_eq!(dns.rcodes.get("NOERROR"), Some(&dns.answered), "{dns:?}");
    assert_eq!(
        (dns.errors, dns.malformed, dns.timeouts),
        (0, 0, 0),
        "{dns:?}"
    );
    // At most the queries in flight at the end went unanswered.
    assert!(dns.sent - dns.answered <= 4, "{dns:?}");
    assert!(
        dns.queries_per_s > 0.0 && dns.latency_us.p50 > 0.0,
        "{dns:?}"
    );

    // The count bound ends the run before its time.
    let bounded = [
        "dns",
        "--server",
        &server,
        "--name",
        "outside.example",
        "--duration",
        "20",
        "--max-queries",
        "50",
    ];
    let Report::Dns(dns) = report(&bounded) else {
        panic!("not a dns report")
    };
    assert_eq!((dns.sent, dns.answered), (50, 50), "{dns:?}");
    assert!(dns.duration_s < 20.0);
}

#[test]
fn dns_counts_garbage_and_silence_without_failing() {
    // A "nameserver" that answers every datagram with noise, and one
    // request in three not at all.
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let server = socket.local_addr().unwrap().to_string();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = std::sync::Arc::clone(&stop);
    let noise = thread::spawn(move || {
        let mut buffer = [0u8; 512];
        let mut seen = 0u64;
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok((length, client)) = socket.recv_from(&mut buffer) else {
                continue;
            };
            seen += 1;
            if seen.is_multiple_of(3) {
                continue;
            }
            // The query's own id, then bytes that are no DNS message.
            let mut reply = buffer[..2.min(length)].to_vec();
            reply.extend_from_slice(&[0x81, 0x80, 0xff, 0xff, 0, 9]);
            socket.send_to(&reply, client).unwrap();
        }
    });
    let output = run(&[
        "dns",
        "--server",
        &server,
        "--name",
        "outside.example",
        "--in-flight",
        "2",
        "--duration",
        "0.6",
        "--timeout",
        "0.1",
    ]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    noise.join().unwrap();
    // Nothing was answered: the report, then a failed exit, no panic.
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("nothing succeeded"), "{stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let Report::Dns(dns) = serde_json::from_str(stdout.lines().last().unwrap()).unwrap() else {
        panic!("not a dns report: {stdout}")
    };
    assert_eq!(dns.answered, 0, "{dns:?}");
    assert!(dns.malformed > 0 && dns.timeouts > 0, "{dns:?}");
    assert_eq!(dns.errors, dns.malformed + dns.timeouts, "{dns:?}");
}

#[test]
fn help_documents_every_mode() {
    let output = loadgen().arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for mode in [
        "serve",
        "stream",
        "rr",
        "connect",
        "idle",
        "soak",
        "dns",
        "dns-server",
    ] {
        assert!(help.contains(mode), "{mode} missing from:\n{help}");
    }
}

/// Parses one of soak's lines: a line of counts while it runs, `None` for
/// anything else.
fn soak_event(line: &str) -> Option<SoakReport> {
    match serde_json::from_str(line) {
        Ok(Event::Soak(counts)) => Some(*counts),
        _ => None,
    }
}

/// Parses soak's result line.
fn soak_result(line: &str) -> SoakReport {
    let outcome: Outcome = serde_json::from_str(line).unwrap();
    let Report::Soak(counts) = outcome.report else {
        panic!("not a soak result: {line}")
    };
    counts
}

#[test]
fn soak_through_a_name_counts_every_connection_right_and_ends_with_its_result() {
    // The server listens where the name resolves first, so the soak client
    // goes through the resolver and reaches it.
    let resolved = ("localhost", 0).to_socket_addrs().unwrap().next().unwrap();
    let server = Server::start_at(resolved.ip());
    let target = format!("localhost:{}", server.addr.port());
    let args = [
        "soak",
        "--target",
        &target,
        "--connections",
        "3",
        "--rate",
        "20",
        "--duration",
        "2.2",
    ];
    let output = run(&args);
    assert!(output.status.success(), "{output:?}");
    assert!(
        output.stderr.is_empty(),
        "nothing on stderr when nothing failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    let (last, earlier) = lines.split_last().expect("no output");
    // A line a second (the second may lose its race with the end), then
    // the result.
    assert!((1..=2).contains(&earlier.len()), "{stdout}");
    let mut previous = SoakReport::default();
    for line in earlier {
        let counts = soak_event(line).unwrap_or_else(|| panic!("not a soak line: {line}"));
        assert!(counts.elapsed_s > previous.elapsed_s, "{line}");
        assert!(counts.new.ok >= previous.new.ok, "counts only grow: {line}");
        assert!(
            counts.long_lived.exchanges >= previous.long_lived.exchanges,
            "{line}"
        );
        previous = counts;
    }
    let counts = soak_result(last);
    assert!(counts.elapsed_s >= 2.2, "{last}");
    // 20 a second for 2.2 s: at most 45 paced attempts, all right.
    assert!((1..=45).contains(&counts.new.ok), "{last}");
    assert_eq!(counts.failures(), 0, "{last}");
    assert_eq!(counts.long_lived.wanted, 3);
    assert_eq!(counts.long_lived.open, 3, "{last}");
    // Each connection's first message, and more every 200 ms.
    assert!(counts.long_lived.exchanges > 3, "{last}");
    assert_eq!(counts.long_lived.replaced, 0, "{last}");
    assert!(counts.long_lived.breaks.is_empty(), "{last}");
    assert!(counts.failures.is_empty(), "{last}");
    // The name is looked up for every connection, none late on loopback.
    assert!(
        counts.resolves.ok >= counts.new.ok + 3 && counts.resolves.late == 0,
        "{last}"
    );
}

#[test]
fn soak_counts_breaks_and_refusals_when_the_server_stops_and_ends_on_sigterm() {
    let server = Server::start();
    // stderr into the same pipe as stdout, in the order written, as
    // `kubectl logs` reads a container's output.
    let mut child = Command::new("sh")
        .args([
            "-c",
            r#"exec "$0" "$@" 2>&1"#,
            env!("CARGO_BIN_EXE_ztunnel-loadgen"),
        ])
        .args(["soak", "--target", &server.target()])
        .args([
            "--connections",
            "3",
            "--rate",
            "20",
            "--duration",
            "30",
            "--timeout",
            "1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = line_reader(child.stdout.take().unwrap());
    let mut client = Running(child);
    let pid = Pid::from_raw(i32::try_from(client.0.id()).unwrap());
    // Waits for a line of counts that satisfies `condition`; a line comes
    // every second, so ten lines bound the wait.
    let wait_for = |what: &str, condition: &dyn Fn(&SoakReport) -> bool| {
        for _ in 0..10 {
            let line = lines.recv_timeout(LINE_LIMIT).unwrap();
            let counts = soak_event(&line).unwrap_or_else(|| panic!("not a soak line: {line}"));
            if condition(&counts) {
                return counts;
            }
        }
        panic!("no line shows {what}")
    };

    let before = wait_for("every connection up", &|counts| {
        counts.long_lived.open == 3 && counts.new.ok > 0
    });
    assert_eq!(before.failures(), 0, "{before:?}");
    drop(server);
    wait_for("every long-lived connection broken", &|counts| {
        counts.long_lived.broken.total() == 3 && counts.new.failed.refused > 0
    });

    kill(pid, Signal::SIGTERM).unwrap();
    // Until the output ends: lines of counts may still come, then the
    // first failure's message, then the result, last of all.
    let mut rest = Vec::new();
    while let Ok(line) = lines.recv_timeout(LINE_LIMIT) {
        rest.push(line);
        assert!(rest.len() < 10, "{rest:?}");
    }
    let [.., message, last] = &rest[..] else {
        panic!("no message and result after SIGTERM: {rest:?}")
    };
    assert!(message.starts_with("ztunnel-loadgen soak: "), "{rest:?}");
    let counts = soak_result(last);
    assert!(counts.elapsed_s < 30.0, "SIGTERM ended the run: {last}");
    assert!(client.0.wait().unwrap().success());

    // The short connections: right before the stop, refused after it (one
    // caught in flight by the stop may have been closed or reset instead).
    let failed = &counts.new.failed;
    assert!(counts.new.ok >= before.new.ok, "{last}");
    assert!(failed.refused > 0, "{last}");
    assert_eq!(
        failed.total(),
        failed.refused + failed.closed + failed.reset,
        "{last}"
    );
    // The long-lived ones: each broke once, after the last line that saw
    // it up, by the server's close or reset; replacements were refused.
    let long_lived = &counts.long_lived;
    assert_eq!(long_lived.broken.total(), 3, "{last}");
    assert_eq!(long_lived.breaks.len(), 3, "{last}");
    for broken in &long_lived.breaks {
        assert!(broken.at_s >= before.elapsed_s, "{last}");
        assert!(
            matches!(broken.kind, FailureKind::Closed | FailureKind::Reset),
            "{last}"
        );
    }
    assert_eq!(long_lived.open, 0, "{last}");
    assert_eq!(long_lived.replaced, 0, "{last}");
    assert!(long_lived.open_failed.refused > 0, "{last}");
    assert_eq!(
        long_lived.open_failed.total(),
        long_lived.open_failed.refused,
        "{last}"
    );
    // Each failure is listed with the step it came in: the breaks in an
    // exchange, the refusals at connect, with the error's words.
    let listed = |attempt| counts.failures.iter().filter(move |f| f.attempt == attempt);
    assert_eq!(listed(Attempt::Break).count(), 3, "{last}");
    assert!(
        listed(Attempt::Break).all(|f| f.step == Step::Exchange),
        "{last}"
    );
    let refusals: Vec<_> = counts
        .failures
        .iter()
        .filter(|f| f.kind == FailureKind::Refused)
        .collect();
    assert!(!refusals.is_empty(), "{last}");
    for refusal in refusals {
        assert_eq!(refusal.step, Step::Connect, "{last}");
        assert!(refusal.error.contains("refused"), "{last}");
        assert!(
            refusal.resolve_s.is_none(),
            "an address needs no lookup: {last}"
        );
    }
}
