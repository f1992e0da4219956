//! The plugin binary's contract with the runtime that needs no root:
//! VERSION, and errors for a bad environment or configuration.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

fn run(env: &[(&str, &str)], stdin: &str) -> (bool, Value) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ztunnel-cni"))
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let json = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    (output.status.success(), json)
}

#[test]
fn version_lists_supported_versions() {
    let (ok, json) = run(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"0.4.0"}"#);
    assert!(ok);
    assert_eq!(json["cniVersion"], "0.4.0");
    assert_eq!(
        json["supportedVersions"],
        serde_json::json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0"])
    );
}

#[test]
fn bad_invocations_are_cni_errors() {
    let add = |extra: &[(&'static str, &'static str)]| {
        let mut env = vec![
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/run/netns/none"),
            ("CNI_IFNAME", "eth0"),
        ];
        env.extend_from_slice(extra);
        env
    };
    let chained = r#"{"cniVersion":"1.0.0","name":"k","type":"ztunnel-cni","prevResult":{"cniVersion":"1.0.0","ips":[]}}"#;
    let cases = [
        (vec![("CNI_COMMAND", "ADD")], chained.to_owned(), 4),
        (add(&[]), "{".to_owned(), 6),
        (add(&[]), r#"{"cniVersion":"0.1.0"}"#.to_owned(), 1),
        (
            add(&[]),
            r#"{"cniVersion":"1.0.0","name":"k"}"#.to_owned(),
            7,
        ),
        (add(&[("CNI_ARGS", "K8S_POD_NAME")]), chained.to_owned(), 4),
    ];
    for (env, stdin, code) in cases {
        let (ok, json) = run(&env, &stdin);
        assert!(!ok, "{env:?} {stdin}");
        assert_eq!(json["code"], code, "{env:?} {stdin}: {json}");
        assert!(
            json["msg"].is_string() && json["details"].is_string(),
            "{json}"
        );
    }
    // A container that is not a Kubernetes pod passes through.
    let (ok, json) = run(&add(&[]), chained);
    assert!(ok, "{json}");
    assert_eq!(json["ips"], serde_json::json!([]));
}
