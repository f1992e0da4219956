//! The end-to-end benchmark harness: builds the two-node topology of the
//! end-to-end tests, runs a set of scenarios with the load generator on
//! three paths (direct, through both proxies as plain TCP, through the HBONE
//! tunnel), reads what each proxy spent, and writes the figures to
//! `benches/results/` as JSON, markdown and an SVG plot.
//!
//! With a second build it runs A B A B ... on the same topology and reports
//! B/A pair by pair: on a shared, noisy machine that ratio is the
//! comparison to trust.
//!
//! Topology in `harness/topology.rs`, runs and sampling in
//! `harness/scenario.rs`, `/proc` reading in `harness/process.rs`, derived
//! figures and targets in `harness/figures.rs`, outputs in
//! `harness/report.rs` and `harness/plot.rs`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};

mod figures;
mod plot;
mod process;
mod report;
mod scenario;
mod topology;

pub use figures::{Figures, TARGETS, Target};
pub use report::{Machine, Report, Round};
pub use scenario::{ProxyCost, Run, Scenario, Sizing};
pub use topology::{Path3, Topology};

/// The warm-up before each run: a few request/response exchanges on the
/// path, so the first connection's one-off costs (the workload
/// certificate, the pooled HBONE connection) are not billed to the
/// scenario. Bounded by count, with time to spare for proxies still
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
    /// Build B, to compare A B A B.
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
    /// Where results go.
    pub out_dir: PathBuf,
    /// File name stem of the results; a UTC timestamp when absent.
    pub stem: Option<String>,
}

/// Runs the benchmark and writes its results; returns the report and the
/// files written.
pub fn run(options: &Options) -> anyhow::Result<(Report, Vec<PathBuf>)> {
    if options.rounds == 0 {
        bail!("at least one round is needed");
    }
    let started = time::OffsetDateTime::now_utc();
    let mut builds = vec![options.ztunnel.clone()];
    builds.extend(options.compare.clone());
    for build in &builds {
        if !build.exists() {
            bail!("no ztunnel binary at {}", build.display());
        }
    }
    let mut rounds = Vec::new();
    for index in 1..=options.rounds {
        for (build_index, build) in builds.iter().enumerate() {
            let label = if build_index == 0 { "A" } else { "B" };
            // A fresh topology per round and build: sockets a round leaves
            // in TIME_WAIT would otherwise slow the next round's connects
            // (re-opening 10,000 connections from one client IP within
            // TIME_WAIT took 15-33 s instead of 1.8 s), and B would run in
            // what A left behind.
            let mut topology = Topology::start(
                build,
                &options.loadgen,
                &options.ztunnel_env,
                options.sizing.mesh_size,
            )?;
            let runs = run_round(&mut topology, options, index, label)?;
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
        builds,
        ztunnel_env: options.ztunnel_env.clone(),
        sizing: options.sizing,
        rounds,
        median_a,
        median_b,
        ratios,
    };
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
    let [json, markdown] = report.write(&options.out_dir, &stem)?;
    let svg = options.out_dir.join(format!("{stem}.svg"));
    plot::write(&report.median_a, &svg).context("drawing the plot")?;
    Ok((report, vec![json, markdown, svg]))
}

/// One round with the running build: every scenario on every path.
fn run_round(
    topology: &mut Topology,
    options: &Options,
    index: usize,
    label: &str,
) -> anyhow::Result<Vec<Run>> {
    let mut runs = Vec::new();
    for scenario in &options.scenarios {
        if *scenario == Scenario::Idle {
            // Memory per idle connection is read against a fresh process:
            // one that has run bulk traffic keeps freed buffers that idle
            // connections would then reuse unseen.
            topology.restart_ztunnels()?;
        }
        for path in options
            .paths
            .iter()
            .copied()
            .filter(|path| scenario.runs_on(*path))
        {
            scenario::announce(index, label, *scenario, path);
            warm_up(topology, path)?;
            runs.push(scenario::run(topology, *scenario, path, &options.sizing)?);
        }
    }
    Ok(runs)
}

/// A short request/response run on `path` that must succeed.
fn warm_up(topology: &Topology, path: Path3) -> anyhow::Result<()> {
    let (mut command, target) = topology.client(path)?;
    let mut child = command
        .args([
            "rr",
            "--target",
            &target.to_string(),
            "--size",
            "1",
            "--connections",
            "1",
            "--quiet",
        ])
        .args([
            "--duration",
            WARM_UP_SECONDS,
            "--max-requests",
            WARM_UP_REQUESTS,
        ])
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
