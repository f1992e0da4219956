//! Table tests of the pure install decisions: file choice, insertion,
//! removal, the validity check, the entry the plugin reads, and the watch
//! loop's throttle. The filesystem side is tested in `cni/tests/install.rs`.

use std::path::Path;
use std::time::{Duration, Instant};

use notify::EventKind;
use notify::event::{AccessKind, AccessMode, CreateKind, ModifyKind, RemoveKind, RenameMode};

use super::conf::{
    ChainEntry, ConfChoice, ConfFile, ConfStatus, EntrySettings, choose_file, has_entry,
    is_valid_network, plan_insert, remove_entry, status,
};
use super::ordered::OrderedValue;
use super::watch::{FIGHT_WINDOW, REPAIR_INTERVAL, RewriteLog, is_change, repair_delay};
use super::*;
use crate::plugin::config::PluginConfig;

/// A node's bridge network as a provisioner writes it: keys in the order a
/// person would write them, not sorted.
const BRIDGE_CONFLIST: &str = r#"{
  "cniVersion": "1.0.0",
  "name": "k8s-pod-network",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.244.0.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {
      "type": "portmap",
      "snat": true,
      "capabilities": {"portMappings": true}
    }
  ]
}"#;

/// A single-plugin configuration, as older setups write it.
const BRIDGE_CONF: &str = r#"{
  "cniVersion": "0.4.0",
  "name": "bridge-net",
  "type": "bridge",
  "bridge": "cni0",
  "ipam": {"type": "host-local", "subnet": "10.244.0.0/24"}
}"#;

fn file(name: &str, contents: &str) -> ConfFile {
    ConfFile {
        name: name.to_owned(),
        contents: contents.as_bytes().to_vec(),
    }
}

fn listing(files: &[(&str, &str)]) -> Vec<ConfFile> {
    files
        .iter()
        .map(|(name, contents)| file(name, contents))
        .collect()
}

fn settings() -> EntrySettings {
    EntrySettings {
        agent_socket: "/var/run/istio-cni/pluginevent.sock".into(),
        ambient_namespaces: vec!["shop".into(), "bank".into()],
        exclude_namespaces: vec!["kube-system".into()],
        pod_namespace: Some("istio-system".into()),
    }
}

fn entry() -> ChainEntry {
    ChainEntry::new("ztunnel-cni", &settings()).unwrap()
}

fn parsed(bytes: &[u8]) -> OrderedValue {
    OrderedValue::parse(bytes).unwrap()
}

fn plugin_list(json: &OrderedValue) -> Vec<OrderedValue> {
    json.get("plugins").unwrap().as_array().unwrap().to_vec()
}

fn keys(json: &OrderedValue) -> Vec<&str> {
    json.members()
        .unwrap()
        .iter()
        .map(|(key, _)| key.as_str())
        .collect()
}

#[test]
fn parsed_json_keeps_its_key_order_through_a_rewrite() {
    let json = parsed(BRIDGE_CONFLIST.as_bytes());
    assert_eq!(keys(&json), ["cniVersion", "name", "plugins"]);
    let bridge = &plugin_list(&json)[0];
    assert_eq!(
        keys(bridge),
        [
            "type",
            "bridge",
            "isGateway",
            "ipMasq",
            "hairpinMode",
            "ipam"
        ]
    );
    assert_eq!(
        keys(bridge.get("ipam").unwrap()),
        ["type", "ranges", "routes"]
    );
    let again = parsed(&json.to_pretty_bytes().unwrap());
    assert_eq!(again, json);
    assert_eq!(
        json.to_value(),
        serde_json::from_str::<serde_json::Value>(BRIDGE_CONFLIST).unwrap()
    );
}

#[test]
fn a_bridge_conflist_gets_our_entry_last_and_keeps_everything_else() {
    let original = parsed(BRIDGE_CONFLIST.as_bytes());
    let write = plan_insert(&file("10-bridge.conflist", BRIDGE_CONFLIST), &entry()).unwrap();
    assert_eq!(write.target, "10-bridge.conflist");
    assert_eq!(write.replaces, None);

    let written = parsed(&write.contents);
    assert_eq!(keys(&written), keys(&original));
    assert_eq!(written.get("cniVersion"), original.get("cniVersion"));
    assert_eq!(written.get("name"), original.get("name"));
    let plugins = plugin_list(&written);
    assert_eq!(plugins.len(), 3);
    // The bridge and portmap entries are equal as ordered values: same
    // keys in the same order, same values.
    assert_eq!(plugins[..2], plugin_list(&original)[..]);
    assert_eq!(plugins[2].to_value(), entry().to_value());
    assert_eq!(
        keys(&plugins[2]),
        [
            "name",
            "type",
            "agent_socket",
            "ambient_namespaces",
            "exclude_namespaces",
            "pod_namespace"
        ]
    );
    assert!(has_entry(
        &file(
            "10-bridge.conflist",
            std::str::from_utf8(&write.contents).unwrap()
        ),
        &entry()
    ));
}

#[test]
fn a_stale_entry_of_ours_is_replaced_not_duplicated() {
    let stale = r#"{"cniVersion":"1.0.0","name":"n","plugins":[
        {"type":"ztunnel-cni","name":"ztunnel-cni","agent_socket":"/old.sock"},
        {"type":"bridge"},
        {"type":"ztunnel-cni","name":"ztunnel-cni","agent_socket":"/older.sock"}]}"#;
    let write = plan_insert(&file("10-x.conflist", stale), &entry()).unwrap();
    let plugins = plugin_list(&parsed(&write.contents));
    let types: Vec<&str> = plugins
        .iter()
        .map(|plugin| plugin.get("type").unwrap().as_str().unwrap())
        .collect();
    assert_eq!(types, ["bridge", "ztunnel-cni"]);
    assert_eq!(plugins[1].to_value(), entry().to_value());
}

#[test]
fn a_conf_is_wrapped_into_a_conflist_named_after_it() {
    let write = plan_insert(&file("10-bridge.conf", BRIDGE_CONF), &entry()).unwrap();
    assert_eq!(write.target, "10-bridge.conflist");
    assert_eq!(write.replaces.as_deref(), Some("10-bridge.conf"));
    let written = parsed(&write.contents);
    assert_eq!(keys(&written), ["name", "cniVersion", "plugins"]);
    assert_eq!(
        written.get("name").unwrap().as_str(),
        Some("k8s-pod-network")
    );
    assert_eq!(written.get("cniVersion").unwrap().as_str(), Some("0.3.1"));
    let plugins = plugin_list(&written);
    assert_eq!(plugins.len(), 2);
    // The old configuration, minus its cniVersion, keys in order.
    let OrderedValue::Object(mut old) = parsed(BRIDGE_CONF.as_bytes()) else {
        unreachable!()
    };
    old.retain(|(key, _)| key != "cniVersion");
    assert_eq!(plugins[0], OrderedValue::Object(old));
    assert_eq!(plugins[1].to_value(), entry().to_value());
}

#[test]
fn insertion_refuses_files_it_cannot_extend() {
    let cases = [
        ("a.conflist", "not json", "not JSON"),
        ("a.conflist", "[1]", "not a JSON object"),
        ("a.conflist", r#"{"name":"n"}"#, "no \"plugins\" array"),
        ("a.conflist", r#"{"plugins":{}}"#, "no \"plugins\" array"),
        ("a.json", r#"{"type":"bridge"}"#, "not a .conf or .conflist"),
    ];
    for (name, contents, want) in cases {
        let error = plan_insert(&file(name, contents), &entry()).unwrap_err();
        assert!(
            error.to_string().contains(want),
            "{name} {contents}: {error}"
        );
    }
}

#[test]
fn validity_follows_what_a_runtime_loads() {
    let cases = [
        ("a.conflist", BRIDGE_CONFLIST, true, "a list with plugins"),
        (
            "a.conflist",
            r#"{"name":"n","plugins":[]}"#,
            false,
            "an empty list",
        ),
        ("a.conflist", r#"{"name":"n"}"#, false, "no plugins key"),
        (
            "a.conflist",
            r#"{"plugins":["bridge"]}"#,
            false,
            "a plugin that is not an object",
        ),
        (
            "a.conflist",
            r#"{"plugins":[{"type":"bridge"}"#,
            false,
            "half written",
        ),
        ("a.conf", BRIDGE_CONF, true, "a single plugin"),
        (
            "a.conf",
            r#"{"name":"n","type":""}"#,
            false,
            "an empty type",
        ),
        ("a.conf", r#"{"name":"n"}"#, false, "no type"),
        (
            "a.conf",
            r#"{"type":7}"#,
            false,
            "a type that is not a string",
        ),
        ("a.conf", "", false, "empty"),
        (
            "a.json",
            BRIDGE_CONF,
            false,
            "not a configuration file name",
        ),
    ];
    for (name, contents, want, why) in cases {
        assert_eq!(is_valid_network(&file(name, contents)), want, "{why}");
    }
}

#[test]
fn the_chosen_file_is_the_first_valid_one_or_the_named_one() {
    let valid_list = BRIDGE_CONFLIST;
    let valid_conf = BRIDGE_CONF;
    let broken = "{";
    let files = listing;
    let use_ = |name: &str| ConfChoice::Use(name.to_owned());
    let cases = [
        (
            None,
            files(&[("20-b.conflist", valid_list), ("10-a.conf", valid_conf)]),
            use_("10-a.conf"),
            "lexicographic order, whatever the listing order",
        ),
        (
            None,
            files(&[
                ("05-broken.conflist", broken),
                ("10-a.conflist", valid_list),
            ]),
            use_("10-a.conflist"),
            "an invalid file is skipped",
        ),
        (
            None,
            files(&[("10-a.conflist", valid_list), ("10-a.conf", valid_conf)]),
            use_("10-a.conf"),
            "X.conf sorts before X.conflist",
        ),
        (
            None,
            files(&[
                ("99-z.conflist", valid_list),
                ("100-a.conflist", valid_list),
            ]),
            use_("100-a.conflist"),
            "bytes, not numbers",
        ),
        (None, files(&[]), ConfChoice::Waiting, "an empty directory"),
        (
            None,
            files(&[("10-a.conflist", broken), ("20-b.conf", "{}")]),
            ConfChoice::Waiting,
            "nothing valid",
        ),
        (
            Some("20-b.conflist"),
            files(&[("10-a.conflist", valid_list), ("20-b.conflist", valid_list)]),
            use_("20-b.conflist"),
            "the named file wins over order",
        ),
        (
            Some("20-b.conf"),
            files(&[("10-a.conflist", valid_list), ("20-b.conflist", valid_list)]),
            use_("20-b.conflist"),
            "X.conf named, X.conflist present",
        ),
        (
            Some("20-b.conflist"),
            files(&[("20-b.conf", valid_conf)]),
            use_("20-b.conf"),
            "X.conflist named, X.conf present",
        ),
        (
            Some("20-b.conflist"),
            files(&[("20-b.conflist", valid_list), ("20-b.conf", valid_conf)]),
            use_("20-b.conflist"),
            "the name itself before its twin",
        ),
        (
            Some("20-b.conflist"),
            files(&[("10-a.conflist", valid_list)]),
            ConfChoice::Waiting,
            "a named file that is missing is waited for",
        ),
        (
            Some("20-b.conflist"),
            files(&[("20-b.conflist", broken)]),
            ConfChoice::Waiting,
            "a named file that is invalid is waited for",
        ),
    ];
    for (explicit, files, want, why) in cases {
        assert_eq!(choose_file(explicit, &files), want, "{why}");
    }
}

#[test]
fn the_installation_is_valid_only_while_the_chosen_file_holds_our_entry() {
    let ours = |contents: &str| {
        String::from_utf8(
            plan_insert(&file("x.conflist", contents), &entry())
                .unwrap()
                .contents,
        )
        .unwrap()
    };
    let with_entry = ours(BRIDGE_CONFLIST);
    let other_settings = EntrySettings {
        ambient_namespaces: vec!["*".into()],
        ..settings()
    };
    let with_other_entry = String::from_utf8(
        plan_insert(
            &file("x.conflist", BRIDGE_CONFLIST),
            &ChainEntry::new("ztunnel-cni", &other_settings).unwrap(),
        )
        .unwrap()
        .contents,
    )
    .unwrap();
    let doubled = {
        let mut json: serde_json::Value = serde_json::from_str(&with_entry).unwrap();
        let ours = json["plugins"][2].clone();
        json["plugins"].as_array_mut().unwrap().insert(0, ours);
        json.to_string()
    };
    let installed = |name: &str| ConfStatus::Installed(name.to_owned());
    let missing = |name: &str| ConfStatus::Missing(name.to_owned());
    let cases = [
        (
            None,
            listing(&[("10-a.conflist", &with_entry)]),
            installed("10-a.conflist"),
            "in place",
        ),
        (
            None,
            listing(&[("10-a.conflist", BRIDGE_CONFLIST)]),
            missing("10-a.conflist"),
            "rewritten without it",
        ),
        (
            None,
            listing(&[
                ("05-new.conflist", BRIDGE_CONFLIST),
                ("10-a.conflist", &with_entry),
            ]),
            missing("05-new.conflist"),
            "another file now sorts first",
        ),
        (
            None,
            listing(&[("10-a.conf", BRIDGE_CONF)]),
            missing("10-a.conf"),
            "a .conf to wrap",
        ),
        (
            None,
            listing(&[("10-a.conflist", &with_other_entry)]),
            missing("10-a.conflist"),
            "our entry with other settings",
        ),
        (
            None,
            listing(&[("10-a.conflist", &doubled)]),
            missing("10-a.conflist"),
            "our entry twice",
        ),
        (
            None,
            listing(&[]),
            ConfStatus::Waiting,
            "nothing to chain into",
        ),
        (
            Some("20-b.conf"),
            listing(&[
                ("10-a.conflist", BRIDGE_CONFLIST),
                ("20-b.conflist", &with_entry),
            ]),
            installed("20-b.conflist"),
            "a named .conf that we wrapped",
        ),
    ];
    for (explicit, files, want, why) in cases {
        assert_eq!(status(explicit, &files, &entry()), want, "{why}");
    }
}

#[test]
fn removal_gives_back_the_list_as_it_was() {
    let write = plan_insert(&file("10-bridge.conflist", BRIDGE_CONFLIST), &entry()).unwrap();
    let removed = remove_entry(&write.contents, "ztunnel-cni").unwrap();
    assert_eq!(parsed(&removed), parsed(BRIDGE_CONFLIST.as_bytes()));

    // A wrapped .conf stays a list, with the old configuration alone.
    let write = plan_insert(&file("10-bridge.conf", BRIDGE_CONF), &entry()).unwrap();
    let removed = parsed(&remove_entry(&write.contents, "ztunnel-cni").unwrap());
    assert_eq!(plugin_list(&removed).len(), 1);
    assert_eq!(
        plugin_list(&removed)[0].get("type").unwrap().as_str(),
        Some("bridge")
    );

    let cases = [
        (BRIDGE_CONFLIST, "no entry of ours"),
        ("not json", "not JSON"),
        (r#"{"name":"n"}"#, "not a list"),
        (BRIDGE_CONF, "a single plugin"),
    ];
    for (contents, why) in cases {
        assert_eq!(
            remove_entry(contents.as_bytes(), "ztunnel-cni"),
            None,
            "{why}"
        );
    }
}

#[test]
fn the_plugin_reads_the_entry_we_write() {
    let write = plan_insert(&file("10-bridge.conflist", BRIDGE_CONFLIST), &entry()).unwrap();
    let list: serde_json::Value = serde_json::from_slice(&write.contents).unwrap();
    // A runtime gives each plugin its entry plus the list's cniVersion and
    // name.
    let mut ours = list["plugins"][2].clone();
    assert_eq!(ours.get("cniVersion"), None, "our entry has no cniVersion");
    ours["cniVersion"] = list["cniVersion"].clone();
    ours["name"] = list["name"].clone();
    let config = PluginConfig::parse(ours.to_string().as_bytes()).unwrap();
    assert_eq!(config.agent_socket, settings().agent_socket);
    assert_eq!(config.ambient_namespaces, settings().ambient_namespaces);
    assert_eq!(config.exclude_namespaces, settings().exclude_namespaces);
    assert_eq!(config.pod_namespace, settings().pod_namespace);
    assert!(config.captures("shop", "web-0"));
    assert!(!config.captures("kube-system", "dns-0"));

    // A wrapped .conf gives the plugin 0.3.1, which it speaks.
    let write = plan_insert(&file("10-bridge.conf", BRIDGE_CONF), &entry()).unwrap();
    let list: serde_json::Value = serde_json::from_slice(&write.contents).unwrap();
    let mut ours = list["plugins"][1].clone();
    ours["cniVersion"] = list["cniVersion"].clone();
    assert!(PluginConfig::parse(ours.to_string().as_bytes()).is_ok());
}

#[test]
fn the_default_entry_says_what_the_plugin_assumes_without_one() {
    let entry = ChainEntry::new("ztunnel-cni", &EntrySettings::default()).unwrap();
    let mut written = entry.to_value();
    written["cniVersion"] = "1.0.0".into();
    let bare =
        serde_json::json!({"cniVersion": "1.0.0", "name": "ztunnel-cni", "type": "ztunnel-cni"});
    assert_eq!(
        PluginConfig::parse(written.to_string().as_bytes()).unwrap(),
        PluginConfig::parse(bare.to_string().as_bytes()).unwrap()
    );
}

#[test]
fn names_that_are_not_plain_file_names_are_refused() {
    let config = |plugin_name: &str, conf_name: Option<&str>| InstallConfig {
        plugin_name: plugin_name.to_owned(),
        conf_name: conf_name.map(str::to_owned),
        ..InstallConfig::new("/ztunnel-cni".into())
    };
    let cases = [
        (config("ztunnel-cni", None), true),
        (config("ztunnel-cni", Some("10-calico.conflist")), true),
        (config("ztunnel-cni", Some("10-flannel.conf")), true),
        (config("", None), false),
        (config("..", None), false),
        (config("bin/ztunnel-cni", None), false),
        (config("ztunnel-cni", Some("../10-a.conflist")), false),
        (config("ztunnel-cni", Some("10-a.json")), false),
    ];
    for (config, ok) in cases {
        assert_eq!(Installer::new(config.clone()).is_ok(), ok, "{config:?}");
    }
}

#[test]
fn reads_and_opens_do_not_wake_the_watcher() {
    let cases = [
        (EventKind::Access(AccessKind::Open(AccessMode::Any)), false),
        (EventKind::Access(AccessKind::Read), false),
        (
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
            false,
        ),
        (
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            true,
        ),
        (EventKind::Create(CreateKind::File), true),
        (EventKind::Modify(ModifyKind::Name(RenameMode::To)), true),
        (EventKind::Remove(RemoveKind::File), true),
        (EventKind::Any, true),
    ];
    for (kind, want) in cases {
        assert_eq!(is_change(&kind), want, "{kind:?}");
    }
}

#[test]
fn repairs_are_spaced_by_the_interval() {
    let start = Instant::now();
    let second = Duration::from_secs(1);
    let cases = [
        (None, start, Duration::ZERO, "never repaired"),
        (Some(start), start, REPAIR_INTERVAL, "just repaired"),
        (
            Some(start),
            start + second,
            REPAIR_INTERVAL - second,
            "one second ago",
        ),
        (
            Some(start),
            start + REPAIR_INTERVAL,
            Duration::ZERO,
            "exactly one interval ago",
        ),
        (
            Some(start),
            start + 10 * REPAIR_INTERVAL,
            Duration::ZERO,
            "long ago",
        ),
        (
            Some(start + second),
            start,
            REPAIR_INTERVAL,
            "a clock read out of order",
        ),
    ];
    for (last, now, want, why) in cases {
        assert_eq!(repair_delay(last, now), want, "{why}");
    }
}

#[test]
fn a_file_rewritten_again_and_again_is_reported() {
    let start = Instant::now();
    let at = |seconds: u64| start + Duration::from_secs(seconds);
    let a = Path::new("/etc/cni/net.d/10-a.conflist");
    let b = Path::new("/etc/cni/net.d/20-b.conflist");
    let mut log = RewriteLog::default();
    assert_eq!(log.record(a, at(0)), None, "the first write is the install");
    assert_eq!(log.record(b, at(5)), None, "another file does not count");
    assert_eq!(log.record(a, at(10)), None);
    assert_eq!(
        log.record(a, at(15)),
        Some(3),
        "a third rewrite within the window"
    );
    assert_eq!(log.record(a, at(20)), Some(4));

    let mut log = RewriteLog::default();
    let window = FIGHT_WINDOW.as_secs();
    assert_eq!(log.record(a, at(0)), None);
    assert_eq!(log.record(a, at(window / 2)), None);
    assert_eq!(
        log.record(a, at(window + 1)),
        None,
        "the first rewrite has aged out"
    );
}
