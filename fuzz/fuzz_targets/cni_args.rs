//! Fuzzes the CNI plugin's environment: `CNI_ARGS` alone
//! (`env::parse_k8s_args`), the variables a runtime sets
//! (`CniEnv::from_vars`), and a whole invocation with them
//! (`plugin::run`). The input is `KEY=VALUE` lines; a line without `=` is
//! `CNI_ARGS` for the first check. The configuration on stdin captures no
//! namespace, so the agent is never called.
//!
//! Properties: no panic; a pod read from `CNI_ARGS` has a namespace and a
//! name, and writing it back as `CNI_ARGS` reads the same pod; no pod is
//! read unless the runtime named one; an accepted environment has every
//! variable its command needs; the plugin succeeds exactly when the
//! environment is accepted, and otherwise answers with code 4.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ztunnel_cni::plugin;
use ztunnel_cni::plugin::env::{CniEnv, Command, parse_k8s_args};

/// A chained configuration that captures no namespace.
const STDIN: &[u8] =
    br#"{"cniVersion":"1.0.0","name":"k8s","type":"ztunnel-cni","prevResult":{"ips":[]}}"#;

fn check_args(args: &str) {
    let Ok(pod) = parse_k8s_args(args) else {
        return;
    };
    let named = args
        .split(';')
        .filter_map(|pair| pair.split_once('='))
        .any(|(key, _)| key == "K8S_POD_NAMESPACE" || key == "K8S_POD_NAME");
    let Some(pod) = pod else {
        assert!(!named, "{args:?} names a pod");
        return;
    };
    assert!(!pod.namespace.is_empty() && !pod.name.is_empty());
    for part in [&pod.namespace, &pod.name, &pod.uid] {
        assert!(!part.contains(';'));
    }
    let written = format!(
        "K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_UID={}",
        pod.namespace, pod.name, pod.uid
    );
    assert_eq!(parse_k8s_args(&written).ok(), Some(Some(pod)));
}

fn check_env(vars: &[(String, String)]) {
    let env = CniEnv::from_vars(vars.iter().cloned());
    let output = plugin::run(vars.iter().cloned(), STDIN);
    let Ok(env) = env else {
        assert!(!output.success);
        let json: serde_json::Value =
            serde_json::from_str(&output.stdout).expect("the error is JSON");
        assert_eq!(json["code"], 4, "{json}");
        return;
    };
    assert!(output.success, "{}", output.stdout);
    // The value the plugin used is the last one the runtime set.
    let last = |key: &str| {
        vars.iter()
            .rev()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value.as_str())
    };
    let command = match last("CNI_COMMAND") {
        Some("ADD") => Command::Add,
        Some("DEL") => Command::Del,
        Some("CHECK") => Command::Check,
        Some("VERSION") => Command::Version,
        other => panic!("accepted CNI_COMMAND {other:?}"),
    };
    assert_eq!(env.command, command);
    for (value, key) in [
        (&env.container_id, "CNI_CONTAINERID"),
        (&env.netns, "CNI_NETNS"),
        (&env.ifname, "CNI_IFNAME"),
    ] {
        if let Some(value) = value {
            assert!(!value.is_empty());
            assert_eq!(Some(value.as_str()), last(key));
        }
    }
    if command != Command::Version {
        assert!(env.container_id.is_some() && env.ifname.is_some());
    }
    if matches!(command, Command::Add | Command::Check) {
        assert!(env.netns.is_some());
    }
    if let Some(pod) = &env.pod {
        let args = last("CNI_ARGS").expect("a pod comes from CNI_ARGS");
        assert_eq!(parse_k8s_args(args).ok(), Some(Some(pod.clone())));
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut vars = Vec::new();
    for line in text.lines() {
        match line.split_once('=') {
            // `CNI_ARGS=K8S_POD_NAME=a;…` splits at its first `=` as a
            // runtime's environment does.
            Some((key, value)) => vars.push((key.to_owned(), value.to_owned())),
            None => check_args(line),
        }
    }
    for (key, value) in &vars {
        if key == "CNI_ARGS" {
            check_args(value);
        }
    }
    check_env(&vars);
});
