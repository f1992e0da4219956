//! What a harness run writes to `benches/results/`: the JSON record of every
//! round and run, and a markdown page with the machine, the targets and the
//! figures by path. The plot is in `harness/plot.rs`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::harness::figures::{CPU_PARTS, Figures, TARGETS};
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
    /// What the report calls build A and build B.
    pub names: [String; 2],
    /// Extra ztunnel environment, for every build.
    pub ztunnel_env: Vec<(String, String)>,
    /// Environment for one build only, over `ztunnel_env`: A's, then B's
    /// when comparing.
    pub build_env: Vec<Vec<(String, String)>>,
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
            let env = self
                .build_env
                .get(index)
                .filter(|env| !env.is_empty())
                .map(|env| {
                    let pairs: Vec<String> = env
                        .iter()
                        .map(|(key, value)| format!("`{key}={value}`"))
                        .collect();
                    format!(", with {}", pairs.join(" "))
                })
                .unwrap_or_default();
            let _ = writeln!(
                page,
                "- build {} ({}): `{}`{env}",
                ["A", "B"].get(index).unwrap_or(&"?"),
                self.names.get(index).map_or("?", String::as_str),
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
            "- {rounds_a} round(s) per build, {} s per timed run, {} idle connections (fewer on the tcp and same-node paths when the open-files limit is too low for two descriptors each: see idle.held); {} workloads on other nodes besides the test pods; medians over rounds; ztunnel env {:?}\n",
            self.sizing.duration_s,
            self.sizing.idle_connections,
            self.sizing.mesh_size,
            self.ztunnel_env
        );
        self.targets_table(&mut page);
        self.paths_table(&mut page);
        if let Some(median_b) = &self.median_b {
            ratio_table(
                &mut page,
                &self.names,
                &self.median_a,
                median_b,
                &self.ratios,
            );
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
            let measured = target
                .figures
                .iter()
                .map(|name| {
                    let who = if name.contains(".client.") {
                        "client "
                    } else if name.contains(".server.") {
                        "server "
                    } else {
                        ""
                    };
                    format!("{who}{}", cell(&self.median_a, name))
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
        let _ = writeln!(
            page,
            "`client`/`server`: one proxy; `both`: every proxy on the path together \
             (client + server; on same-node the one ztunnel of node-a, counted once). \
             CPU figures: total (user + sys).\n"
        );
        let paths: Vec<&str> = Path3::ALL.iter().map(|path| path.name()).collect();
        let _ = writeln!(
            page,
            "| figure | {} |\n|---|{}",
            paths.join(" | "),
            "---|".repeat(paths.len())
        );
        let mut names: Vec<&str> = self
            .median_a
            .keys()
            .filter_map(|name| name.split_once('.').map(|(_, rest)| rest))
            .filter(|name| !is_cpu_part(name))
            .collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            let cells: Vec<String> = paths
                .iter()
                .map(|path| cell(&self.median_a, &format!("{path}.{name}")))
                .collect();
            let _ = writeln!(page, "| {name} | {} |", cells.join(" | "));
        }
        let _ = writeln!(page);
    }
}

/// A/B: the medians and the ratio of each pair, with the builds named.
fn ratio_table(
    page: &mut String,
    [name_a, name_b]: &[String; 2],
    a: &Figures,
    b: &Figures,
    ratios: &BTreeMap<String, Vec<f64>>,
) {
    let _ = writeln!(page, "## A/B: {name_b} ÷ {name_a} (B ÷ A), pair by pair\n");
    let _ = writeln!(
        page,
        "| figure | A: {name_a} | B: {name_b} | {name_b}/{name_a} per pair | spread (min–max) | median {name_b}/{name_a} |\n|---|---|---|---|---|---|"
    );
    for (name, pairs) in ratios {
        let mut sorted = pairs.clone();
        sorted.sort_by(f64::total_cmp);
        let middle = sorted
            .get(sorted.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or(f64::NAN);
        let per_pair: Vec<String> = pairs.iter().map(|ratio| format!("{ratio:.3}")).collect();
        let spread = match (sorted.first(), sorted.last()) {
            (Some(low), Some(high)) => format!("{low:.3}–{high:.3}"),
            _ => "—".to_owned(),
        };
        let _ = writeln!(
            page,
            "| {name} | {} | {} | {} | {spread} | {middle:.3} |",
            a.get(name)
                .map_or_else(|| "—".to_owned(), |value| number(*value)),
            b.get(name)
                .map_or_else(|| "—".to_owned(), |value| number(*value)),
            per_pair.join(", ")
        );
    }
    let _ = writeln!(page);
}

/// Whether `name` is the user or system part of a CPU figure, shown in the
/// cell of its total.
fn is_cpu_part(name: &str) -> bool {
    name.rsplit_once('.')
        .is_some_and(|(_, last)| CPU_PARTS.contains(&last))
}

/// A figure's cell: its value, with its user and system parts where it has
/// them ("52.0 (30.0 user + 22.0 sys)"), or "—".
fn cell(figures: &Figures, name: &str) -> String {
    let Some(value) = figures.get(name) else {
        return "—".to_owned();
    };
    let parts: Vec<String> = CPU_PARTS
        .iter()
        .filter_map(|part| {
            let value = figures.get(&format!("{name}.{part}"))?;
            Some(format!("{} {part}", number(*value)))
        })
        .collect();
    if parts.is_empty() {
        number(*value)
    } else {
        format!("{} ({})", number(*value), parts.join(" + "))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_cell_shows_its_user_and_system_parts_and_others_their_value() {
        let figures = Figures::from([
            ("hbone.rr.client.cpu_us_per_request".to_owned(), 52.0),
            ("hbone.rr.client.cpu_us_per_request.user".to_owned(), 30.0),
            ("hbone.rr.client.cpu_us_per_request.sys".to_owned(), 22.0),
            ("hbone.rr.p50_us".to_owned(), 175.1),
        ]);
        assert_eq!(
            cell(&figures, "hbone.rr.client.cpu_us_per_request"),
            "52.0 (30.0 user + 22.0 sys)"
        );
        assert_eq!(cell(&figures, "hbone.rr.p50_us"), "175.1");
        assert_eq!(cell(&figures, "tcp.rr.p50_us"), "—");
        assert!(is_cpu_part("rr.client.cpu_us_per_request.user"));
        assert!(!is_cpu_part("rr.client.cpu_us_per_request"));
    }
}
