//! The resources of one mesh snapshot, built once and shared by every
//! stream: per type, name → the encoded `Resource` message (written to the
//! wire as is by `wire.rs`), whose version is a hash of its payload (so a
//! resource that did not change keeps its version across reloads and
//! restarts); plus the names that changed since the previous build, so
//! that the common push (to a client that has the previous build) costs
//! the size of the change, not of the mesh.
//!
//! [`changes_since`] is the diff every response is made of. What each
//! client has been sent is `delta.rs`'s.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

use bytes::Bytes;
use prost::Message;
use prost_types::Any;
use ztunnel_proto::envoy::service::discovery::v3::Resource;
use ztunnel_proto::xds_types::ResourceKind;

use ztunnel_mesh::MeshSnapshot;

use super::resources;

/// Bytes of the content hash kept in a version: 64 bits make a collision
/// between two versions of one resource negligible, in 16 hex characters.
const VERSION_BYTES: usize = 8;

/// Both types' resources of one snapshot.
#[derive(Debug, Clone)]
pub struct MeshResources {
    /// Indexed by [`ResourceKind::index`].
    sets: [Arc<ResourceSet>; 2],
}

impl MeshResources {
    /// No resources: the state before the first snapshot.
    pub fn empty() -> Self {
        MeshResources {
            sets: ResourceKind::ALL.map(|kind| Arc::new(ResourceSet::empty(kind))),
        }
    }

    /// The resources of `snapshot`. A type whose resources did not change
    /// keeps `previous`'s set (and its generation).
    pub fn build(snapshot: &MeshSnapshot, trust_domain: &str, previous: &MeshResources) -> Self {
        let addresses = resources::addresses(snapshot, trust_domain)
            .into_iter()
            .map(|(name, address)| (name, resources::encode_address(address)))
            .collect();
        let authorizations = resources::authorizations(snapshot)
            .into_iter()
            .map(|(name, policy)| (name, policy.encode_to_vec()))
            .collect();
        let [previous_addresses, previous_authorizations] = &previous.sets;
        MeshResources {
            sets: [
                ResourceSet::next(previous_addresses, addresses),
                ResourceSet::next(previous_authorizations, authorizations),
            ],
        }
    }

    /// The resources of one type.
    pub fn get(&self, kind: ResourceKind) -> &Arc<ResourceSet> {
        let [addresses, authorizations] = &self.sets;
        match kind {
            ResourceKind::Address => addresses,
            ResourceKind::Authorization => authorizations,
        }
    }
}

/// One type's resources of one snapshot.
#[derive(Debug)]
pub struct ResourceSet {
    /// The type.
    kind: ResourceKind,
    /// Bumped on every build that changes something; a client that was
    /// sent this generation has exactly these resources.
    generation: u64,
    /// Name → the resource as sent.
    entries: HashMap<Arc<str>, Arc<Entry>>,
    /// What changed since the previous generation.
    changes: Changes,
}

/// One resource as sent.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry {
    /// Resource name.
    pub name: Arc<str>,
    /// Resource version: a hash of the payload.
    pub version: String,
    /// The encoded `envoy.service.discovery.v3.Resource` (name, version,
    /// and the payload as an `Any`).
    pub encoded: Bytes,
}

/// The names that differ between two generations of a set.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    /// The generation these changes start from.
    pub from: u64,
    /// Names added or with a new version, sorted.
    pub updated: Vec<Arc<str>>,
    /// Names gone, sorted.
    pub removed: Vec<Arc<str>>,
}

impl ResourceSet {
    /// An empty set, generation 0.
    pub fn empty(kind: ResourceKind) -> Self {
        ResourceSet {
            kind,
            generation: 0,
            entries: HashMap::new(),
            changes: Changes::default(),
        }
    }

    /// The set following `previous`, from (name, encoded message) pairs.
    /// Unchanged resources share `previous`'s; if nothing changed,
    /// `previous` itself is returned.
    pub fn next(previous: &Arc<ResourceSet>, encoded: Vec<(String, Vec<u8>)>) -> Arc<ResourceSet> {
        let mut entries = HashMap::with_capacity(encoded.len());
        let mut updated = Vec::new();
        for (name, bytes) in encoded {
            let version = version_of(&bytes);
            let kept = previous
                .entries
                .get_key_value(name.as_str())
                .filter(|(_, entry)| entry.version == version);
            let (name, entry) = match kept {
                Some((name, entry)) => (Arc::clone(name), Arc::clone(entry)),
                None => {
                    let name: Arc<str> = name.into();
                    updated.push(Arc::clone(&name));
                    let resource = Resource {
                        version: version.clone(),
                        resource: Some(Any {
                            type_url: previous.kind.type_url().to_owned(),
                            value: bytes,
                        }),
                        name: name.to_string(),
                        ..Resource::default()
                    };
                    let entry = Entry {
                        name: Arc::clone(&name),
                        version,
                        encoded: Bytes::from(resource.encode_to_vec()),
                    };
                    (name, Arc::new(entry))
                }
            };
            entries.insert(name, entry);
        }
        let mut removed: Vec<Arc<str>> = previous
            .entries
            .keys()
            .filter(|name| !entries.contains_key(*name))
            .cloned()
            .collect();
        if updated.is_empty() && removed.is_empty() && entries.len() == previous.entries.len() {
            return Arc::clone(previous);
        }
        updated.sort_unstable();
        removed.sort_unstable();
        Arc::new(ResourceSet {
            kind: previous.kind,
            generation: previous.generation + 1,
            entries,
            changes: Changes {
                from: previous.generation,
                updated,
                removed,
            },
        })
    }

    /// The type.
    pub fn kind(&self) -> ResourceKind {
        self.kind
    }

    /// Which build this is.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The resource named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Entry>> {
        self.entries.get(name)
    }

    /// How many resources there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// What changed since the previous generation.
    pub fn changes(&self) -> &Changes {
        &self.changes
    }
}

/// What a client knows of one type.
#[derive(Debug, Clone, Copy)]
pub enum Known<'a> {
    /// Name → version, as a reconnecting client lists them in
    /// `initial_resource_versions`.
    Versions(&'a HashMap<String, String>),
    /// Exactly the set it was last sent.
    Sent(&'a ResourceSet),
}

/// What brings a client that knows `known` to `current`: the resources it
/// lacks or has in another version, and the names it has that are gone,
/// both sorted by name.
pub fn changes_since(known: Known<'_>, current: &ResourceSet) -> (Vec<Arc<Entry>>, Vec<Arc<str>>) {
    if let Known::Sent(sent) = known {
        if sent.generation == current.generation {
            return (Vec::new(), Vec::new());
        }
        if current.changes.from == sent.generation {
            let updated = current
                .changes
                .updated
                .iter()
                .filter_map(|name| current.entries.get(name).cloned())
                .collect();
            return (updated, current.changes.removed.clone());
        }
    }
    let version = |name: &str| match known {
        Known::Versions(versions) => versions.get(name).map(String::as_str),
        Known::Sent(sent) => sent.entries.get(name).map(|entry| entry.version.as_str()),
    };
    let mut updated: Vec<Arc<Entry>> = current
        .entries
        .iter()
        .filter(|(name, entry)| version(name) != Some(entry.version.as_str()))
        .map(|(_, entry)| Arc::clone(entry))
        .collect();
    updated.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let mut removed: Vec<Arc<str>> = match known {
        Known::Versions(versions) => versions
            .keys()
            .filter(|name| !current.entries.contains_key(name.as_str()))
            .map(|name| Arc::from(name.as_str()))
            .collect(),
        Known::Sent(sent) => sent
            .entries
            .keys()
            .filter(|name| !current.entries.contains_key(&***name))
            .cloned()
            .collect(),
    };
    removed.sort_unstable();
    (updated, removed)
}

/// The version of an encoded resource: the first bytes of its SHA-256, in
/// hex. Same bytes, same version, in any process.
fn version_of(bytes: &[u8]) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes);
    let mut version = String::with_capacity(2 * VERSION_BYTES);
    for byte in digest.as_ref().iter().take(VERSION_BYTES) {
        // Writing into a String cannot fail.
        let _ = write!(version, "{byte:02x}");
    }
    version
}

#[cfg(test)]
mod tests;
