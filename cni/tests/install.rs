//! The plugin's installation on a node, against real directories: the
//! binary copy, chaining into the configuration the runtime would use,
//! repair when the primary plugin rewrites its file (by hand and by the
//! watcher), uninstall, and a real CNI chain run from the installed
//! configuration (root and the reference plugins needed; skipped without).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tempfile::TempDir;
use ztunnel_cni::agent::install::conf::EntrySettings;
use ztunnel_cni::agent::install::{ConfOutcome, InstallConfig, Installer};
use ztunnel_test_support::netns::NetNs;
use ztunnel_test_support::skip::skip;

const PLUGIN: &str = env!("CARGO_BIN_EXE_ztunnel-cni");

/// A bridge network as a provisioner writes it, in the indented form our
/// rewrites use, so that a file we put back must match it byte for byte.
const BRIDGE_CONFLIST: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "k8s-pod-network",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "ipam": {
        "type": "host-local",
        "subnet": "10.244.0.0/24",
        "routes": [
          {
            "dst": "0.0.0.0/0"
          }
        ]
      }
    },
    {
      "type": "portmap",
      "capabilities": {
        "portMappings": true
      }
    }
  ]
}
"#;

/// A single-plugin configuration.
const BRIDGE_CONF: &str = r#"{"cniVersion":"0.4.0","name":"bridge-net","type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.244.0.0/24"}}"#;

/// How long the watcher may take to put our entry back: the repair
/// interval (5 s) plus slack for a loaded machine.
const REPAIR_WITHIN: Duration = Duration::from_secs(20);

/// A node's CNI directories in a temporary directory.
struct Node {
    root: TempDir,
}

impl Node {
    fn new() -> Node {
        Node {
            root: tempfile::tempdir().unwrap(),
        }
    }

    fn bin_dir(&self) -> PathBuf {
        self.root.path().join("opt/cni/bin")
    }

    fn conf_dir(&self) -> PathBuf {
        self.root.path().join("etc/cni/net.d")
    }

    fn conf(&self, name: &str) -> PathBuf {
        self.conf_dir().join(name)
    }

    fn agent_socket(&self) -> PathBuf {
        self.root.path().join("run/pluginevent.sock")
    }

    fn config(&self, conf_name: Option<&str>) -> InstallConfig {
        InstallConfig {
            bin_dir: self.bin_dir(),
            conf_dir: self.conf_dir(),
            conf_name: conf_name.map(str::to_owned),
            plugin_source: PathBuf::from(PLUGIN),
            plugin_name: "ztunnel-cni".to_owned(),
            entry: EntrySettings {
                agent_socket: self.agent_socket(),
                ambient_namespaces: vec!["*".to_owned()],
                exclude_namespaces: vec!["kube-system".to_owned()],
                pod_namespace: None,
            },
        }
    }

    fn installer(&self, conf_name: Option<&str>) -> Installer {
        Installer::new(self.config(conf_name)).unwrap()
    }

    /// Writes a configuration file as the primary plugin would, with `mode`.
    fn write_conf(&self, name: &str, contents: &str, mode: u32) {
        fs::create_dir_all(self.conf_dir()).unwrap();
        let path = self.conf(name);
        fs::write(&path, contents).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn listing(&self, dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|item| item.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn json_of(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

fn plugin_types(path: &Path) -> Vec<String> {
    json_of(path)["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|plugin| plugin["type"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_binary_is_copied_whole_with_mode_0755_and_no_temporary_file_left() {
    let node = Node::new();
    node.write_conf("10-bridge.conflist", BRIDGE_CONFLIST, 0o644);
    let installer = node.installer(None);
    let outcome = installer.install().unwrap();
    assert!(outcome.binary_copied);

    let installed = node.bin_dir().join("ztunnel-cni");
    assert_eq!(installed, installer.installed_binary());
    assert_eq!(fs::read(&installed).unwrap(), fs::read(PLUGIN).unwrap());
    assert_eq!(mode(&installed), 0o755);
    assert_eq!(node.listing(&node.bin_dir()), ["ztunnel-cni"]);
    assert_eq!(node.listing(&node.conf_dir()), ["10-bridge.conflist"]);

    // In place: not copied again. Damaged, missing or with another mode:
    // copied again.
    assert!(!installer.check_and_repair().unwrap().binary_copied);
    let damage: [&dyn Fn(); 3] = [
        &|| fs::write(&installed, b"#!/bin/sh\n").unwrap(),
        &|| fs::remove_file(&installed).unwrap(),
        &|| fs::set_permissions(&installed, fs::Permissions::from_mode(0o700)).unwrap(),
    ];
    for damage in damage {
        damage();
        assert!(!installer.is_installed().unwrap());
        assert!(installer.check_and_repair().unwrap().binary_copied);
        assert_eq!(fs::read(&installed).unwrap(), fs::read(PLUGIN).unwrap());
        assert_eq!(mode(&installed), 0o755);
        assert_eq!(node.listing(&node.bin_dir()), ["ztunnel-cni"]);
    }
}

#[test]
fn a_bridge_conflist_gets_our_entry_last_and_a_correct_file_is_not_rewritten() {
    let node = Node::new();
    node.write_conf("10-bridge.conflist", BRIDGE_CONFLIST, 0o644);
    let installer = node.installer(None);
    let state = installer.state();
    assert!(!state.is_ready());

    let path = node.conf("10-bridge.conflist");
    assert_eq!(
        installer.install().unwrap().conf,
        ConfOutcome::Written(path.clone())
    );
    assert!(state.is_ready());
    assert_eq!(plugin_types(&path), ["bridge", "portmap", "ztunnel-cni"]);
    assert_eq!(mode(&path), 0o644, "the file keeps its mode");
    let written = json_of(&path);
    let original: Value = serde_json::from_str(BRIDGE_CONFLIST).unwrap();
    assert_eq!(written["cniVersion"], original["cniVersion"]);
    assert_eq!(written["name"], original["name"]);
    assert_eq!(written["plugins"][0], original["plugins"][0]);
    assert_eq!(written["plugins"][1], original["plugins"][1]);
    assert_eq!(
        written["plugins"][2],
        json!({
            "name": "ztunnel-cni",
            "type": "ztunnel-cni",
            "agent_socket": node.agent_socket(),
            "ambient_namespaces": ["*"],
            "exclude_namespaces": ["kube-system"],
        })
    );
    // Our entry comes after the original text, which is unchanged.
    let text = fs::read_to_string(&path).unwrap();
    let original_head = BRIDGE_CONFLIST.trim_end().trim_end_matches("}").trim_end();
    let original_head = original_head.trim_end_matches(']').trim_end();
    assert!(text.starts_with(original_head), "{text}");
    assert_eq!(node.listing(&node.conf_dir()), ["10-bridge.conflist"]);

    let before = (
        fs::read(&path).unwrap(),
        fs::metadata(&path).unwrap().modified().unwrap(),
    );
    std::thread::sleep(Duration::from_millis(20));
    for outcome in [
        installer.install().unwrap(),
        installer.check_and_repair().unwrap(),
    ] {
        assert_eq!(outcome.conf, ConfOutcome::Unchanged(path.clone()));
        assert!(!outcome.binary_copied);
    }
    let after = (
        fs::read(&path).unwrap(),
        fs::metadata(&path).unwrap().modified().unwrap(),
    );
    assert_eq!(before, after, "an already correct file is not rewritten");
    assert!(installer.is_installed().unwrap());
}

#[test]
fn a_conf_is_wrapped_into_a_conflist_and_the_conf_removed() {
    let node = Node::new();
    node.write_conf("10-bridge.conf", BRIDGE_CONF, 0o640);
    let installer = node.installer(None);
    let list = node.conf("10-bridge.conflist");
    assert_eq!(
        installer.install().unwrap().conf,
        ConfOutcome::Written(list.clone())
    );
    assert_eq!(node.listing(&node.conf_dir()), ["10-bridge.conflist"]);
    assert_eq!(mode(&list), 0o640, "the list keeps the .conf's mode");

    let mut old: Value = serde_json::from_str(BRIDGE_CONF).unwrap();
    old.as_object_mut().unwrap().remove("cniVersion");
    let written = json_of(&list);
    assert_eq!(written["name"], "k8s-pod-network");
    assert_eq!(written["cniVersion"], "0.3.1");
    assert_eq!(written["plugins"][0], old);
    assert_eq!(written["plugins"][1]["type"], "ztunnel-cni");
    assert_eq!(written["plugins"].as_array().unwrap().len(), 2);
    assert_eq!(
        installer.check_and_repair().unwrap().conf,
        ConfOutcome::Unchanged(list)
    );
}

#[test]
fn the_first_valid_file_is_chosen_and_nothing_valid_means_waiting() {
    let node = Node::new();
    let installer = node.installer(None);
    let state = installer.state();
    assert_eq!(installer.install().unwrap().conf, ConfOutcome::Waiting);
    assert!(!state.is_ready());
    assert!(
        node.bin_dir().join("ztunnel-cni").exists(),
        "the binary does not wait"
    );

    node.write_conf("05-half-written.conflist", r#"{"plugins":[{"type":"#, 0o644);
    node.write_conf("notes.txt", "not a configuration", 0o644);
    assert_eq!(
        installer.check_and_repair().unwrap().conf,
        ConfOutcome::Waiting
    );

    node.write_conf("20-b.conflist", BRIDGE_CONFLIST, 0o644);
    node.write_conf("10-a.conflist", BRIDGE_CONFLIST, 0o644);
    let first = node.conf("10-a.conflist");
    assert_eq!(
        installer.check_and_repair().unwrap().conf,
        ConfOutcome::Written(first.clone())
    );
    assert!(state.is_ready());
    assert_eq!(
        plugin_types(&node.conf("20-b.conflist")),
        ["bridge", "portmap"]
    );
    assert_eq!(
        fs::read_to_string(node.conf("05-half-written.conflist")).unwrap(),
        r#"{"plugins":[{"type":"#
    );

    // A new file sorting first takes over; the old one keeps its entry.
    node.write_conf("01-new.conflist", BRIDGE_CONFLIST, 0o644);
    assert!(!installer.is_installed().unwrap());
    let newest = node.conf("01-new.conflist");
    assert_eq!(
        installer.check_and_repair().unwrap().conf,
        ConfOutcome::Written(newest)
    );
}

#[test]
fn a_named_file_is_used_through_its_conf_or_conflist_twin() {
    let node = Node::new();
    node.write_conf("10-a.conflist", BRIDGE_CONFLIST, 0o644);
    let installer = node.installer(Some("20-b.conflist"));
    assert_eq!(installer.install().unwrap().conf, ConfOutcome::Waiting);

    node.write_conf("20-b.conf", BRIDGE_CONF, 0o644);
    let list = node.conf("20-b.conflist");
    assert_eq!(
        installer.check_and_repair().unwrap().conf,
        ConfOutcome::Written(list.clone())
    );
    assert_eq!(plugin_types(&list), ["bridge", "ztunnel-cni"]);
    assert_eq!(
        plugin_types(&node.conf("10-a.conflist")),
        ["bridge", "portmap"]
    );

    let named_conf = Installer::new(node.config(Some("20-b.conf"))).unwrap();
    assert_eq!(
        named_conf.check_and_repair().unwrap().conf,
        ConfOutcome::Unchanged(list)
    );
}

#[test]
fn a_file_rewritten_by_the_primary_plugin_gets_our_entry_back() {
    let node = Node::new();
    node.write_conf("10-bridge.conflist", BRIDGE_CONFLIST, 0o644);
    let installer = node.installer(None);
    installer.install().unwrap();
    let path = node.conf("10-bridge.conflist");

    node.write_conf("10-bridge.conflist", BRIDGE_CONFLIST, 0o644);
    assert!(!installer.is_installed().unwrap());
    assert_eq!(
        installer.check_and_repair().unwrap().conf,
        ConfOutcome::Written(path.clone())
    );
    assert_eq!(plugin_types(&path), ["bridge", "portmap", "ztunnel-cni"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_puts_back_what_the_primary_plugin_or_a_cleanup_removed() {
    let node = Node::new();
    node.write_conf("10-bridge.conflist", BRIDGE_CONFLIST, 0o644);
    let installer = node.installer(None);
    installer.install().unwrap();
    let state = installer.state();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let watcher = tokio::spawn(installer.watch(async {
        let _ = stopped.await;
    }));
    let path = node.conf("10-bridge.conflist");
    let binary = node.bin_dir().join("ztunnel-cni");
    let repaired = || {
        plugin_types(&path) == ["bridge", "portmap", "ztunnel-cni"]
            && binary.exists()
            && fs::read(&binary).unwrap() == fs::read(PLUGIN).unwrap()
    };
    let wait_until_repaired = || async {
        let started = Instant::now();
        while !(repaired() && state.is_ready()) {
            assert!(
                started.elapsed() < REPAIR_WITHIN,
                "not repaired: {:?}",
                plugin_types(&path)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        started.elapsed()
    };
    wait_until_repaired().await;

    // The primary plugin writes its file again, without our entry: first in
    // place, then through a temporary file and a rename.
    node.write_conf("10-bridge.conflist", BRIDGE_CONFLIST, 0o644);
    eprintln!(
        "in-place rewrite repaired after {:?}",
        wait_until_repaired().await
    );
    let temp = node.conf(".10-bridge.tmp");
    fs::write(&temp, BRIDGE_CONFLIST).unwrap();
    fs::rename(&temp, &path).unwrap();
    eprintln!(
        "renamed rewrite repaired after {:?}",
        wait_until_repaired().await
    );

    // Someone removes our binary.
    fs::remove_file(&binary).unwrap();
    eprintln!("binary restored after {:?}", wait_until_repaired().await);

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), watcher)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!state.is_ready(), "a stopped watcher reports not ready");
}

#[test]
fn uninstall_restores_the_original_file_and_removes_the_binary() {
    let node = Node::new();
    node.write_conf("10-bridge.conflist", BRIDGE_CONFLIST, 0o644);
    let installer = node.installer(None);
    installer.install().unwrap();
    let path = node.conf("10-bridge.conflist");
    let binary = installer.installed_binary();
    let installed = fs::read(&path).unwrap();

    installer.uninstall(true).unwrap();
    assert_eq!(
        fs::read(&path).unwrap(),
        installed,
        "an upgrade leaves the entry"
    );
    assert!(binary.exists(), "an upgrade leaves the binary");
    assert!(!installer.state().is_ready());

    installer.uninstall(false).unwrap();
    assert_eq!(fs::read_to_string(&path).unwrap(), BRIDGE_CONFLIST);
    assert_eq!(mode(&path), 0o644);
    assert!(!binary.exists());
    assert!(node.listing(&node.bin_dir()).is_empty());
    assert_eq!(node.listing(&node.conf_dir()), ["10-bridge.conflist"]);
    installer.uninstall(false).unwrap();
}

#[test]
fn uninstall_leaves_a_wrapped_conf_as_a_list_without_our_entry() {
    let node = Node::new();
    node.write_conf("10-bridge.conf", BRIDGE_CONF, 0o600);
    let installer = node.installer(None);
    installer.install().unwrap();
    installer.uninstall(false).unwrap();
    let list = node.conf("10-bridge.conflist");
    assert_eq!(node.listing(&node.conf_dir()), ["10-bridge.conflist"]);
    assert_eq!(plugin_types(&list), ["bridge"]);
    assert_eq!(mode(&list), 0o600);
}

/// One plugin run of the chain: its exit and what it printed.
struct Run {
    success: bool,
    stdout: Value,
    stderr: String,
}

/// Runs the plugin of type `plugin_type` from `cni_path` inside `node`, as
/// a runtime does: the CNI environment and the plugin's configuration on
/// stdin.
fn run_plugin(
    node: &NetNs,
    pod: &NetNs,
    cni_path: &[PathBuf],
    command: &str,
    config: &Value,
) -> Run {
    let plugin_type = config["type"].as_str().unwrap();
    let binary = cni_path
        .iter()
        .map(|dir| dir.join(plugin_type))
        .find(|path| path.exists())
        .unwrap_or_else(|| panic!("no {plugin_type} in {cni_path:?}"));
    let joined: Vec<String> = cni_path
        .iter()
        .map(|dir| dir.display().to_string())
        .collect();
    let mut child = node
        .command(binary.to_str().unwrap())
        .env_clear()
        .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", pod.name())
        .env("CNI_NETNS", pod.path())
        .env("CNI_IFNAME", "eth0")
        .env(
            "CNI_ARGS",
            format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID={}", pod.name()),
        )
        .env("CNI_PATH", joined.join(":"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(config.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    Run {
        success: output.status.success(),
        stdout: serde_json::from_slice(&output.stdout).unwrap_or(Value::Null),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The configuration a runtime gives plugin `index` of `list`.
fn plugin_config(list: &Value, index: usize, prev_result: Option<&Value>) -> Value {
    let mut config = list["plugins"][index].clone();
    config["cniVersion"] = list["cniVersion"].clone();
    config["name"] = list["name"].clone();
    if let Some(prev) = prev_result {
        config["prevResult"] = prev.clone();
    }
    config
}

#[test]
fn a_real_chain_from_the_installed_file_runs_our_plugin_last() {
    if let Some(reason) = ztunnel_test_support::cni::unavailable() {
        skip(reason);
        return;
    }
    let node_ns = NetNs::create("inst-node").unwrap();
    let pod_ns = NetNs::create("inst-pod").unwrap();
    let node = Node::new();
    let ipam_dir = node.root.path().join("ipam");
    let primary = json!({
        "cniVersion": "1.0.0",
        "name": "zt-install",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "ztibr0",
                "isGateway": true,
                "ipam": {"type": "host-local", "subnet": "198.18.40.0/24", "dataDir": ipam_dir},
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    });
    node.write_conf("10-zt-install.conflist", &primary.to_string(), 0o644);
    let installer = node.installer(None);
    let path = node.conf("10-zt-install.conflist");
    assert_eq!(
        installer.install().unwrap().conf,
        ConfOutcome::Written(path.clone())
    );

    let list = json_of(&path);
    let cni_path = [
        PathBuf::from(ztunnel_test_support::cni::CNI_BIN_DIR),
        node.bin_dir(),
    ];
    let count = list["plugins"].as_array().unwrap().len();
    let mut prev: Option<Value> = None;
    let mut last = None;
    for index in 0..count {
        let config = plugin_config(&list, index, prev.as_ref());
        let run = run_plugin(&node_ns, &pod_ns, &cni_path, "ADD", &config);
        if index + 1 < count {
            assert!(
                run.success,
                "{} ADD: {} {}",
                config["type"], run.stdout, run.stderr
            );
            prev = Some(run.stdout);
        } else {
            last = Some((config, run));
        }
    }
    let (config, run) = last.unwrap();
    assert_eq!(config["type"], "ztunnel-cni", "our entry runs last");
    assert!(
        !run.success,
        "no agent listens, so ADD fails closed: {}",
        run.stdout
    );
    assert_eq!(run.stdout["code"], 11, "{}", run.stdout);
    assert_eq!(run.stdout["msg"], "node agent unreachable; try again later");
    assert_eq!(
        run.stdout["cniVersion"], "1.0.0",
        "the list's version reached our plugin"
    );
    let details = run.stdout["details"].as_str().unwrap();
    assert!(
        details.contains(node.agent_socket().to_str().unwrap()),
        "the plugin used our entry's agent_socket: {details}"
    );

    // DEL in reverse order releases the address; ours succeeds without an
    // agent.
    for index in (0..count).rev() {
        let config = plugin_config(&list, index, None);
        let run = run_plugin(&node_ns, &pod_ns, &cni_path, "DEL", &config);
        assert!(
            run.success,
            "{} DEL: {} {}",
            config["type"], run.stdout, run.stderr
        );
    }
}
