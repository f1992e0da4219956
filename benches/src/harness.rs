//! The end-to-end benchmark harness: builds the two-node topology of the
//! end-to-end tests, runs a set of scenarios with the load generator on
//! four paths (direct, through both proxies as plain TCP, through the HBONE
//! tunnel, and through the one proxy of a node to a pod on the same node),
//! reads what each proxy spent, and writes the figures to
//! `benches/results/` as JSON, markdown and an SVG plot.
//!
//! With a second build, or the same build with its own environment, it runs
//! A B A B ... on the same topology and reports B/A pair by pair: on a
//! shared, noisy machine that ratio is the comparison to trust.
//!
//! Topology in `harness/topology.rs`, runs and sampling in
//! `harness/scenario.rs`, the DNS scenarios' nameserver and queries in
//! `harness/dns.rs`, `/proc` reading in `harness/process.rs`, derived
//! figures and targets in `harness/figures.rs`, outputs in
//! `harness/report.rs` and `harness/plot.rs`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};

mod dns;
mod figures;
mod perf;
mod plot;
mod process;
mod report;
mod scenario;
mod topology;

pub use figures::{Figures, TARGETS, Target};
pub use report::{Machine, Report, Round};
pub use scenario::{ProxyCost, Run, Scenario, Sizing};
pub use topology::{Path3, ProxyRole, Topology};

/// The warm-up before each run: a few request/response exchanges on the
/// path (DNS queries before a DNS scenario), so the first connection's
/// one-off costs (the workload certificate, the pooled HBONE connection)
/// are not billed to the scenario. Bounded by count, with time to spare for proxies still
/// closing the previous run's ten thousand connections.
const WARM_UP_REQUESTS: &str = "100";
/// The longest a warm-up may run before it counts as failed.
const WARM_UP_SECONDS: &str = "5";
/// What the warm-up may take.
const WARM_UP_LIMIT: Duration = Duration::from_secs(30);

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Build A: the ztunnel binary.
    pub ztunnel: PathBuf,
    /// Build B, to compare A B A B. Without it, B is build A's binary when
    /// `env_b` is set.
    pub compare: Option<PathBuf>,
    /// The load generator binary.
    pub loadgen: PathBuf,
    /// Rounds per build.
    pub rounds: usize,
    /// The scenarios, in order.
    pub scenarios: Vec<Scenario>,
    /// The paths each scenario runs on, in order.
    pub paths: Vec<Path3>,
    /// Run lengths.
    pub sizing: Sizing,
    /// Extra environment for every ztunnel.
    pub ztunnel_env: Vec<(String, String)>,
    /// Environment for build A's ztunnels only, over `ztunnel_env`: one
    /// setting changed on one side of an A/B of the same binary.
    pub env_a: Vec<(String, String)>,
    /// Environment for build B's ztunnels only, over `ztunnel_env`.
    pub env_b: Vec<(String, String)>,
    /// Where results go.
    pub out_dir: PathBuf,
    /// File name stem of the results; a UTC timestamp when absent.
    pub stem: Option<String>,
    /// What the report calls build A and build B (e.g. `istio`, `ours`),
    /// so that its ratios read "ours/istio".
    pub names: [String; 2],
    /// Counts each proxy's system calls and context switches per unit of
    /// work and profiles it (`perf`), with the profiles' summaries in
    /// `<out_dir>/<stem>-perf/`. The counting costs the proxies some CPU:
    /// figures to compare are taken without it.
    pub perf: bool,
}

/// Runs the benchmark and writes its results; returns the report and the
/// files written.
pub fn run(options: &Options) -> anyhow::Result<(Report, Vec<PathBuf>)> {
    if options.rounds == 0 {
        bail!("at least one round is needed");
    }
    let started = time::OffsetDateTime::now_utc();
    let stem = options.stem.clone().unwrap_or_else(|| {
        format!(
            "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
            started.year(),
            u8::from(started.month()),
            started.day(),
            started.hour(),
            started.minute(),
            started.second()
        )
    });
    let perf_dir = options
        .perf
        .then(|| options.out_dir.join(format!("{stem}-perf")));
    let builds = builds(options)?;
    for build in &builds {
        if !build.binary.exists() {
            bail!("no ztunnel binary at {}", build.binary.display());
        }
    }
    let mut rounds = Vec::new();
    for index in 1..=options.rounds {
        for build in &builds {
            let label = build.label;
            // The build's own settings after the common ones, so they win.
            let env: Vec<(String, String)> = options
                .ztunnel_env
                .iter()
                .chain(&build.env)
                .cloned()
                .collect();
            // A fresh topology per round and build: sockets a round leaves
            // in TIME_WAIT would otherwise slow the next round's connects
            // (re-opening 10,000 connections from one client IP within
            // TIME_WAIT took 15-33 s instead of 1.8 s), and B would run in
            // what A left behind.
            let mut topology = Topology::start(
                &build.binary,
                &options.loadgen,
                &env,
                options.sizing.mesh_size,
            )?;
            let runs = run_round(&mut topology, options, index, label, perf_dir.as_deref())?;
            drop(topology);
            let figures = figures::of_round(&runs);
            rounds.push(Round {
                index,
                build: label,
                runs,
                figures,
            });
        }
    }
    let of_build = |build: &str| -> Vec<&Figures> {
        rounds
            .iter()
            .filter(|round| round.build == build)
            .map(|round| &round.figures)
            .collect()
    };
    let median_a = figures::median(&of_build("A"));
    let (median_b, ratios) = if builds.len() > 1 {
        let pairs: Vec<(&Figures, &Figures)> =
            of_build("A").into_iter().zip(of_build("B")).collect();
        (
            Some(figures::median(&of_build("B"))),
            figures::ratios(&pairs),
        )
    } else {
        (None, Default::default())
    };
    let report = Report {
        started: started
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        machine: Machine::describe(),
        builds: builds.iter().map(|build| build.binary.clone()).collect(),
        names: options.names.clone(),
        ztunnel_env: options.ztunnel_env.clone(),
        build_env: builds.into_iter().map(|build| build.env).collect(),
        sizing: options.sizing,
        rounds,
        median_a,
        median_b,
        ratios,
    };
    let [json, markdown] = report.write(&options.out_dir, &stem)?;
    let svg = options.out_dir.join(format!("{stem}.svg"));
    plot::write(&report.median_a, &svg).context("drawing the plot")?;
    let mut files = vec![json, markdown, svg];
    if report.median_b.is_some() {
        let per_round = options.out_dir.join(format!("{stem}-rounds.svg"));
        plot::write_rounds(&report.rounds, &report.names, &per_round)
            .context("drawing the per-round plot")?;
        files.push(per_round);
    }
    Ok((report, files))
}

/// One side of an A/B: a binary and the settings of its ztunnels.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Build {
    /// `A` or `B`.
    label: &'static str,
    /// The ztunnel binary.
    binary: PathBuf,
    /// Its own environment, over the common one.
    env: Vec<(String, String)>,
}

/// The builds `options` asks for: A, and B when there is a second binary or
/// a B environment (the same binary with a setting changed).
fn builds(options: &Options) -> anyhow::Result<Vec<Build>> {
    let mut builds = vec![Build {
        label: "A",
        binary: options.ztunnel.clone(),
        env: options.env_a.clone(),
    }];
    if options.compare.is_some() || !options.env_b.is_empty() {
        builds.push(Build {
            label: "B",
            binary: options
                .compare
                .clone()
                .unwrap_or_else(|| options.ztunnel.clone()),
            env: options.env_b.clone(),
        });
    } else if !options.env_a.is_empty() {
        bail!(
            "an environment for build A alone needs a build B to compare with \
             (--compare or --env-b); for one build, --env sets it"
        );
    }
    Ok(builds)
}

/// A `KEY=VALUE` setting: the key before the first `=`, not empty; the
/// value may be empty or hold more `=`.
pub fn parse_env(pair: &str) -> Option<(String, String)> {
    match pair.split_once('=') {
        Some((key, value)) if !key.is_empty() => Some((key.to_owned(), value.to_owned())),
        _ => None,
    }
}

/// One round with the running build: every scenario on every path.
fn run_round(
    topology: &mut Topology,
    options: &Options,
    index: usize,
    label: &str,
    perf_dir: Option<&std::path::Path>,
) -> anyhow::Result<Vec<Run>> {
    let mut runs = Vec::new();
    for scenario in &options.scenarios {
        for path in options
            .paths
            .iter()
            .copied()
            .filter(|path| scenario.runs_on(*path))
        {
            if *scenario == Scenario::Idle {
                // Memory per idle connection is read against a fresh
                // process, on every path: one that has run bulk traffic, or
                // held the last path's idle connections (node-a's proxy is
                // on every path), keeps freed memory that idle connections
                // would then reuse unseen.
                topology.restart_ztunnels()?;
            }
            scenario::announce(index, label, *scenario, path);
            warm_up(topology, *scenario, path)?;
            let perf_stem = format!("{index}{label}-{}-{}", path.name(), scenario.name());
            let perf = perf_dir.map(|dir| (dir, perf_stem.as_str()));
            runs.push(scenario::run(
                topology,
                *scenario,
                path,
                &options.sizing,
                perf,
            )?);
        }
    }
    Ok(runs)
}

/// A short run on `path` that must succeed: request/response, or before a
/// DNS scenario, its queries one at a time.
fn warm_up(topology: &Topology, scenario: Scenario, path: Path3) -> anyhow::Result<()> {
    let (mut command, target) = topology.client(path)?;
    if scenario.is_dns() {
        command
            .args(["dns", "--quiet", "--max-queries", WARM_UP_REQUESTS])
            .args(dns::loadgen_args(scenario, 1));
    } else {
        command.args([
            "rr",
            "--target",
            &target.to_string(),
            "--size",
            "1",
            "--connections",
            "1",
            "--quiet",
            "--max-requests",
            WARM_UP_REQUESTS,
        ]);
    }
    let mut child = command
        .args(["--duration", WARM_UP_SECONDS])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the warm-up")?;
    let finished = ztunnel_test_support::wait::until(WARM_UP_LIMIT, || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if !finished {
        let _ = child.kill();
    }
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!(
            "warm-up on the {} path failed: {}\nztunnel logs:\n{}",
            path.name(),
            String::from_utf8_lossy(&output.stderr),
            topology.ztunnel_logs()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(compare: Option<&str>, env_a: &[(&str, &str)], env_b: &[(&str, &str)]) -> Options {
        let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
                .collect()
        };
        Options {
            ztunnel: PathBuf::from("x/ztunnel"),
            compare: compare.map(PathBuf::from),
            loadgen: PathBuf::from("x/ztunnel-loadgen"),
            rounds: 1,
            scenarios: vec![Scenario::Rr],
            paths: vec![Path3::SameNode],
            sizing: Sizing {
                duration_s: 1.0,
                idle_connections: 1,
                idle_hold_s: 0.0,
                mesh_size: 0,
                dns_in_flight: 1,
            },
            ztunnel_env: Vec::new(),
            env_a: env(env_a),
            env_b: env(env_b),
            out_dir: PathBuf::from("out"),
            stem: None,
            names: ["A".to_owned(), "B".to_owned()],
            perf: false,
        }
    }

    /// A build as (label, binary, environment).
    type Described = (&'static str, String, Vec<(String, String)>);

    fn described(options: &Options) -> Vec<Described> {
        builds(options)
            .unwrap()
            .into_iter()
            .map(|build| (build.label, build.binary.display().to_string(), build.env))
            .collect()
    }

    #[test]
    fn one_build_alone_is_a() {
        let one = described(&options(None, &[], &[]));
        assert_eq!(one, vec![("A", "x/ztunnel".to_owned(), Vec::new())]);
    }

    #[test]
    fn a_second_binary_is_b() {
        let two = described(&options(Some("y/ztunnel"), &[], &[]));
        assert_eq!(two.len(), 2);
        assert_eq!(two[1].0, "B");
        assert_eq!(two[1].1, "y/ztunnel");
    }

    #[test]
    fn the_same_binary_with_a_setting_changed_on_one_side_is_an_a_b() {
        let off = [("SAME_NODE_SHORTCUT", "false")];
        // The setting on A, B the same binary named again.
        let named = described(&options(Some("x/ztunnel"), &off, &[]));
        assert_eq!(
            named[0].2,
            vec![("SAME_NODE_SHORTCUT".to_owned(), "false".to_owned())]
        );
        assert_eq!((named[1].1.as_str(), named[1].2.len()), ("x/ztunnel", 0));
        // The setting on B alone: B is A's binary.
        let implied = described(&options(None, &[], &off));
        assert_eq!(implied.len(), 2);
        assert_eq!(implied[1].1, "x/ztunnel");
        assert_eq!(implied[1].2[0].1, "false");
    }

    #[test]
    fn a_setting_for_a_with_nothing_to_compare_is_refused() {
        let alone = options(None, &[("SAME_NODE_SHORTCUT", "false")], &[]);
        assert!(builds(&alone).is_err());
    }

    #[test]
    fn settings_parse_at_the_first_equals_sign() {
        let cases = [
            (
                "SAME_NODE_SHORTCUT=false",
                Some(("SAME_NODE_SHORTCUT", "false")),
            ),
            (
                "RUST_LOG=info,access=debug",
                Some(("RUST_LOG", "info,access=debug")),
            ),
            ("EMPTY=", Some(("EMPTY", ""))),
            ("=value", None),
            ("NO_EQUALS", None),
            ("", None),
        ];
        for (pair, expected) in cases {
            let expected = expected.map(|(key, value)| (key.to_owned(), value.to_owned()));
            assert_eq!(parse_env(pair), expected, "{pair:?}");
        }
    }
}
