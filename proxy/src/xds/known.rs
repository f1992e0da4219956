//! What the xDS client has accepted and refused: the versions a
//! reconnect echoes, and the rejections a NACK carries. Deciding them is
//! `apply.rs`; sending them is `request.rs`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use ztunnel_proto::xds_types::ResourceKind;

/// The resources accepted so far, name → version, per type: what a
/// reconnect echoes as `initial_resource_versions`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownVersions {
    by_kind: BTreeMap<ResourceKind, HashMap<Arc<str>, String>>,
}

/// One change to [`KnownVersions`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionChange {
    /// The resource was accepted at this version.
    Accepted {
        /// Resource name.
        name: Arc<str>,
        /// `Resource.version`.
        version: String,
    },
    /// The resource was removed.
    Removed(Arc<str>),
}

impl KnownVersions {
    /// Nothing known.
    pub fn new() -> Self {
        Self::default()
    }

    /// The version accepted for `name`, if any.
    pub fn version(&self, kind: ResourceKind, name: &str) -> Option<&str> {
        self.by_kind.get(&kind)?.get(name).map(String::as_str)
    }

    /// How many resources of `kind` are known.
    pub fn len(&self, kind: ResourceKind) -> usize {
        self.by_kind.get(&kind).map_or(0, HashMap::len)
    }

    /// Whether nothing of `kind` is known.
    pub fn is_empty(&self, kind: ResourceKind) -> bool {
        self.len(kind) == 0
    }

    /// The `initial_resource_versions` of a reconnect's request for `kind`.
    pub fn initial_resource_versions(&self, kind: ResourceKind) -> HashMap<String, String> {
        self.by_kind
            .get(&kind)
            .into_iter()
            .flatten()
            .map(|(name, version)| (name.to_string(), version.clone()))
            .collect()
    }

    /// Records what [`decide`](super::apply::decide) reported for `kind`.
    pub fn record(&mut self, kind: ResourceKind, changes: Vec<VersionChange>) {
        let known = self.by_kind.entry(kind).or_default();
        for change in changes {
            match change {
                VersionChange::Accepted { name, version } => {
                    known.insert(name, version);
                }
                VersionChange::Removed(name) => {
                    known.remove(&name);
                }
            }
        }
    }
}

/// A resource that was not applied, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Resource name.
    pub name: String,
    /// The reason, as the NACK carries it.
    pub reason: String,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.reason)
    }
}
