//! `ztunnel-bench`: runs the end-to-end benchmark (see the harness module of
//! `ztunnel-benches`) and prints where the results went. Needs root, `ip`,
//! `iptables` and the CNI plugins, like the end-to-end tests.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use ztunnel_benches::harness::{self, Options, Path3, Scenario, Sizing};
use ztunnel_certs::error_chain;

/// Benchmarks ztunnel on four paths (direct, plain TCP through both
/// proxies, HBONE between the nodes, HBONE within one node) in a two-node
/// in-pod mesh on this machine.
#[derive(Debug, Parser)]
#[command(name = "ztunnel-bench", version)]
struct Args {
    /// The ztunnel binary to measure (build A); any build that takes the
    /// same environment and local config file. Default: `ztunnel` next to
    /// this binary.
    #[arg(long)]
    ztunnel: Option<PathBuf>,
    /// A second build (B): rounds alternate A B A B and the report gives
    /// B/A pair by pair. May be the same binary as A, with --env-a or
    /// --env-b setting the two apart.
    #[arg(long)]
    compare: Option<PathBuf>,
    /// Rounds per build; figures are medians over rounds.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds per timed run.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Connections held by the idle scenario.
    #[arg(long, default_value_t = 10_000)]
    idle_connections: usize,
    /// Comma-separated scenarios, run in the order given.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "idle,connect,stream1,stream8,rr,dns-answered,dns-forwarded"
    )]
    scenarios: Vec<String>,
    /// Comma-separated paths: direct, tcp, hbone, same-node. Figures
    /// relative to direct need direct.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "direct,tcp,hbone,same-node"
    )]
    paths: Vec<String>,
    /// A few seconds per scenario, one round, few idle connections: proves
    /// every scenario runs and yields numbers (the CI smoke run). Overrides
    /// --rounds, --duration and --idle-connections.
    #[arg(long)]
    quick: bool,
    /// `KEY=VALUE` set in every ztunnel's environment (repeatable), e.g.
    /// ZTUNNEL_WORKER_THREADS=2.
    #[arg(long = "env")]
    env: Vec<String>,
    /// `KEY=VALUE` set in build A's ztunnels only, after --env
    /// (repeatable); needs a build B (--compare or --env-b), e.g.
    /// `--compare X --env-a SAME_NODE_SHORTCUT=false` for the same build
    /// with a setting off on A.
    #[arg(long = "env-a")]
    env_a: Vec<String>,
    /// `KEY=VALUE` set in build B's ztunnels only, after --env
    /// (repeatable). Without --compare, B is build A's binary: the same
    /// build, A B A B, with this setting changed on B.
    #[arg(long = "env-b", visible_alias = "compare-env")]
    env_b: Vec<String>,
    /// Workloads on other nodes added to the proxies' configuration (at
    /// most 131,072; past 65,536 their addresses are IPv6): the size of the
    /// mesh, against which per-connection costs and memory are measured.
    #[arg(long, default_value_t = 0)]
    mesh_size: usize,
    /// DNS queries outstanding at once in the DNS scenarios (at most 64:
    /// the DNS proxy drops a pod's UDP queries beyond that many).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    dns_in_flight: u32,
    /// Directory for the results.
    #[arg(long, default_value = "benches/results")]
    out: PathBuf,
    /// File name stem of the results (default: the start time, UTC).
    #[arg(long)]
    name: Option<String>,
    /// What the report calls build A (--ztunnel), e.g. `istio`.
    #[arg(long, default_value = "A")]
    name_a: String,
    /// What the report calls build B (--compare), e.g. `ours`: ratios are
    /// B/A, so with istio/ztunnel as A they read ours/istio.
    #[arg(long, default_value = "B")]
    name_b: String,
    /// Also count each proxy's system calls and context switches per unit
    /// of work and profile it, with `perf` (root): figures
    /// `syscalls_per_*` and `context_switches_per_*`, and each run's
    /// profile summary in `<out>/<stem>-perf/`. Counting costs the proxies
    /// some CPU: take the figures to compare from runs without it.
    #[arg(long)]
    perf: bool,
}

fn main() -> ExitCode {
    error_chain::exit_code("ztunnel-bench", run())
}

fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    raise_open_files_limit();
    let here = std::env::current_exe()?;
    let dir = here.parent().context("binary without a directory")?;
    let scenarios = args
        .scenarios
        .iter()
        .map(|name| Scenario::parse(name).with_context(|| format!("unknown scenario {name}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let paths = args
        .paths
        .iter()
        .map(|name| Path3::parse(name).with_context(|| format!("unknown path {name}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let ztunnel_env = settings("--env", &args.env)?;
    let env_a = settings("--env-a", &args.env_a)?;
    let env_b = settings("--env-b", &args.env_b)?;
    let sizing = if args.quick {
        Sizing {
            duration_s: 1.0,
            idle_connections: 200,
            idle_hold_s: 0.5,
            mesh_size: args.mesh_size,
            dns_in_flight: args.dns_in_flight,
        }
    } else {
        Sizing {
            duration_s: args.duration,
            idle_connections: args.idle_connections,
            idle_hold_s: 1.0,
            mesh_size: args.mesh_size,
            dns_in_flight: args.dns_in_flight,
        }
    };
    let options = Options {
        ztunnel: args.ztunnel.unwrap_or_else(|| dir.join("ztunnel")),
        compare: args.compare,
        loadgen: dir.join("ztunnel-loadgen"),
        rounds: if args.quick { 1 } else { args.rounds },
        scenarios,
        paths,
        sizing,
        ztunnel_env,
        env_a,
        env_b,
        out_dir: args.out,
        stem: args.name,
        names: [args.name_a, args.name_b],
        perf: args.perf,
    };
    let (report, files) = harness::run(&options)?;
    println!(
        "{}",
        report.markdown(
            &files[0]
                .file_stem()
                .map(|stem| stem.to_string_lossy().into_owned())
                .unwrap_or_default()
        )
    );
    for file in files {
        println!("wrote {}", file.display());
    }
    Ok(())
}

/// The `KEY=VALUE` settings given to `flag`.
fn settings(flag: &str, pairs: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    pairs
        .iter()
        .map(|pair| {
            harness::parse_env(pair).with_context(|| format!("{flag} {pair}: expected KEY=VALUE"))
        })
        .collect()
}

/// Open files every process of the topology may hold: a proxy on the plain
/// TCP path holds two descriptors per connection, so 10k idle connections
/// need more than the 20,000 a default hard limit may allow.
const OPEN_FILES: u64 = 262_144;

/// Raises the open-files limit, soft and hard, to [`OPEN_FILES`] (root may
/// raise the hard limit) or at least to the hard limit: the load
/// generators, their servers and the proxies inherit it.
fn raise_open_files_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(error) => {
            eprintln!("bench: cannot read the open-files limit: {error}");
            return;
        }
    };
    let wanted = OPEN_FILES.max(hard);
    if soft >= wanted {
        return;
    }
    if setrlimit(Resource::RLIMIT_NOFILE, wanted, wanted).is_ok() {
        return;
    }
    if let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        eprintln!("bench: cannot raise the open-files limit from {soft} to {hard}: {error}");
    } else {
        eprintln!(
            "bench: open files limited to {hard}; 10k idle connections on the tcp path need about 20,100"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_side_settings_are_taken_from_their_flags() {
        let args = Args::try_parse_from([
            "ztunnel-bench",
            "--ztunnel",
            "x",
            "--compare",
            "x",
            "--env",
            "ZTUNNEL_WORKER_THREADS=2",
            "--env-a",
            "SAME_NODE_SHORTCUT=false",
            "--compare-env",
            "SAME_NODE_SHORTCUT=true",
            "--env-b",
            "RUST_LOG=warn",
            "--paths",
            "same-node,hbone",
        ])
        .unwrap();
        assert_eq!(args.env, ["ZTUNNEL_WORKER_THREADS=2"]);
        assert_eq!(args.env_a, ["SAME_NODE_SHORTCUT=false"]);
        assert_eq!(args.env_b, ["SAME_NODE_SHORTCUT=true", "RUST_LOG=warn"]);
        let paths: Vec<Option<Path3>> = args.paths.iter().map(|name| Path3::parse(name)).collect();
        assert_eq!(paths, [Some(Path3::SameNode), Some(Path3::Hbone)]);
        assert!(settings("--env-a", &["NO_VALUE".to_owned()]).is_err());
    }

    #[test]
    fn every_path_runs_by_default() {
        let args = Args::try_parse_from(["ztunnel-bench"]).unwrap();
        let names: Vec<&str> = Path3::ALL.iter().map(|path| path.name()).collect();
        assert_eq!(args.paths, names);
    }
}
