//! From runs to figures: every number the harness reports is a named value
//! (`<path>.<scenario>.<figure>`, with `client.`/`server.` for one proxy's
//! share and `both.` for every proxy on the path together), derived from
//! the load generator's result and the proxies' costs. A CPU figure has its
//! user and system parts beside it (`<figure>.user`, `<figure>.sys`).
//! Rounds are combined by median, and A/B pairs by ratio. The targets of the
//! speed work are stated here, against these names.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::harness::scenario::{ProxyCost, Run, Scenario};
use crate::harness::topology::{Path3, ProxyRole};

/// Figures of one round: name → value.
pub type Figures = BTreeMap<String, f64>;

/// The suffixes of a CPU figure's user and system parts.
pub const CPU_PARTS: [&str; 2] = ["user", "sys"];
/// Bytes in a (decimal) gigabyte, the unit of "CPU seconds per GB".
const GIGABYTE: f64 = 1e9;

/// One speed target.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// What it is, in words, as the report's table names it.
    pub label: &'static str,
    /// The figures it applies to; each must meet it.
    pub figures: &'static [&'static str],
    /// Whether a figure meets it at or below (`true`) or at or above the
    /// bound.
    pub at_most: bool,
    /// The bound.
    pub bound: f64,
    /// The unit, for tables.
    pub unit: &'static str,
}

/// The absolute targets the report checks every run's figures against:
/// those still above this machine's floor. The per-proxy CPU targets (≤ 30
/// µs per request, ≤ 120 µs per connection, ≤ 0.6 s per GB), the one-stream
/// share of direct they bound (≥ 50 %) and eight streams against one
/// (≥ 1.5×, CPU-bound on 2 cores) are retired (benches/README.md says
/// why); builds and settings are compared A/B instead.
pub const TARGETS: &[Target] = &[
    Target {
        label: "memory per idle tunnelled connection, per proxy",
        figures: &[
            "hbone.idle.client.kib_per_connection",
            "hbone.idle.server.kib_per_connection",
        ],
        at_most: true,
        bound: 4.0,
        unit: "KiB",
    },
    Target {
        label: "added p50 latency, 1 KiB request/response, both proxies",
        figures: &["hbone.rr.added_p50_us"],
        at_most: true,
        bound: 80.0,
        unit: "µs",
    },
];

impl Target {
    /// Whether `value` meets it.
    pub fn met_by(&self, value: f64) -> bool {
        if self.at_most {
            value <= self.bound
        } else {
            value >= self.bound
        }
    }
}

/// The figures of one round's runs.
pub fn of_round(runs: &[Run]) -> Figures {
    let mut figures = Figures::new();
    for run in runs {
        of_run(run, &mut figures);
    }
    for path in Path3::ALL
        .into_iter()
        .filter(|path| *path != Path3::Direct)
        .map(Path3::name)
    {
        let ratio = |top: &str, bottom: &str| -> Option<f64> {
            let (top, bottom) = (figures.get(top)?, figures.get(bottom)?);
            (*bottom > 0.0).then(|| top / bottom)
        };
        let share = ratio(
            &format!("{path}.stream1.gbit_per_s"),
            "direct.stream1.gbit_per_s",
        );
        let parallel = ratio(
            &format!("{path}.stream8.gbit_per_s"),
            &format!("{path}.stream1.gbit_per_s"),
        );
        let added = |scenario: &str, quantile: &str| match (
            figures.get(&format!("{path}.{scenario}.{quantile}_us")),
            figures.get(&format!("direct.{scenario}.{quantile}_us")),
        ) {
            (Some(through), Some(direct)) => Some(through - direct),
            _ => None,
        };
        for (name, value) in [
            ("stream1.share_of_direct", share),
            ("stream8.vs_stream1", parallel),
            ("rr.added_p50_us", added("rr", "p50")),
            ("rr1k.added_p50_us", added("rr1k", "p50")),
            ("rr1k.added_p99_us", added("rr1k", "p99")),
            ("dns-forwarded.added_p50_us", added("dns-forwarded", "p50")),
        ] {
            if let Some(value) = value {
                figures.insert(format!("{path}.{name}"), value);
            }
        }
        // The whole machine's CPU above the direct path's for the same
        // work: the proxies' cost including what they hand the kernel's
        // own threads, over the floor of the applications' socket work.
        for unit in [
            "stream1.machine.cpu_s_per_gb",
            "rr.machine.cpu_us_per_request",
            "connect.machine.cpu_us_per_connection",
        ] {
            let (Some(through), Some(direct)) = (
                figures.get(&format!("{path}.{unit}")),
                figures.get(&format!("direct.{unit}")),
            ) else {
                continue;
            };
            let above = unit.replacen(".machine.", ".machine_above_direct.", 1);
            figures.insert(format!("{path}.{above}"), through - direct);
        }
    }
    figures
}

/// Adds the figures of one run.
fn of_run(run: &Run, figures: &mut Figures) {
    let prefix = format!("{}.{}", run.path.name(), run.scenario.name());
    let mut put = |name: &str, value: Option<f64>| {
        if let Some(value) = value.filter(|value| value.is_finite()) {
            figures.insert(format!("{prefix}.{name}"), value);
        }
    };
    let load = &run.load;
    let field = |name: &str| load.get(name).and_then(Value::as_f64);
    let latency = |group: &str, quantile: &str| load.get(group)?.get(quantile)?.as_f64();
    // The amount of work each proxy's CPU time is divided by, and the name
    // of the per-unit figure.
    let per_unit: Option<(f64, &str, f64)> = match run.scenario {
        Scenario::Stream1 | Scenario::Stream8 => {
            put("gbit_per_s", field("gbit_per_s"));
            field("bytes").map(|bytes| (bytes / GIGABYTE, "cpu_s_per_gb", 1.0))
        }
        Scenario::Rr | Scenario::Rr1k => {
            put("requests_per_s", field("requests_per_s"));
            for quantile in ["p50", "p90", "p99", "p999"] {
                put(&format!("{quantile}_us"), latency("latency_us", quantile));
            }
            field("requests").map(|requests| (requests, "cpu_us_per_request", 1e6))
        }
        Scenario::Connect => {
            put("connections_per_s", field("connections_per_s"));
            put("setup_p50_us", latency("setup_us", "p50"));
            put("setup_p99_us", latency("setup_us", "p99"));
            field("connections_made").map(|made| (made, "cpu_us_per_connection", 1e6))
        }
        Scenario::Idle => {
            put("held", field("held"));
            None
        }
        Scenario::DnsAnswered | Scenario::DnsForwarded => {
            put("queries_per_s", field("queries_per_s"));
            put("p50_us", latency("latency_us", "p50"));
            put("p99_us", latency("latency_us", "p99"));
            put("errors", field("errors"));
            field("answered").map(|answered| (answered, "cpu_us_per_query", 1e6))
        }
    };
    let held = field("held");
    let per_unit = per_unit.filter(|(units, ..)| *units > 0.0);
    if let Some((units, name, scale)) = per_unit {
        let ends = [
            ("app_client", run.endpoints.client_cpu_s),
            ("app_server", run.endpoints.server_cpu_s),
            ("machine", run.endpoints.machine_cpu_s),
        ];
        for (end, cpu_s) in ends {
            put(
                &format!("{end}.{name}"),
                cpu_s.map(|cpu_s| cpu_s * scale / units),
            );
        }
    }
    let per_connection = |cost: &ProxyCost| -> Option<f64> {
        let held = held.filter(|held| *held > 0.0)?;
        let grown = cost.holding_rss_kib?.saturating_sub(cost.before_rss_kib) as f64;
        Some(grown / held)
    };
    for cost in &run.proxies {
        let proxy = cost.role.name();
        if let Some((units, name, scale)) = per_unit {
            let cpu = [cost.cpu_s, cost.cpu_user_s, cost.cpu_system_s];
            put_cpu(
                &mut put,
                &format!("{proxy}.{name}"),
                cpu.map(|s| s * scale / units),
            );
            for (count, value) in counts_per_unit(&[cost], name, units) {
                put(&format!("{proxy}.{count}"), Some(value));
            }
        }
        put(
            &format!("{proxy}.steady_rss_kib"),
            Some(cost.steady_rss_kib as f64),
        );
        put(
            &format!("{proxy}.peak_rss_kib"),
            Some(cost.peak_rss_kib as f64),
        );
        put(&format!("{proxy}.kib_per_connection"), per_connection(cost));
    }
    // Every proxy on the path together: what the same-node path's one
    // proxy is compared against.
    let separate = run.proxies.iter().all(|cost| cost.role != ProxyRole::Both);
    if run.path != Path3::Direct && separate && !run.proxies.is_empty() {
        if let Some((units, name, scale)) = per_unit {
            let mut cpu = [0.0; 3];
            for cost in &run.proxies {
                for (sum, part) in
                    cpu.iter_mut()
                        .zip([cost.cpu_s, cost.cpu_user_s, cost.cpu_system_s])
                {
                    *sum += part * scale / units;
                }
            }
            put_cpu(&mut put, &format!("both.{name}"), cpu);
            let costs: Vec<&ProxyCost> = run.proxies.iter().collect();
            for (count, value) in counts_per_unit(&costs, name, units) {
                put(&format!("both.{count}"), Some(value));
            }
        }
        let grown: Option<f64> = run.proxies.iter().map(per_connection).sum();
        put("both.kib_per_connection", grown);
    }
}

/// The `--perf` counts of `costs` together per unit of work, named after
/// the CPU figure `cpu_name`'s unit (`cpu_us_per_request` →
/// `syscalls_per_request`, `context_switches_per_request`); nothing unless
/// every one of them was counted.
fn counts_per_unit(costs: &[&ProxyCost], cpu_name: &str, units: f64) -> Vec<(String, f64)> {
    let Some((_, unit)) = cpu_name.rsplit_once("_per_") else {
        return Vec::new();
    };
    let Some(counts) = costs
        .iter()
        .map(|cost| cost.counts)
        .collect::<Option<Vec<_>>>()
    else {
        return Vec::new();
    };
    let syscalls: u64 = counts.iter().map(|counts| counts.syscalls).sum();
    let switches: u64 = counts.iter().map(|counts| counts.context_switches).sum();
    vec![
        (format!("syscalls_per_{unit}"), syscalls as f64 / units),
        (
            format!("context_switches_per_{unit}"),
            switches as f64 / units,
        ),
    ]
}

/// Puts a CPU figure, `[total, user, system]`, as `name` with its parts
/// beside it.
fn put_cpu(put: &mut impl FnMut(&str, Option<f64>), name: &str, cpu: [f64; 3]) {
    let [total, user, system] = cpu;
    put(name, Some(total));
    for (part, value) in CPU_PARTS.iter().zip([user, system]) {
        put(&format!("{name}.{part}"), Some(value));
    }
}

/// The median of each figure over rounds (the lower middle for an even
/// count, so that the value was measured).
pub fn median(rounds: &[&Figures]) -> Figures {
    let mut values: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for figures in rounds {
        for (name, value) in figures.iter() {
            values.entry(name).or_default().push(*value);
        }
    }
    values
        .into_iter()
        .filter_map(|(name, mut values)| {
            values.sort_by(f64::total_cmp);
            let middle = values.get((values.len() - 1) / 2)?;
            Some((name.to_owned(), *middle))
        })
        .collect()
}

/// For each figure, `b / a` of every pair of rounds, in pair order.
pub fn ratios(pairs: &[(&Figures, &Figures)]) -> BTreeMap<String, Vec<f64>> {
    let mut ratios: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (a, b) in pairs {
        for (name, before) in a.iter() {
            if let Some(after) = b.get(name).filter(|_| *before != 0.0) {
                ratios.entry(name.clone()).or_default().push(after / before);
            }
        }
    }
    ratios
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::harness::perf::Counts;
    use crate::harness::scenario::Endpoints;

    /// A proxy's cost: three quarters of its CPU in user space.
    fn cost(role: ProxyRole, cpu_s: f64) -> ProxyCost {
        ProxyCost {
            role,
            cpu_s,
            cpu_user_s: cpu_s * 0.75,
            cpu_system_s: cpu_s * 0.25,
            steady_rss_kib: 20_000,
            peak_rss_kib: 30_000,
            before_rss_kib: 10_000,
            holding_rss_kib: Some(50_000),
            counts: None,
        }
    }

    fn run(scenario: Scenario, path: Path3, load: Value, cpu_s: [f64; 2]) -> Run {
        Run {
            scenario,
            path,
            load,
            proxies: vec![
                cost(ProxyRole::Client, cpu_s[0]),
                cost(ProxyRole::Server, cpu_s[1]),
            ],
            endpoints: Endpoints::default(),
        }
    }

    /// Whether `figure` is `expected`, up to rounding.
    fn close(figure: f64, expected: f64) -> bool {
        (figure - expected).abs() <= expected.abs() * 1e-9
    }

    fn same_node(scenario: Scenario, load: Value, cpu_s: f64) -> Run {
        Run {
            scenario,
            path: Path3::SameNode,
            load,
            proxies: vec![cost(ProxyRole::Both, cpu_s)],
            endpoints: Endpoints::default(),
        }
    }

    #[test]
    fn derives_per_unit_costs_and_cross_path_figures() {
        let direct_rr = Run {
            endpoints: Endpoints {
                client_cpu_s: Some(0.04),
                server_cpu_s: None,
                machine_cpu_s: Some(0.5),
            },
            ..run(
                Scenario::Rr,
                Path3::Direct,
                json!({"requests": 1000.0, "latency_us": {"p50": 20.0}}),
                [0.0, 0.0],
            )
        };
        let runs = [
            run(
                Scenario::Stream1,
                Path3::Direct,
                json!({"gbit_per_s": 10.0, "bytes": 12.5e9}),
                [0.0, 0.0],
            ),
            run(
                Scenario::Stream1,
                Path3::Hbone,
                json!({"gbit_per_s": 4.0, "bytes": 5e9}),
                [3.0, 1.5],
            ),
            run(
                Scenario::Stream8,
                Path3::Hbone,
                json!({"gbit_per_s": 6.0, "bytes": 7.5e9}),
                [4.0, 2.0],
            ),
            direct_rr,
            run(
                Scenario::Rr,
                Path3::Hbone,
                json!({"requests": 1000.0, "latency_us": {"p50": 70.0}}),
                [0.02, 0.01],
            ),
            run(
                Scenario::Idle,
                Path3::Hbone,
                json!({"held": 10000.0}),
                [0.0, 0.0],
            ),
        ];
        let figures = of_round(&runs);
        assert_eq!(figures["hbone.stream1.client.cpu_s_per_gb"], 0.6);
        assert_eq!(figures["hbone.stream1.server.cpu_s_per_gb"], 0.3);
        assert_eq!(figures["hbone.stream1.share_of_direct"], 0.4);
        assert_eq!(figures["hbone.stream8.vs_stream1"], 1.5);
        assert_eq!(figures["hbone.rr.client.cpu_us_per_request"], 20.0);
        assert_eq!(figures["hbone.rr.added_p50_us"], 50.0);
        // The application's own cost, where it was measured.
        assert_eq!(figures["direct.rr.app_client.cpu_us_per_request"], 40.0);
        assert_eq!(figures["direct.rr.machine.cpu_us_per_request"], 500.0);
        assert!(!figures.contains_key("direct.rr.app_server.cpu_us_per_request"));
        assert_eq!(figures["hbone.idle.client.kib_per_connection"], 4.0);
        assert!(
            !figures.contains_key("direct.stream1.client.cpu_s_per_gb")
                || figures["direct.stream1.client.cpu_s_per_gb"] == 0.0
        );
        // No proxy is in the way on the direct path, so none together.
        assert!(!figures.contains_key("direct.rr.both.cpu_us_per_request"));
    }

    #[test]
    fn fixed_rate_latency_machine_cost_above_direct_and_perf_counts_per_unit() {
        let with_machine = |run: Run, machine_cpu_s: f64| Run {
            endpoints: Endpoints {
                machine_cpu_s: Some(machine_cpu_s),
                ..Endpoints::default()
            },
            ..run
        };
        let latency = |p50: f64, p99: f64| json!({"requests": 10000.0, "latency_us": {"p50": p50, "p99": p99}});
        let mut hbone_rr = run(
            Scenario::Rr1k,
            Path3::Hbone,
            latency(60.0, 250.0),
            [0.1, 0.1],
        );
        hbone_rr.proxies[0].counts = Some(Counts {
            syscalls: 40_000,
            context_switches: 20_000,
        });
        hbone_rr.proxies[1].counts = Some(Counts {
            syscalls: 30_000,
            context_switches: 10_000,
        });
        let mut uncounted = run(
            Scenario::Connect,
            Path3::Hbone,
            json!({"connections_made": 100.0}),
            [0.1, 0.1],
        );
        uncounted.proxies[0].counts = Some(Counts::default());
        let runs = [
            run(
                Scenario::Rr1k,
                Path3::Direct,
                latency(20.0, 50.0),
                [0.0, 0.0],
            ),
            hbone_rr,
            uncounted,
            with_machine(
                run(
                    Scenario::Stream1,
                    Path3::Direct,
                    json!({"bytes": 1e9}),
                    [0.0, 0.0],
                ),
                0.5,
            ),
            with_machine(
                run(
                    Scenario::Stream1,
                    Path3::Hbone,
                    json!({"bytes": 2e9}),
                    [0.5, 0.5],
                ),
                3.0,
            ),
        ];
        let figures = of_round(&runs);
        assert_eq!(figures["hbone.rr1k.added_p50_us"], 40.0);
        assert_eq!(figures["hbone.rr1k.added_p99_us"], 200.0);
        // 1.5 s per GB through the tunnel against 0.5 direct.
        assert_eq!(
            figures["hbone.stream1.machine_above_direct.cpu_s_per_gb"],
            1.0
        );
        assert_eq!(figures["hbone.rr1k.client.syscalls_per_request"], 4.0);
        assert_eq!(
            figures["hbone.rr1k.server.context_switches_per_request"],
            1.0
        );
        assert_eq!(figures["hbone.rr1k.both.syscalls_per_request"], 7.0);
        assert_eq!(figures["hbone.rr1k.both.context_switches_per_request"], 3.0);
        // One proxy without counts: no figure for both, nor for it.
        assert!(figures.contains_key("hbone.connect.client.syscalls_per_connection"));
        assert!(!figures.contains_key("hbone.connect.server.syscalls_per_connection"));
        assert!(!figures.contains_key("hbone.connect.both.syscalls_per_connection"));
    }

    #[test]
    fn cpu_figures_carry_their_user_and_system_parts() {
        let figures = of_round(&[run(
            Scenario::Connect,
            Path3::Hbone,
            json!({"connections_made": 1000.0}),
            [0.2, 0.4],
        )]);
        for (name, total) in [
            ("hbone.connect.client.cpu_us_per_connection", 200.0),
            ("hbone.connect.server.cpu_us_per_connection", 400.0),
            ("hbone.connect.both.cpu_us_per_connection", 600.0),
        ] {
            assert!(close(figures[name], total), "{name}");
            assert!(
                close(figures[&format!("{name}.user")], total * 0.75),
                "{name}"
            );
            assert!(
                close(figures[&format!("{name}.sys")], total * 0.25),
                "{name}"
            );
        }
    }

    #[test]
    fn the_same_node_proxy_is_counted_once_as_both_ends() {
        let figures = of_round(&[
            same_node(
                Scenario::Rr,
                json!({"requests": 1000.0, "latency_us": {"p50": 40.0}}),
                0.05,
            ),
            same_node(Scenario::Idle, json!({"held": 10000.0}), 0.0),
        ]);
        assert!(close(figures["same-node.rr.both.cpu_us_per_request"], 50.0));
        assert!(close(
            figures["same-node.rr.both.cpu_us_per_request.user"],
            37.5
        ));
        assert_eq!(figures["same-node.rr.both.steady_rss_kib"], 20_000.0);
        assert_eq!(figures["same-node.idle.both.kib_per_connection"], 4.0);
        assert!(
            !figures
                .keys()
                .any(|name| name.contains(".client.") || name.contains(".server.")),
            "{figures:?}"
        );
    }

    #[test]
    fn dns_runs_give_queries_per_second_and_the_client_proxys_cpu_per_query() {
        let forwarded = |path: Path3, p50: f64, cpu_s: f64| Run {
            scenario: Scenario::DnsForwarded,
            path,
            load: json!({
                "answered": 20_000.0,
                "queries_per_s": 10_000.0,
                "errors": 0.0,
                "latency_us": {"p50": p50, "p99": p50 * 2.0},
            }),
            // The server side's proxy is not read for a DNS run.
            proxies: vec![cost(ProxyRole::Client, cpu_s)],
            endpoints: Endpoints {
                server_cpu_s: Some(0.1),
                ..Endpoints::default()
            },
        };
        let figures = of_round(&[
            forwarded(Path3::Direct, 50.0, 0.0),
            forwarded(Path3::Hbone, 80.0, 0.4),
        ]);
        assert_eq!(figures["hbone.dns-forwarded.queries_per_s"], 10_000.0);
        assert_eq!(figures["hbone.dns-forwarded.p99_us"], 160.0);
        assert_eq!(figures["hbone.dns-forwarded.errors"], 0.0);
        assert!(close(
            figures["hbone.dns-forwarded.client.cpu_us_per_query"],
            20.0
        ));
        assert!(close(
            figures["hbone.dns-forwarded.client.cpu_us_per_query.sys"],
            5.0
        ));
        // The nameserver's own cost per query, on both paths.
        assert!(close(
            figures["direct.dns-forwarded.app_server.cpu_us_per_query"],
            5.0
        ));
        assert_eq!(figures["hbone.dns-forwarded.added_p50_us"], 30.0);
        assert!(!figures.contains_key("hbone.dns-forwarded.server.cpu_us_per_query"));
    }

    #[test]
    fn both_sums_memory_per_connection_over_the_two_proxies() {
        let figures = of_round(&[run(
            Scenario::Idle,
            Path3::Tcp,
            json!({"held": 10000.0}),
            [0.0, 0.0],
        )]);
        assert_eq!(figures["tcp.idle.client.kib_per_connection"], 4.0);
        assert_eq!(figures["tcp.idle.both.kib_per_connection"], 8.0);
        // Resident memory of two processes is not summed.
        assert!(!figures.contains_key("tcp.idle.both.steady_rss_kib"));
    }

    #[test]
    fn median_and_ratios_combine_rounds() {
        let round = |value: f64| Figures::from([("x".to_owned(), value)]);
        let (a, b, c) = (round(3.0), round(1.0), round(2.0));
        assert_eq!(median(&[&a, &b, &c])["x"], 2.0);
        assert_eq!(median(&[&a, &b])["x"], 1.0);
        assert_eq!(ratios(&[(&b, &c), (&c, &a)])["x"], vec![2.0, 1.5]);
    }

    #[test]
    fn targets_compare_in_their_direction() {
        let most = TARGETS.iter().find(|target| target.at_most).unwrap();
        assert!(most.met_by(most.bound) && !most.met_by(most.bound * 1.01));
        let least = Target {
            at_most: false,
            ..*most
        };
        assert!(least.met_by(least.bound) && !least.met_by(least.bound * 0.99));
    }
}
