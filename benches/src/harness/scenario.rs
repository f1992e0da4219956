//! The scenarios: what the load generator runs on each path, and what each
//! proxy spent meanwhile. One run = one scenario on one path: the proxies'
//! CPU time (user and system) is read before and after, their memory
//! sampled while it runs.

use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use serde_json::Value;

use crate::harness::dns;
use crate::harness::perf::{Counts, Perf};
use crate::harness::process::{CpuTime, Memory, Process};
use crate::harness::topology::{Path3, ProxyRole, Topology};

/// How often memory is sampled during a run: often enough for a median
/// over a one-second quick run.
const MEMORY_SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// What a load-generator run may take beyond its own duration before it is
/// killed: start-up, connection set-up and teardown.
const RUN_SLACK: Duration = Duration::from_secs(60);
/// The request and response size of the request/response scenarios: the
/// 1 KiB the targets are stated for.
const RR_SIZE: &str = "1024";
/// The request rate of the fixed-rate request/response scenario.
const RR_FIXED_RATE: &str = "1000";
/// How long idle connections settle before their memory is read: the
/// proxies finish their per-connection set-up and release transient
/// buffers.
const IDLE_SETTLE: Duration = Duration::from_secs(1);

/// One scenario of the set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// Bulk throughput, client to server, one connection.
    Stream1,
    /// Bulk throughput, client to server, 8 parallel connections.
    Stream8,
    /// 1 KiB request/response on one connection, closed loop.
    Rr,
    /// 1 KiB request/response on one connection at a fixed 1,000 requests
    /// a second: the latency a proxy adds under a steady, light load, not
    /// at saturation.
    Rr1k,
    /// A new connection per 1-byte request/response.
    Connect,
    /// Open and hold idle connections.
    Idle,
    /// DNS queries for the mesh's Service names, which the client pod's
    /// proxy answers itself.
    #[serde(rename = "dns-answered")]
    DnsAnswered,
    /// DNS queries for names outside the mesh, which the client pod's
    /// proxy relays to the nameserver (on the direct path the pod asks the
    /// nameserver itself).
    #[serde(rename = "dns-forwarded")]
    DnsForwarded,
}

impl Scenario {
    /// Every scenario, in run order. Idle comes first, against freshly
    /// restarted proxies, and connect right after it: a connection run
    /// leaves thousands of TIME_WAIT sockets on the proxies' accepted side
    /// for 60 s, and 10k new idle connections colliding with them stalled
    /// for over a minute when the next round's idle followed connect
    /// directly. With the stream and rr runs between, they have expired.
    /// The DNS runs open no connection and go last.
    pub const ALL: [Scenario; 8] = [
        Scenario::Idle,
        Scenario::Connect,
        Scenario::Stream1,
        Scenario::Stream8,
        Scenario::Rr,
        Scenario::Rr1k,
        Scenario::DnsAnswered,
        Scenario::DnsForwarded,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Stream1 => "stream1",
            Scenario::Stream8 => "stream8",
            Scenario::Rr => "rr",
            Scenario::Rr1k => "rr1k",
            Scenario::Connect => "connect",
            Scenario::Idle => "idle",
            Scenario::DnsAnswered => "dns-answered",
            Scenario::DnsForwarded => "dns-forwarded",
        }
    }

    /// The scenario named `name`.
    pub fn parse(name: &str) -> Option<Scenario> {
        Scenario::ALL
            .into_iter()
            .find(|scenario| scenario.name() == name)
    }

    /// Whether it runs on `path`: idle connections cost nothing to measure
    /// without a proxy. A DNS query goes from the client pod to its own
    /// node's proxy and no further, whatever the path's server, so the DNS
    /// scenarios run from one meshed client pod, the hbone path's; the
    /// forwarded one also from the direct path's pod outside the mesh,
    /// which asks the nameserver itself: the same answer without a proxy.
    pub fn runs_on(self, path: Path3) -> bool {
        match self {
            Scenario::Idle => path != Path3::Direct,
            Scenario::DnsAnswered => path == Path3::Hbone,
            Scenario::DnsForwarded => matches!(path, Path3::Hbone | Path3::Direct),
            Scenario::Stream1
            | Scenario::Stream8
            | Scenario::Rr
            | Scenario::Rr1k
            | Scenario::Connect => true,
        }
    }

    /// Whether it is one of the DNS scenarios.
    pub fn is_dns(self) -> bool {
        matches!(self, Scenario::DnsAnswered | Scenario::DnsForwarded)
    }
}

/// How long and how big the runs are.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Sizing {
    /// Seconds per timed run.
    pub duration_s: f64,
    /// Connections held by the idle scenario.
    pub idle_connections: usize,
    /// Seconds the idle connections are held after memory is read.
    pub idle_hold_s: f64,
    /// Workloads on other nodes that both proxies know besides the test
    /// pods: the size of the mesh, which no per-connection cost should
    /// follow.
    pub mesh_size: usize,
    /// DNS queries outstanding at once in the DNS scenarios.
    pub dns_in_flight: u32,
}

/// What one proxy spent during a run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ProxyCost {
    /// Its place on the path: the figures are named after it.
    pub role: ProxyRole,
    /// CPU seconds, user and system together.
    pub cpu_s: f64,
    /// CPU seconds in user space: the proxy's own code (TLS, HTTP/2, the
    /// copy loop), apart from the kernel's socket work.
    pub cpu_user_s: f64,
    /// CPU seconds in the kernel on its behalf.
    pub cpu_system_s: f64,
    /// Median resident memory during the run, KiB.
    pub steady_rss_kib: u64,
    /// Peak resident memory during the run, KiB.
    pub peak_rss_kib: u64,
    /// Resident memory before the run, KiB.
    pub before_rss_kib: u64,
    /// For the idle scenario: resident memory with every connection open
    /// and settled, KiB.
    pub holding_rss_kib: Option<u64>,
    /// System calls and context switches during the run, with `--perf`.
    pub counts: Option<Counts>,
}

/// What the two ends of the traffic (the load generator's client and its
/// server) spent during a run: the cost of the application's own socket
/// work on this machine, beside which the proxies' costs are read.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Endpoints {
    /// CPU seconds of the client, from its start to its report (its own
    /// `getrusage`); `None` from a load generator that does not report it.
    pub client_cpu_s: Option<f64>,
    /// CPU seconds of the server during the run, from `/proc`: the
    /// load-generator server, or in the DNS scenarios the nameserver.
    pub server_cpu_s: Option<f64>,
    /// CPU seconds of the whole machine during the run (`/proc/stat`, every
    /// CPU's time out of idle): the applications, the proxies, and the
    /// kernel's own threads and interrupts, which do a proxy's work when
    /// it hands bytes to the kernel (the same-node path's socket join),
    /// and are charged to no process.
    pub machine_cpu_s: Option<f64>,
}

/// One scenario on one path.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// The scenario.
    pub scenario: Scenario,
    /// The path.
    pub path: Path3,
    /// The load generator's final JSON object.
    pub load: Value,
    /// The ztunnels on the path: the client-side one (node-a), then the
    /// server-side one (node-b); on the same-node path the one ztunnel of
    /// node-a, once.
    pub proxies: Vec<ProxyCost>,
    /// The load generator's two ends.
    pub endpoints: Endpoints,
}

/// Runs `scenario` on `path` and measures both proxies; with `perf`, a
/// directory and a file name stem, also counts their system calls and
/// context switches and profiles them (not while idle connections are
/// held: there is nothing to see).
pub fn run(
    topology: &Topology,
    scenario: Scenario,
    path: Path3,
    sizing: &Sizing,
    perf: Option<(&std::path::Path, &str)>,
) -> anyhow::Result<Run> {
    let (roles, proxies): (Vec<ProxyRole>, Vec<Process>) = topology
        .proxies(path)?
        .into_iter()
        // A DNS query never leaves the client's node: the server side's
        // proxy has no part in it.
        .filter(|(role, _)| !(scenario.is_dns() && *role == ProxyRole::Server))
        .unzip();
    let (mut command, target) = topology.client(path)?;
    command.args([scenario.name_for_loadgen(), "--quiet"]);
    if !scenario.is_dns() {
        command.args(["--target", &target.to_string()]);
    }
    let duration = format!("{}", sizing.duration_s);
    match scenario {
        Scenario::Stream1 | Scenario::Stream8 => {
            let connections = if scenario == Scenario::Stream1 {
                "1"
            } else {
                "8"
            };
            command.args([
                "--connections",
                connections,
                "--duration",
                &duration,
                "--direction",
                "up",
            ]);
        }
        Scenario::Rr | Scenario::Rr1k => {
            command.args([
                "--size",
                RR_SIZE,
                "--connections",
                "1",
                "--duration",
                &duration,
            ]);
            if scenario == Scenario::Rr1k {
                command.args(["--rate", RR_FIXED_RATE]);
            }
        }
        Scenario::Connect => {
            command.args(["--duration", &duration, "--concurrency", "1"]);
        }
        Scenario::Idle => {
            let connections = idle_connections(sizing.idle_connections, path).to_string();
            let hold = format!("{}", sizing.idle_hold_s.max(60.0));
            command.args(["--connections", &connections, "--hold", &hold]);
        }
        Scenario::DnsAnswered | Scenario::DnsForwarded => {
            command
                .args(dns::loadgen_args(scenario, sizing.dns_in_flight))
                .args(["--duration", &duration]);
        }
    }
    let server = if scenario.is_dns() {
        Some(topology.nameserver())
    } else {
        topology.server(path)
    };
    let server_before = server.and_then(|server| server.cpu().ok());
    let machine_before = machine_busy_s();
    let before_cpu = cpu(&proxies)?;
    let before = memory(&proxies)?;
    for proxy in &proxies {
        proxy.reset_peak()?;
    }
    let sampler = Sampler::start(proxies.clone());
    let perf = match perf.filter(|_| scenario != Scenario::Idle) {
        Some((dir, stem)) => Some(Perf::start(&proxies, dir, stem)?),
        None => None,
    };
    let outcome = if scenario == Scenario::Idle {
        run_idle(command, &proxies, sizing)
    } else {
        run_timed(command, sizing).map(|load| (load, vec![None; proxies.len()]))
    };
    let counts = perf.map(Perf::stop).unwrap_or_default();
    let samples = sampler.stop();
    let (load, holding) = outcome.with_context(|| {
        format!(
            "{} on the {} path; ztunnel logs:\n{}",
            scenario.name(),
            path.name(),
            topology.ztunnel_logs()
        )
    })?;
    let after_cpu = cpu(&proxies)?;
    let machine_after = machine_busy_s();
    let after = memory(&proxies)?;
    let server_after = server.and_then(|server| server.cpu().ok());
    let endpoints = Endpoints {
        client_cpu_s: load.get("cpu_s").and_then(Value::as_f64),
        server_cpu_s: server_before
            .zip(server_after)
            .map(|(before, after)| after.since(before).total_s()),
        machine_cpu_s: machine_before
            .zip(machine_after)
            .map(|(before, after)| (after - before).max(0.0)),
    };
    let costs = roles
        .iter()
        .enumerate()
        .map(|(index, role)| {
            let spent = after_cpu[index].since(before_cpu[index]);
            ProxyCost {
                role: *role,
                cpu_s: spent.total_s(),
                cpu_user_s: spent.user_s,
                cpu_system_s: spent.system_s,
                steady_rss_kib: median(
                    samples
                        .iter()
                        .filter_map(|sample| sample.get(index))
                        .map(|memory| memory.rss_kib)
                        .collect(),
                ),
                peak_rss_kib: after[index].peak_kib,
                before_rss_kib: before[index].rss_kib,
                holding_rss_kib: holding.get(index).copied().flatten(),
                counts: counts.get(index).copied().flatten(),
            }
        })
        .collect();
    Ok(Run {
        scenario,
        path,
        load,
        proxies: costs,
        endpoints,
    })
}

impl Scenario {
    /// The load generator's subcommand.
    fn name_for_loadgen(self) -> &'static str {
        match self {
            Scenario::Stream1 | Scenario::Stream8 => "stream",
            Scenario::Rr | Scenario::Rr1k => "rr",
            Scenario::Connect => "connect",
            Scenario::Idle => "idle",
            Scenario::DnsAnswered | Scenario::DnsForwarded => "dns",
        }
    }
}

/// Descriptors a proxy keeps for its own use besides connections:
/// listeners, pooled HBONE connections, files.
const DESCRIPTOR_RESERVE: u64 = 200;

/// How many idle connections `path` can hold under the open-files limit
/// the proxies inherit from this process: on the tcp path each proxy holds
/// two descriptors per connection (the accepted one and its upstream), on
/// the HBONE path one (streams share the pooled connection); on the
/// same-node path the one proxy holds both ends' descriptors, two.
fn idle_connections(wanted: usize, path: Path3) -> usize {
    let per_connection = match path {
        Path3::Tcp | Path3::SameNode => 2,
        Path3::Direct | Path3::Hbone => 1,
    };
    let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(u64::MAX, |(soft, _)| soft);
    let fits = limit.saturating_sub(DESCRIPTOR_RESERVE) / per_connection;
    wanted.min(usize::try_from(fits).unwrap_or(usize::MAX))
}

/// Runs a timed load-generator client to its end and returns its result.
fn run_timed(mut command: Command, sizing: &Sizing) -> anyhow::Result<Value> {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the load generator")?;
    let deadline = Duration::from_secs_f64(sizing.duration_s) + RUN_SLACK;
    let output = wait_output(child, deadline)?;
    last_json(&output)
}

/// Runs the idle scenario: waits for the load generator to hold every
/// connection, lets them settle, reads both proxies' memory, then ends the
/// hold by closing its stdin.
fn run_idle(
    mut command: Command,
    proxies: &[Process],
    sizing: &Sizing,
) -> anyhow::Result<(Value, Vec<Option<u64>>)> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the load generator")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let (lines_tx, lines_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if lines_tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs_f64(sizing.duration_s) + RUN_SLACK;
    let holding = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = lines_rx.recv_timeout(left) else {
            let _ = child.kill();
            let output = child.wait_with_output()?;
            bail!(
                "the load generator never reported holding its connections: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        let holding = serde_json::from_str::<Value>(&line)
            .ok()
            .filter(|value| value.get("event").and_then(Value::as_str) == Some("holding"));
        if let Some(holding) = holding {
            break holding;
        }
    };
    std::thread::sleep(IDLE_SETTLE);
    let held_memory = memory(proxies)?;
    std::thread::sleep(Duration::from_secs_f64(sizing.idle_hold_s));
    // Closing stdin ends the hold; the result is the last line printed.
    drop(child.stdin.take());
    let mut final_line = None;
    let finish_by = Instant::now() + RUN_SLACK;
    while let Ok(line) = lines_rx.recv_timeout(finish_by.saturating_duration_since(Instant::now()))
    {
        final_line = Some(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    let final_line = final_line.context("the load generator did not finish after its hold")?;
    let mut load: Value = serde_json::from_str(&final_line)
        .with_context(|| format!("not JSON from the load generator: {final_line}"))?;
    if let Some(object) = load.as_object_mut() {
        object.insert("holding".into(), holding);
    }
    Ok((
        load,
        held_memory
            .iter()
            .map(|memory| Some(memory.rss_kib))
            .collect(),
    ))
}

/// Waits for a child up to `deadline`, killing it beyond, and returns its
/// stdout; a failed exit is an error carrying its stderr.
fn wait_output(child: Child, deadline: Duration) -> anyhow::Result<String> {
    let pid = child.id();
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(child.wait_with_output());
    });
    let output = match done_rx.recv_timeout(deadline) {
        Ok(output) => output?,
        Err(_) => {
            // Our own child, by PID: the waiting thread reaps it.
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            bail!("the load generator ran past {deadline:?} and was killed");
        }
    };
    if !output.status.success() {
        bail!(
            "the load generator failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The last line of the load generator's stdout, parsed.
fn last_json(stdout: &str) -> anyhow::Result<Value> {
    let line = stdout
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .context("the load generator printed nothing")?;
    serde_json::from_str(line).with_context(|| format!("not JSON from the load generator: {line}"))
}

/// The time every CPU of the machine has spent out of idle since boot,
/// seconds: the first line of `/proc/stat` (user, nice, system, irq,
/// softirq and steal; idle and iowait left out), in clock ticks.
fn machine_busy_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<f64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map(|field| field.parse().ok())
        .collect::<Option<_>>()?;
    let busy: f64 = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|index| ticks.get(*index))
        .sum();
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|ticks| *ticks > 0)
        .unwrap_or(100);
    Some(busy / per_second as f64)
}

fn cpu(proxies: &[Process]) -> anyhow::Result<Vec<CpuTime>> {
    proxies.iter().map(|proxy| proxy.cpu()).collect()
}

fn memory(proxies: &[Process]) -> anyhow::Result<Vec<Memory>> {
    proxies.iter().map(|proxy| proxy.memory()).collect()
}

fn median(mut values: Vec<u64>) -> u64 {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// Samples the proxies' memory on a thread while a run goes on.
struct Sampler {
    stop: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<Vec<Vec<Memory>>>,
}

impl Sampler {
    fn start(proxies: Vec<Process>) -> Sampler {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while let Err(mpsc::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(MEMORY_SAMPLE_EVERY)
            {
                if let Ok(sample) = memory(&proxies) {
                    samples.push(sample);
                }
            }
            samples
        });
        Sampler { stop, thread }
    }

    fn stop(self) -> Vec<Vec<Memory>> {
        let _ = self.stop.send(());
        self.thread.join().unwrap_or_default()
    }
}

/// Progress for long runs, on stderr.
pub fn announce(round: usize, label: &str, scenario: Scenario, path: Path3) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(
        stderr,
        "bench: round {round} [{label}] {} on {}",
        scenario.name(),
        path.name()
    );
}
