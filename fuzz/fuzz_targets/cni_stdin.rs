//! Fuzzes what the CNI plugin reads on stdin: the network configuration
//! (`PluginConfig::parse`), its `prevResult` (`result::pod_ips`,
//! `result::passthrough`), and the whole invocation (`plugin::run`) for
//! ADD, DEL, CHECK and VERSION with no Kubernetes pod named, so that the
//! agent is never called.
//!
//! Properties: no panic; an accepted configuration has a supported
//! version, an object or no `prevResult`, a socket path, and never
//! captures an excluded namespace; the pod's addresses survive the body
//! the plugin posts to the agent (`CmdAdd` JSON, Go's `net.IPNet` form);
//! passing the result through changes only `cniVersion`; the plugin always
//! prints JSON, succeeds exactly when the configuration is usable, and
//! reports failures in the spec's error form and the configuration's
//! version.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ztunnel_cni::event::{CmdAdd, IpNet};
use ztunnel_cni::plugin::config::{
    AGENT_DAEMON_SET, PluginConfig, SUPPORTED_VERSIONS, requested_version,
};
use ztunnel_cni::plugin::{self, result};

/// The variables a runtime sets for `command`, without `CNI_ARGS`: no pod
/// is named, so the plugin never contacts the agent.
fn vars(command: &str) -> Vec<(String, String)> {
    [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/var/run/netns/cni-1"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_owned(), value.to_owned()))
    .collect()
}

fn max_prefix(net: &IpNet) -> u8 {
    if net.ip.is_ipv4() { 32 } else { 128 }
}

fn check_config(config: &PluginConfig) {
    assert!(SUPPORTED_VERSIONS.contains(&config.cni_version.as_str()));
    assert!(
        config
            .prev_result
            .as_ref()
            .is_none_or(|prev| prev.is_object())
    );
    assert!(!config.agent_socket.as_os_str().is_empty());
    // An application pod's name: never one of the agent's pods.
    let app = "app-0";
    for excluded in &config.exclude_namespaces {
        assert!(!config.captures(excluded, app), "{excluded} is excluded");
    }
    for ambient in &config.ambient_namespaces {
        if ambient != "*" {
            let excluded = config.exclude_namespaces.contains(ambient);
            assert_eq!(config.captures(ambient, app), !excluded, "{ambient}");
        }
    }
    // The agent's own pods are never captured, whatever the lists say.
    if let Some(namespace) = &config.pod_namespace {
        let agent_pod = format!("{AGENT_DAEMON_SET}-x7k2p");
        assert!(!config.captures(namespace, &agent_pod), "{agent_pod}");
    }
}

fn check_prev_result(prev: &serde_json::Value, version: &str) {
    let passed = result::passthrough(prev, version);
    let (Some(passed), Some(prev)) = (passed.as_object(), prev.as_object()) else {
        panic!("prevResult is an object and stays one");
    };
    assert_eq!(passed.get("cniVersion"), Some(&version.into()));
    for (key, value) in passed.iter().filter(|(key, _)| *key != "cniVersion") {
        assert_eq!(prev.get(key), Some(value), "{key} changed");
    }
    assert_eq!(
        passed.len(),
        prev.len() + usize::from(!prev.contains_key("cniVersion"))
    );

    let Ok(ips) = result::pod_ips(&serde_json::Value::Object(prev.clone())) else {
        return;
    };
    for ip in &ips {
        assert!(ip.address.prefix_len <= max_prefix(&ip.address));
        assert_eq!(
            ip.address.mask().len(),
            usize::from(max_prefix(&ip.address) / 8)
        );
    }
    // The agent reads these addresses from the body the plugin posts.
    let event = CmdAdd {
        netns: "/var/run/netns/cni-1".into(),
        pod_name: "web-0".into(),
        pod_namespace: "shop".into(),
        ips,
        pod_uid: String::new(),
        deadline: None,
    };
    let body = serde_json::to_vec(&event).expect("an add event encodes");
    let read: CmdAdd = serde_json::from_slice(&body).expect("the agent reads the plugin's body");
    assert_eq!(read, event);
}

fn check_run(stdin: &[u8], config: Option<&PluginConfig>) {
    for command in ["ADD", "DEL", "CHECK", "VERSION"] {
        let output = plugin::run(vars(command), stdin);
        let json: serde_json::Value =
            serde_json::from_str(&output.stdout).unwrap_or_else(|error| {
                if output.stdout.is_empty() {
                    serde_json::Value::Null
                } else {
                    panic!("{command}: stdout is not JSON ({error}): {}", output.stdout)
                }
            });
        if command == "VERSION" {
            assert!(output.success);
            let requested = requested_version(stdin).unwrap_or_else(|| "1.0.0".to_owned());
            assert_eq!(json["cniVersion"], requested.as_str());
            continue;
        }
        let usable = match (command, config) {
            ("ADD", Some(config)) => config.prev_result.is_some(),
            (_, config) => config.is_some(),
        };
        assert_eq!(output.success, usable, "{command}: {}", output.stdout);
        match (output.success, config) {
            (true, Some(config)) if command == "ADD" => {
                let prev = config.prev_result.as_ref().expect("ADD needs prevResult");
                assert_eq!(json, result::passthrough(prev, &config.cni_version));
            }
            (true, _) => assert!(output.stdout.is_empty(), "{command}: {}", output.stdout),
            (false, config) => {
                let version = config.map_or("1.0.0", |config| config.cni_version.as_str());
                assert_eq!(json["cniVersion"], version);
                assert!(
                    [1, 6, 7].contains(&json["code"].as_u64().unwrap_or(0)),
                    "{json}"
                );
                assert!(json["msg"].as_str().is_some_and(|msg| !msg.is_empty()));
                assert!(json["details"].is_string());
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let config = PluginConfig::parse(data).ok();
    if let Some(config) = &config {
        check_config(config);
        if let Some(prev) = &config.prev_result {
            check_prev_result(prev, &config.cni_version);
        }
    }
    check_run(data, config.as_ref());
});
