//! The local config file (`LOCAL_XDS_PATH`, WIRE.md §11): YAML with
//! `workloads`, `services` and `policies`, in the key names and value forms
//! of istio/ztunnel's local file, parsed into the same typed model that xDS
//! feeds. Loading a file replaces the whole state.
//!
//! Entry forms live in `local/{workload,service}.rs`, scalar forms in
//! `local/values.rs`. A policy entry is read straight into the proxy's own
//! [`Policy`], whose form is `rbac`'s. Watching the file for changes is not
//! done here.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

use serde::Deserialize;
use ztunnel_certs::identity::IdentityError;

use crate::rbac::Policy;
use crate::state::{Interner, Service, State, Workload};

mod service;
mod values;
mod workload;

/// Why the local config file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LocalConfigError {
    /// The file cannot be read.
    #[error("{}: cannot read local config", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What reading it said.
        source: std::io::Error,
    },
    /// The text is not YAML of the expected shape: an unknown or missing
    /// key, a wrong type, a bad IP, CIDR, identity or enum tag.
    #[error("{}: {message}", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// 1-based line of the offending value, when known.
        line: Option<usize>,
        /// 1-based column of the offending value, when known.
        column: Option<usize>,
        /// What is wrong, with the YAML path and position.
        message: String,
    },
    /// A workload's trust domain, namespace and service account do not make
    /// a SPIFFE identity.
    #[error("{}: workload {uid}: invalid identity", path.display())]
    Identity {
        /// The file.
        path: PathBuf,
        /// The workload's uid.
        uid: String,
        /// What is wrong with the identity.
        source: IdentityError,
    },
    /// Two entries have the same key: a workload uid, a service
    /// `namespace/hostname` or a policy `namespace/name`.
    #[error("{}: duplicate {kind} {key}", path.display())]
    Duplicate {
        /// The file.
        path: PathBuf,
        /// `workload`, `service` or `policy`.
        kind: &'static str,
        /// The repeated key.
        key: String,
    },
}

/// The content of a local config file, typed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalConfig {
    /// Workloads, in file order.
    pub workloads: Vec<Workload>,
    /// Services, in file order.
    pub services: Vec<Service>,
    /// Policies by resource name, `namespace/name`.
    pub policies: BTreeMap<Arc<str>, Policy>,
}

impl LocalConfig {
    /// A store holding exactly this configuration.
    pub fn into_state(self) -> State {
        let mut state = State::new();
        self.apply(&mut state);
        state
    }

    /// Replaces everything in `state` with this configuration.
    pub fn apply(self, state: &mut State) {
        state.replace_all(self.workloads, self.services, self.policies);
    }
}

/// The file's top level.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileForm {
    #[serde(default)]
    workloads: Vec<workload::WorkloadForm>,
    #[serde(default)]
    services: Vec<service::ServiceForm>,
    #[serde(default)]
    policies: Vec<Policy>,
}

/// Reads and parses the file at `path`.
pub fn load(path: &Path) -> Result<LocalConfig, LocalConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| LocalConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, path)
}

/// Files from this size (about 200 workloads) are parsed on a thread of
/// their own ([`parse_apart`]).
const PARSE_APART_FROM: usize = 64 * 1024;

/// The YAML parse, on a thread of its own when the file is large and a
/// thread can be started, handed to `convert` on the calling thread. The
/// parse's allocations (the parser's events, several times the size of
/// what is kept, and the parsed forms) then all come from that thread's
/// heap and are all freed there, the forms after `convert` has read them:
/// the heap is empty when the thread ends and given back whole. Its pages
/// neither share with the state built from the result (which would keep
/// them resident) nor outlive the thread with objects freed from another
/// one (which the allocator would only take back when some thread needs a
/// new segment).
fn parse_apart<T>(
    text: &str,
    convert: impl FnOnce(&FileForm) -> T,
) -> Result<T, serde_yaml_ng::Error> {
    // A small file's scratch memory is not worth a thread.
    if text.len() < PARSE_APART_FROM {
        return serde_yaml_ng::from_str(text).map(|file| convert(&file));
    }
    std::thread::scope(|scope| {
        let (parsed_sender, parsed) = mpsc::sync_channel(1);
        let (read_sender, read) = mpsc::sync_channel::<FileForm>(1);
        let parser = std::thread::Builder::new()
            .name("local-config-parse".into())
            .spawn_scoped(scope, move || {
                let _ = parsed_sender.send(serde_yaml_ng::from_str::<FileForm>(text));
                // The forms come back once read, or never when the parse
                // failed; either way they are dropped here.
                drop(read.recv());
            });
        let Ok(parser) = parser else {
            // No thread to be had: parse here.
            return serde_yaml_ng::from_str(text).map(|file| convert(&file));
        };
        let Ok(parsed) = parsed.recv() else {
            // The parser ends without sending only by panicking: the same
            // panic here.
            let panic = parser.join().err();
            std::panic::resume_unwind(
                panic.unwrap_or_else(|| Box::new("local config parser ended without a result")),
            );
        };
        let converted = parsed.map(|file| {
            let converted = convert(&file);
            let _ = read_sender.send(file);
            converted
        });
        drop(read_sender);
        if let Err(panic) = parser.join() {
            std::panic::resume_unwind(panic);
        }
        converted
    })
}

/// Parses `text`; `path` only names the file in errors. A text with no
/// YAML content (empty, or only comments) is an empty configuration.
pub fn parse(text: &str, path: &Path) -> Result<LocalConfig, LocalConfigError> {
    let has_content = text.lines().any(|line| {
        let line = line.trim();
        !line.is_empty() && !line.starts_with('#') && line != "---"
    });
    if !has_content {
        return Ok(LocalConfig::default());
    }
    parse_apart(text, |file| convert(file, path)).map_err(|error| {
        let location = error.location();
        LocalConfigError::Syntax {
            path: path.to_owned(),
            line: location.as_ref().map(|l| l.line()),
            column: location.as_ref().map(|l| l.column()),
            message: error.to_string(),
        }
    })?
}

/// The typed configuration of a parsed file, built from fresh and shared
/// allocations only (see [`parse_apart`]).
fn convert(file: &FileForm, path: &Path) -> Result<LocalConfig, LocalConfigError> {
    let duplicate = |kind, key: &str| LocalConfigError::Duplicate {
        path: path.to_owned(),
        kind,
        key: key.to_owned(),
    };
    let mut interner = Interner::new();

    let mut uids = HashSet::with_capacity(file.workloads.len());
    let mut workloads = Vec::with_capacity(file.workloads.len());
    for form in &file.workloads {
        if !uids.insert(form.uid()) {
            return Err(duplicate("workload", form.uid()));
        }
        let workload =
            form.to_workload(&mut interner)
                .map_err(|source| LocalConfigError::Identity {
                    path: path.to_owned(),
                    uid: form.uid().to_owned(),
                    source,
                })?;
        workloads.push(workload);
    }

    let mut keys = BTreeSet::new();
    let mut services = Vec::with_capacity(file.services.len());
    for form in &file.services {
        let service = form.to_service(&mut interner);
        if !keys.insert(service.key()) {
            return Err(duplicate("service", &service.key().to_string()));
        }
        services.push(service);
    }

    let mut policies = BTreeMap::new();
    for policy in &file.policies {
        // Local policies are stored under `namespace/name`.
        let name: Arc<str> = format!("{}/{}", policy.namespace, policy.name).into();
        if policies.contains_key(&name) {
            return Err(duplicate("policy", &name));
        }
        policies.insert(name, policy.deep_copy());
    }
    Ok(LocalConfig {
        workloads,
        services,
        policies,
    })
}

#[cfg(test)]
mod tests;
