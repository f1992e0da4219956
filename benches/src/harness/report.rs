//! What a harness run writes to `benches/results/`: the JSON record of every
//! round and run, and a markdown page with the machine, the targets and the
//! figures by path. The plot is in `harness/plot.rs`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::harness::figures::{Figures, TARGETS};
use crate::harness::scenario::{Run, Sizing};
use crate::harness::topology::Path3;

/// The machine the numbers were measured on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// `model name` from `/proc/cpuinfo`.
    pub cpu: String,
    /// Cores this process may use.
    pub cores: usize,
    /// The kernel release.
    pub kernel: String,
    /// Memory, from `/proc/meminfo`, KiB.
    pub memory_kib: u64,
}

impl Machine {
    /// This machine.
    pub fn describe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Machine {
            cpu: cpuinfo
                .lines()
                .find_map(|line| line.strip_prefix("model name"))
                .and_then(|rest| rest.split_once(':'))
                .map_or_else(
                    || "unknown".to_owned(),
                    |(_, model)| model.trim().to_owned(),
                ),
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(
                |_| "unknown".to_owned(),
                |release| release.trim().to_owned(),
            ),
            memory_kib: meminfo
                .lines()
                .find_map(|line| line.strip_prefix("MemTotal:"))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or_default(),
        }
    }
}

/// One round: every scenario on every path with one build.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    /// 1-based.
    pub index: usize,
    /// Which build: `A` or `B`.
    pub build: &'static str,
    /// The runs.
    pub runs: Vec<Run>,
    /// Their figures.
    pub figures: Figures,
}

/// A whole harness run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// When it started, UTC, RFC 3339.
    pub started: String,
    /// The machine.
    pub machine: Machine,
    /// Build A, and build B when comparing.
    pub builds: Vec<PathBuf>,
    /// Extra ztunnel environment.
    pub ztunnel_env: Vec<(String, String)>,
    /// Run lengths.
    pub sizing: Sizing,
    /// Every round, in run order.
    pub rounds: Vec<Round>,
    /// Median over the rounds of build A.
    pub median_a: Figures,
    /// Median over the rounds of build B, when comparing.
    pub median_b: Option<Figures>,
    /// B/A for each figure, pair by pair, when comparing.
    pub ratios: BTreeMap<String, Vec<f64>>,
}

impl Report {
    /// Writes `<stem>.json`, `<stem>.md` (and the caller writes the plot)
    /// in `dir`.
    pub fn write(&self, dir: &Path, stem: &str) -> anyhow::Result<[PathBuf; 2]> {
        std::fs::create_dir_all(dir)?;
        let json = dir.join(format!("{stem}.json"));
        std::fs::write(&json, serde_json::to_string_pretty(self)?)?;
        let markdown = dir.join(format!("{stem}.md"));
        std::fs::write(&markdown, self.markdown(stem))?;
        Ok([json, markdown])
    }

    /// The markdown page.
    pub fn markdown(&self, stem: &str) -> String {
        let mut page = String::new();
        let machine = &self.machine;
        let _ = writeln!(page, "# Benchmark {stem}\n");
        let _ = writeln!(
            page,
            "Machine: {} ({} cores), kernel {}, {:.1} GiB. Started {}.\n",
            machine.cpu,
            machine.cores,
            machine.kernel,
            machine.memory_kib as f64 / 1024.0 / 1024.0,
            self.started
        );
        for (index, build) in self.builds.iter().enumerate() {
            let _ = writeln!(
                page,
                "- build {}: `{}`",
                ["A", "B"].get(index).unwrap_or(&"?"),
                build.display()
            );
        }
        let rounds_a = self
            .rounds
            .iter()
            .filter(|round| round.build == "A")
            .count();
        let _ = writeln!(
            page,
            "- {rounds_a} round(s) per build, {} s per timed run, {} idle connections (fewer on the tcp path when the open-files limit is too low for two descriptors each: see idle.held); {} workloads on other nodes besides the test pods; medians over rounds; ztunnel env {:?}\n",
            self.sizing.duration_s,
            self.sizing.idle_connections,
            self.sizing.mesh_size,
            self.ztunnel_env
        );
        self.targets_table(&mut page);
        self.paths_table(&mut page);
        if let Some(median_b) = &self.median_b {
            ratio_table(&mut page, &self.median_a, median_b, &self.ratios);
        }
        page
    }

    fn targets_table(&self, page: &mut String) {
        let _ = writeln!(page, "## Targets (build A)\n");
        let _ = writeln!(
            page,
            "| figure | target | measured | met |\n|---|---|---|---|"
        );
        for target in TARGETS {
            let bound = format!(
                "{} {} {}",
                if target.at_most { "≤" } else { "≥" },
                target.bound,
                target.unit
            );
            let values: Vec<Option<f64>> = target
                .figures
                .iter()
                .map(|name| self.median_a.get(*name).copied())
                .collect();
            let measured = values
                .iter()
                .zip(target.figures)
                .map(|(value, name)| {
                    let who = if name.contains(".client.") {
                        "client "
                    } else if name.contains(".server.") {
                        "server "
                    } else {
                        ""
                    };
                    value.map_or_else(
                        || format!("{who}—"),
                        |value| format!("{who}{}", number(value)),
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            let met = if values.iter().all(Option::is_some) {
                if values.iter().flatten().all(|value| target.met_by(*value)) {
                    "yes"
                } else {
                    "no"
                }
            } else {
                "not measured"
            };
            let _ = writeln!(page, "| {} | {bound} | {measured} | {met} |", target.label);
        }
        let _ = writeln!(page);
    }

    fn paths_table(&self, page: &mut String) {
        let _ = writeln!(page, "## Figures by path (build A, median)\n");
        let _ = writeln!(page, "| figure | direct | tcp | hbone |\n|---|---|---|---|");
        let mut names: Vec<&str> = self
            .median_a
            .keys()
            .filter_map(|name| name.split_once('.').map(|(_, rest)| rest))
            .collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            let cells: Vec<String> = Path3::ALL
                .iter()
                .map(|path| {
                    self.median_a
                        .get(&format!("{}.{name}", path.name()))
                        .map_or_else(|| "—".to_owned(), |value| number(*value))
                })
                .collect();
            let _ = writeln!(page, "| {name} | {} |", cells.join(" | "));
        }
        let _ = writeln!(page);
    }
}

/// A/B: the medians and the ratio of each pair.
fn ratio_table(page: &mut String, a: &Figures, b: &Figures, ratios: &BTreeMap<String, Vec<f64>>) {
    let _ = writeln!(page, "## A/B (B ÷ A, pair by pair)\n");
    let _ = writeln!(
        page,
        "| figure | A | B | B/A per pair | median B/A |\n|---|---|---|---|---|"
    );
    for (name, pairs) in ratios {
        let mut sorted = pairs.clone();
        sorted.sort_by(f64::total_cmp);
        let middle = sorted
            .get(sorted.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or(f64::NAN);
        let per_pair: Vec<String> = pairs.iter().map(|ratio| format!("{ratio:.3}")).collect();
        let _ = writeln!(
            page,
            "| {name} | {} | {} | {} | {middle:.3} |",
            a.get(name)
                .map_or_else(|| "—".to_owned(), |value| number(*value)),
            b.get(name)
                .map_or_else(|| "—".to_owned(), |value| number(*value)),
            per_pair.join(", ")
        );
    }
    let _ = writeln!(page);
}

/// A figure with as many digits as it needs.
fn number(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude >= 1000.0 {
        format!("{value:.0}")
    } else if magnitude >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.3}")
    }
}
