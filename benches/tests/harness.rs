//! The harness's quick mode as a smoke test: the whole scenario set runs on
//! every path of the real two-node topology (the DNS scenarios on theirs)
//! and yields numbers. It asserts that every scenario completed and was
//! measured, never a speed.

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use ztunnel_test_support::cluster;
use ztunnel_test_support::skip::skip;

#[test]
fn quick_mode_runs_every_scenario_on_every_path_and_writes_results() {
    if let Some(reason) = cluster::unavailable() {
        skip(format_args!(
            "the benchmark topology cannot run here: {reason}"
        ));
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_ztunnel-bench"))
        .args(["--quick", "--name", "smoke", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "ztunnel-bench --quick failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("smoke.json")).unwrap())
            .unwrap();
    let runs = report["rounds"][0]["runs"].as_array().unwrap();
    let ran = |scenario: &str, path: &str| {
        runs.iter()
            .any(|run| run["scenario"] == scenario && run["path"] == path)
    };
    for scenario in ["stream1", "stream8", "rr", "connect", "idle"] {
        for path in ["direct", "tcp", "hbone", "same-node"] {
            if scenario == "idle" && path == "direct" {
                continue;
            }
            assert!(ran(scenario, path), "{scenario} did not run on {path}");
        }
    }
    // Every figure the targets name was produced, on the tunnel and beside
    // it, as a finite number.
    let figures = report["median_a"].as_object().unwrap();
    for target in ztunnel_benches::harness::TARGETS {
        for name in target.figures {
            let value = figures.get(*name).and_then(Value::as_f64);
            assert!(
                value.is_some_and(f64::is_finite),
                "{name} missing from {figures:?}"
            );
        }
    }
    // Each proxy's CPU, split into user and system time, on the tunnel and
    // on the same-node path (one ztunnel, counted once as `both`).
    for name in [
        "hbone.stream1.client.cpu_s_per_gb",
        "hbone.rr.server.cpu_us_per_request",
        "hbone.connect.client.cpu_us_per_connection",
        "same-node.rr.both.cpu_us_per_request",
        "same-node.connect.both.cpu_us_per_connection",
    ] {
        for part in ["", ".user", ".sys"] {
            let value = figures
                .get(&format!("{name}{part}"))
                .and_then(Value::as_f64);
            assert!(
                value.is_some_and(f64::is_finite),
                "{name}{part} missing from {figures:?}"
            );
        }
    }
    for path in ["direct", "tcp", "hbone", "same-node"] {
        for name in [
            "stream1.gbit_per_s",
            "rr.p50_us",
            "connect.connections_per_s",
        ] {
            let value = figures[&format!("{path}.{name}")].as_f64().unwrap();
            assert!(value > 0.0, "{path}.{name} = {value}");
        }
    }
    // The tunnelled idle connections were all held.
    assert_eq!(figures["hbone.idle.held"].as_f64(), Some(200.0));
    // DNS from the meshed client pod through its proxy, answered by the
    // proxy (the Service's VIP) or forwarded to the nameserver (its
    // address), and from the pod outside the mesh to the nameserver
    // itself: every query answered, none lost or malformed.
    for (scenario, path, address) in [
        ("dns-answered", "hbone", "198.18.254.10"),
        ("dns-forwarded", "hbone", "198.18.250.1"),
        ("dns-forwarded", "direct", "198.18.250.1"),
    ] {
        let run = runs
            .iter()
            .find(|run| run["scenario"] == scenario && run["path"] == path)
            .unwrap_or_else(|| panic!("{scenario} did not run on {path}"));
        let load = &run["load"];
        let answered = load["answered"].as_u64().unwrap();
        assert!(answered > 0, "{scenario} on {path}: {load}");
        assert_eq!(load["errors"], 0, "{scenario} on {path}: {load}");
        assert_eq!(
            load["with_address"], answered,
            "{scenario} on {path}: {load}"
        );
        assert_eq!(
            load["rcodes"]["NOERROR"], answered,
            "{scenario} on {path}: {load}"
        );
        assert_eq!(
            load["addresses"],
            serde_json::json!([address]),
            "{scenario} on {path}"
        );
        for name in ["queries_per_s", "p50_us", "p99_us"] {
            let value = figures[&format!("{path}.{scenario}.{name}")]
                .as_f64()
                .unwrap();
            assert!(value > 0.0, "{path}.{scenario}.{name} = {value}");
        }
    }
    // The meshed client's proxy did the work, and only it is read.
    for name in [
        "hbone.dns-answered.client.cpu_us_per_query",
        "hbone.dns-forwarded.client.cpu_us_per_query",
    ] {
        let value = figures[name].as_f64().unwrap();
        assert!(value > 0.0 && value.is_finite(), "{name} = {value}");
    }
    assert!(!figures.contains_key("hbone.dns-answered.server.cpu_us_per_query"));
    let markdown = std::fs::read_to_string(out.path().join("smoke.md")).unwrap();
    assert!(markdown.contains("## Targets") && markdown.contains("hbone"));
    let svg = std::fs::read_to_string(out.path().join("smoke.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("Gbit/s"));
    assert!(Path::new(&out.path().join("smoke.json")).exists());
}
