//! The decisions on the node's CNI configuration directory, as plain
//! functions over file names and contents (KUBERNETES.md B2, B3, B6):
//! which file the runtime uses ([`choose_file`]), whether it carries our
//! entry ([`status`]), the file that results from adding our entry
//! ([`plan_insert`]) or taking it out ([`remove_entry`]).
//!
//! Reading and writing the files is `install.rs`'s; these functions never
//! touch the filesystem.

use std::path::PathBuf;

use crate::event::DEFAULT_SOCKET;

use super::ordered::OrderedValue;

/// File suffix of a single-plugin network configuration.
const CONF_SUFFIX: &str = ".conf";
/// File suffix of a plugin-list network configuration.
const CONFLIST_SUFFIX: &str = ".conflist";
/// `name` of the list a `.conf` is wrapped into: the name istio-cni gives
/// it, so tools that look for it find the same network.
pub const WRAPPED_NETWORK_NAME: &str = "k8s-pod-network";
/// `cniVersion` of the list a `.conf` is wrapped into, as istio-cni writes
/// it; every runtime that reads plugin lists accepts it.
pub const WRAPPED_CNI_VERSION: &str = "0.3.1";
/// Namespaces the plugin never captures unless told otherwise: the same
/// list as the plugin's own default (`plugin/config.rs`), written out so
/// that the installed entry says what it does.
const DEFAULT_EXCLUDED: [&str; 2] = ["kube-system", "istio-system"];

/// The two kinds of configuration file a runtime reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfKind {
    /// `*.conf`: one plugin's configuration.
    Conf,
    /// `*.conflist`: a named list of plugins, run in order.
    Conflist,
}

impl ConfKind {
    /// The kind a file name says, or `None` for files runtimes ignore.
    pub fn of(file_name: &str) -> Option<ConfKind> {
        if file_name.ends_with(CONFLIST_SUFFIX) {
            Some(ConfKind::Conflist)
        } else if file_name.ends_with(CONF_SUFFIX) {
            Some(ConfKind::Conf)
        } else {
            None
        }
    }
}

/// A file of the configuration directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfFile {
    /// The file name, without directory.
    pub name: String,
    /// What it holds.
    pub contents: Vec<u8>,
}

/// The fields of our plugin's entry: the keys the plugin reads from its
/// configuration (`plugin/config.rs`), always written out so the file says
/// how the plugin behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntrySettings {
    /// `agent_socket`: where the agent listens for plugin events.
    pub agent_socket: PathBuf,
    /// `ambient_namespaces`: namespaces whose pods are captured; `"*"`
    /// means all.
    pub ambient_namespaces: Vec<String>,
    /// `exclude_namespaces`: never captured, even with `"*"`.
    pub exclude_namespaces: Vec<String>,
    /// `pod_namespace`: the agent's namespace, whose agent pods the plugin
    /// lets pass; left out when `None`.
    pub pod_namespace: Option<String>,
}

impl Default for EntrySettings {
    /// What the plugin assumes when a key is absent.
    fn default() -> EntrySettings {
        EntrySettings {
            agent_socket: PathBuf::from(DEFAULT_SOCKET),
            ambient_namespaces: Vec::new(),
            exclude_namespaces: DEFAULT_EXCLUDED.iter().map(|ns| (*ns).to_owned()).collect(),
            pod_namespace: None,
        }
    }
}

/// Our entry, built once, as it goes into a plugin list.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainEntry {
    /// `type`: the installed binary's name, which the runtime looks up in
    /// its plugin path.
    plugin_type: String,
    /// The whole entry: `name`, `type`, then the settings. No
    /// `cniVersion`: the runtime passes the list's to every plugin.
    json: OrderedValue,
}

impl ChainEntry {
    /// The entry of the plugin installed as `plugin_name`.
    pub fn new(plugin_name: &str, settings: &EntrySettings) -> Result<ChainEntry, ConfError> {
        let socket = settings
            .agent_socket
            .to_str()
            .ok_or_else(|| ConfError::NonUtf8Socket(settings.agent_socket.clone()))?;
        let text = |value: &str| OrderedValue::String(value.to_owned());
        let list =
            |values: &[String]| OrderedValue::Array(values.iter().map(|v| text(v)).collect());
        let mut members = vec![
            ("name".to_owned(), text(plugin_name)),
            ("type".to_owned(), text(plugin_name)),
            ("agent_socket".to_owned(), text(socket)),
            (
                "ambient_namespaces".to_owned(),
                list(&settings.ambient_namespaces),
            ),
            (
                "exclude_namespaces".to_owned(),
                list(&settings.exclude_namespaces),
            ),
        ];
        if let Some(namespace) = &settings.pod_namespace {
            members.push(("pod_namespace".to_owned(), text(namespace)));
        }
        let json = OrderedValue::Object(members);
        Ok(ChainEntry {
            plugin_type: plugin_name.to_owned(),
            json,
        })
    }

    /// `type`, which identifies our entries in a list.
    pub fn plugin_type(&self) -> &str {
        &self.plugin_type
    }

    /// The entry as JSON.
    pub fn to_value(&self) -> serde_json::Value {
        self.json.to_value()
    }
}

/// Which file the runtime uses, as far as we can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfChoice {
    /// This file (a name in the directory).
    Use(String),
    /// No valid file yet: wait for the directory to change.
    Waiting,
}

/// Picks the file the runtime reads (B2). With an explicit name, that file,
/// else its `.conf`↔`.conflist` twin; without, the lexicographically first
/// valid `*.conf`/`*.conflist`. Invalid files are skipped, so a primary
/// plugin's half-written file is never chosen.
pub fn choose_file(explicit: Option<&str>, files: &[ConfFile]) -> ConfChoice {
    let valid = |name: &str| {
        files
            .iter()
            .find(|file| file.name == name)
            .is_some_and(is_valid_network)
    };
    let chosen = match explicit {
        Some(name) => [Some(name.to_owned()), twin(name)]
            .into_iter()
            .flatten()
            .find(|candidate| valid(candidate)),
        None => {
            let mut names: Vec<&str> = files
                .iter()
                .filter(|file| is_valid_network(file))
                .map(|file| file.name.as_str())
                .collect();
            names.sort_unstable();
            names.first().map(|name| (*name).to_owned())
        }
    };
    chosen.map_or(ConfChoice::Waiting, ConfChoice::Use)
}

/// `X.conf` for `X.conflist` and the other way round.
fn twin(name: &str) -> Option<String> {
    if let Some(stem) = name.strip_suffix(CONFLIST_SUFFIX) {
        Some(format!("{stem}{CONF_SUFFIX}"))
    } else {
        name.strip_suffix(CONF_SUFFIX)
            .map(|stem| format!("{stem}{CONFLIST_SUFFIX}"))
    }
}

/// Whether a runtime would load the file: a `.conflist` that parses with at
/// least one plugin (each an object), or a `.conf` that parses with a
/// non-empty `type`.
pub fn is_valid_network(file: &ConfFile) -> bool {
    let Ok(json) = OrderedValue::parse(&file.contents) else {
        return false;
    };
    match ConfKind::of(&file.name) {
        Some(ConfKind::Conflist) => plugins(&json).is_some_and(|list| {
            !list.is_empty() && list.iter().all(|plugin| plugin.members().is_some())
        }),
        Some(ConfKind::Conf) => plugin_type(&json).is_some_and(|kind| !kind.is_empty()),
        None => false,
    }
}

/// Where the configuration stands against our entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfStatus {
    /// No valid file: nothing to insert into yet.
    Waiting,
    /// The chosen file is a list holding our entry exactly once, as we
    /// would write it.
    Installed(String),
    /// The chosen file lacks our entry, holds another version of it, or is
    /// a `.conf` still to be wrapped.
    Missing(String),
}

/// Checks the directory (B6): valid only while the chosen file is a list
/// that holds our entry. A new file sorting first, a rewritten file
/// without our entry, or a changed entry all make it [`ConfStatus::Missing`].
pub fn status(explicit: Option<&str>, files: &[ConfFile], entry: &ChainEntry) -> ConfStatus {
    let name = match choose_file(explicit, files) {
        ConfChoice::Use(name) => name,
        ConfChoice::Waiting => return ConfStatus::Waiting,
    };
    let installed = files
        .iter()
        .find(|file| file.name == name)
        .is_some_and(|file| has_entry(file, entry));
    if installed {
        ConfStatus::Installed(name)
    } else {
        ConfStatus::Missing(name)
    }
}

/// Whether `file` is a list with exactly one entry of our type, equal to
/// ours (key order aside).
pub fn has_entry(file: &ConfFile, entry: &ChainEntry) -> bool {
    if ConfKind::of(&file.name) != Some(ConfKind::Conflist) {
        return false;
    }
    let Ok(json) = OrderedValue::parse(&file.contents) else {
        return false;
    };
    let Some(list) = plugins(&json) else {
        return false;
    };
    let ours: Vec<&OrderedValue> = list
        .iter()
        .filter(|plugin| plugin_type(plugin) == Some(entry.plugin_type()))
        .collect();
    matches!(ours.as_slice(), [only] if only.to_value() == entry.to_value())
}

/// A file to write: the result of inserting our entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfWrite {
    /// The file to write (a `.conflist`).
    pub target: String,
    /// Its new contents.
    pub contents: Vec<u8>,
    /// A `.conf` the list replaces, removed once the list is in place.
    pub replaces: Option<String>,
}

/// Inserts our entry into `file` (B3). A list loses any entry of our type
/// and gets ours appended last, every other member as it was. A `.conf`
/// becomes the first plugin of a new list named
/// [`WRAPPED_NETWORK_NAME`], without its `cniVersion`, written as
/// `X.conflist` in place of `X.conf`.
pub fn plan_insert(file: &ConfFile, entry: &ChainEntry) -> Result<ConfWrite, ConfError> {
    let json = OrderedValue::parse(&file.contents).map_err(ConfError::Parse)?;
    let OrderedValue::Object(mut members) = json else {
        return Err(ConfError::NotAnObject);
    };
    match ConfKind::of(&file.name) {
        Some(ConfKind::Conflist) => {
            let list = plugin_list_mut(&mut members).ok_or(ConfError::NoPluginList)?;
            list.retain(|plugin| plugin_type(plugin) != Some(entry.plugin_type()));
            list.push(entry.json.clone());
            Ok(ConfWrite {
                target: file.name.clone(),
                contents: OrderedValue::Object(members)
                    .to_pretty_bytes()
                    .map_err(ConfError::Encode)?,
                replaces: None,
            })
        }
        Some(ConfKind::Conf) => {
            members.retain(|(key, _)| key != "cniVersion");
            let wrapped = OrderedValue::Object(vec![
                (
                    "name".to_owned(),
                    OrderedValue::String(WRAPPED_NETWORK_NAME.to_owned()),
                ),
                (
                    "cniVersion".to_owned(),
                    OrderedValue::String(WRAPPED_CNI_VERSION.to_owned()),
                ),
                (
                    "plugins".to_owned(),
                    OrderedValue::Array(vec![OrderedValue::Object(members), entry.json.clone()]),
                ),
            ]);
            Ok(ConfWrite {
                target: twin(&file.name).ok_or(ConfError::NotAConfigFile)?,
                contents: wrapped.to_pretty_bytes().map_err(ConfError::Encode)?,
                replaces: Some(file.name.clone()),
            })
        }
        None => Err(ConfError::NotAConfigFile),
    }
}

/// The list without any entry of type `our_type` (B6 uninstall), every
/// other member as it was; `None` when there is nothing to remove (no such
/// entry, or not a list we can read), so the file is left untouched.
pub fn remove_entry(contents: &[u8], our_type: &str) -> Option<Vec<u8>> {
    let OrderedValue::Object(mut members) = OrderedValue::parse(contents).ok()? else {
        return None;
    };
    let list = plugin_list_mut(&mut members)?;
    let before = list.len();
    list.retain(|plugin| plugin_type(plugin) != Some(our_type));
    if list.len() == before {
        return None;
    }
    OrderedValue::Object(members).to_pretty_bytes().ok()
}

/// A list's `plugins`, if it has an array there.
fn plugins(json: &OrderedValue) -> Option<&[OrderedValue]> {
    json.get("plugins")?.as_array()
}

/// The first `plugins` member of a list's members, if it is an array.
fn plugin_list_mut(members: &mut [(String, OrderedValue)]) -> Option<&mut Vec<OrderedValue>> {
    members
        .iter_mut()
        .find(|(key, _)| key == "plugins")
        .and_then(|(_, value)| match value {
            OrderedValue::Array(list) => Some(list),
            _ => None,
        })
}

/// A plugin configuration's `type`, if it is a string.
fn plugin_type(plugin: &OrderedValue) -> Option<&str> {
    plugin.get("type")?.as_str()
}

/// Why our entry could not be inserted.
#[derive(Debug, thiserror::Error)]
pub enum ConfError {
    /// The file is not JSON.
    #[error("not JSON: {0}")]
    Parse(serde_json::Error),
    /// The file is JSON but not an object.
    #[error("not a JSON object")]
    NotAnObject,
    /// A `.conflist` without a `plugins` array.
    #[error("no \"plugins\" array")]
    NoPluginList,
    /// The name ends neither in `.conf` nor in `.conflist`.
    #[error("not a .conf or .conflist file")]
    NotAConfigFile,
    /// The new file could not be encoded.
    #[error("encoding the configuration: {0}")]
    Encode(serde_json::Error),
    /// The agent socket's path is not UTF-8, so JSON cannot carry it.
    #[error("the agent socket path {0:?} is not UTF-8")]
    NonUtf8Socket(PathBuf),
}
