//! The set of pods the agent has put in the mesh, kept on disk as
//! `<state-dir>/pods.json` so that a restarted agent can hand ztunnel a
//! full snapshot. Written atomically (a fresh temporary file, synced, then
//! renamed: the CA state directory's `replace`), so a crash leaves the old
//! set or the new one, never half of one.
//!
//! Which rules a pod has is `rules.rs`'s business; telling ztunnel is
//! `zds.rs`'s.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use ztunnel_process::state_file::{self, StateFileError};

/// File name of the pod set inside the state directory.
const FILE_NAME: &str = "pods.json";
/// Largest pod set read back: a node holds a few hundred pods of a few
/// hundred bytes each; the bound keeps a damaged file from costing memory.
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;
/// Mode of `pods.json`: it names every meshed pod of the node with its
/// uid, service account, addresses and netns path, which no other local
/// user needs; the temporary file is created with it, so no copy is ever
/// readable by others.
const FILE_MODE: u32 = 0o600;

/// One pod in the mesh: what ZDS needs (uid, name, namespace, service
/// account, netns) and its addresses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRecord {
    /// Kubernetes `metadata.uid`; ztunnel keys workloads by it.
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// `spec.serviceAccountName`, for ztunnel's workload match.
    pub service_account: String,
    /// The pod's netns path; the snapshot opens it for the fd. A path the
    /// runtime made (CNI ADD), or `<procfs>/<pid>/ns/net` of the pod's
    /// oldest process when the pod was found running.
    pub netns: PathBuf,
    /// The inode of that netns when it was recorded: a procfs path can come
    /// to name another netns once its process exits and the pid is reused,
    /// so the path alone does not say the pod's netns is still there.
    /// `None` when the record has no inode (the field is optional on disk):
    /// then the path alone is checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_inode: Option<u64>,
    /// The pod's addresses, from the CNI result.
    pub ips: Vec<IpAddr>,
    /// The pod's own DNS capture choice (its `ambient.istio.io/dns-capture`
    /// annotation), over the agent's; `None` follows the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_capture: Option<bool>,
}

impl PodRecord {
    /// Whether the recorded netns is still there: the path exists and, when
    /// the inode was recorded, names that same netns.
    pub fn netns_alive(&self) -> bool {
        self.live_netns_inode().is_some()
    }

    /// The inode of the recorded netns while it is still there (see
    /// [`PodRecord::netns_alive`]), to tell it from another path to the
    /// same netns.
    pub fn live_netns_inode(&self) -> Option<u64> {
        let inode = std::fs::metadata(&self.netns).ok()?.ino();
        self.netns_inode
            .is_none_or(|recorded| recorded == inode)
            .then_some(inode)
    }
}

/// Pods by (namespace, name): one sandbox per pod name at a time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodSet {
    pods: BTreeMap<(String, String), PodRecord>,
}

impl PodSet {
    /// Adds or replaces the pod; returns the record it replaced.
    pub fn insert(&mut self, pod: PodRecord) -> Option<PodRecord> {
        self.pods
            .insert((pod.namespace.clone(), pod.name.clone()), pod)
    }

    /// The pod `namespace/name`.
    pub fn get(&self, namespace: &str, name: &str) -> Option<&PodRecord> {
        self.pods.get(&(namespace.to_owned(), name.to_owned()))
    }

    /// Removes `namespace/name` if it is there and, when `uid` is not empty,
    /// has that uid.
    pub fn remove(&mut self, namespace: &str, name: &str, uid: &str) -> Option<PodRecord> {
        let key = (namespace.to_owned(), name.to_owned());
        let matches = self
            .pods
            .get(&key)
            .is_some_and(|pod| uid.is_empty() || pod.uid == uid);
        if matches {
            self.pods.remove(&key)
        } else {
            None
        }
    }

    /// Removes the pods for which `gone` says yes; returns them.
    pub fn prune(&mut self, mut gone: impl FnMut(&PodRecord) -> bool) -> Vec<PodRecord> {
        let keys: Vec<_> = self
            .pods
            .iter()
            .filter(|(_, pod)| gone(pod))
            .map(|(key, _)| key.clone())
            .collect();
        keys.into_iter()
            .filter_map(|key| self.pods.remove(&key))
            .collect()
    }

    /// Every pod, in (namespace, name) order.
    pub fn iter(&self) -> impl Iterator<Item = &PodRecord> {
        self.pods.values()
    }

    /// How many pods there are.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether there are none.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// The on-disk home of the pod set.
#[derive(Debug, Clone)]
pub struct PodStore {
    /// `<state-dir>/pods.json`.
    path: PathBuf,
}

impl PodStore {
    /// A store in `state_dir`, which is created if missing.
    pub fn open(state_dir: &Path) -> Result<PodStore, PodStoreError> {
        std::fs::create_dir_all(state_dir).map_err(|source| PodStoreError::Io {
            path: state_dir.to_owned(),
            source,
        })?;
        Ok(PodStore {
            path: state_dir.join(FILE_NAME),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the set; a missing file is an empty set.
    pub fn load(&self) -> Result<PodSet, PodStoreError> {
        let io = |source| PodStoreError::Io {
            path: self.path.clone(),
            source,
        };
        let file = match File::open(&self.path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(PodSet::default());
            }
            Err(error) => return Err(io(error)),
        };
        // One byte past the bound tells a file at the bound from a larger one.
        let mut bytes = Vec::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(PodStoreError::TooLarge(self.path.clone()));
        }
        let pods: Vec<PodRecord> =
            serde_json::from_slice(&bytes).map_err(|source| PodStoreError::Parse {
                path: self.path.clone(),
                source,
            })?;
        let mut set = PodSet::default();
        for pod in pods {
            set.insert(pod);
        }
        Ok(set)
    }

    /// Replaces the file with `set` atomically. Blocks on an fsync: async
    /// callers run it on a blocking thread.
    pub fn save(&self, set: &PodSet) -> Result<(), PodStoreError> {
        let pods: Vec<&PodRecord> = set.iter().collect();
        let bytes = serde_json::to_vec_pretty(&pods).map_err(|source| PodStoreError::Parse {
            path: self.path.clone(),
            source,
        })?;
        Ok(state_file::replace(&self.path, &bytes, FILE_MODE)?)
    }

    /// Moves an unreadable file aside (`pods.json.bad`), so the agent can
    /// start with an empty set and an operator can look at the old one.
    pub fn quarantine(&self) -> Result<PathBuf, PodStoreError> {
        let aside = self.path.with_extension("json.bad");
        std::fs::rename(&self.path, &aside).map_err(|source| PodStoreError::Io {
            path: self.path.clone(),
            source,
        })?;
        Ok(aside)
    }
}

/// Why the pod set could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PodStoreError {
    /// Creating the directory, reading the file or moving it aside failed.
    #[error("pod set {path}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a JSON list of pods.
    #[error("pod set {path} is not a JSON list of pods")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// The file is larger than any real pod set.
    #[error("pod set {0} is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge(PathBuf),
    /// Writing the new file, or renaming it into place, failed.
    #[error("saving the pod set")]
    Save(#[from] StateFileError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(namespace: &str, name: &str, uid: &str) -> PodRecord {
        PodRecord {
            uid: uid.into(),
            name: name.into(),
            namespace: namespace.into(),
            service_account: "default".into(),
            netns: PathBuf::from(format!("/run/netns/{name}")),
            netns_inode: None,
            ips: vec!["198.18.10.2".parse().unwrap()],
            dns_capture: None,
        }
    }

    #[test]
    fn removal_respects_the_uid() {
        let mut set = PodSet::default();
        assert_eq!(set.insert(pod("shop", "web-0", "u1")), None);
        assert_eq!(
            set.insert(pod("shop", "web-0", "u2")).map(|old| old.uid),
            Some("u1".into())
        );
        assert_eq!(set.remove("shop", "web-0", "u1"), None);
        assert_eq!(set.len(), 1);
        assert_eq!(
            set.remove("shop", "web-0", "u2").map(|p| p.uid),
            Some("u2".into())
        );
        set.insert(pod("shop", "web-0", "u3"));
        assert!(set.remove("shop", "web-0", "").is_some());
        assert!(set.remove("shop", "web-0", "").is_none());
    }

    #[test]
    fn the_set_survives_a_round_trip_and_bad_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let store = PodStore::open(&dir.path().join("state")).unwrap();
        assert!(store.load().unwrap().is_empty());
        let mut set = PodSet::default();
        set.insert(pod("shop", "web-0", "u1"));
        set.insert(pod("bank", "api-1", "u2"));
        store.save(&set).unwrap();
        assert_eq!(store.load().unwrap(), set);
        let pruned = set.prune(|pod| pod.namespace == "bank");
        assert_eq!(pruned.len(), 1);
        assert_eq!(
            set.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["web-0"]
        );

        std::fs::write(store.path(), b"{not json").unwrap();
        assert!(matches!(store.load(), Err(PodStoreError::Parse { .. })));
        let aside = store.quarantine().unwrap();
        assert!(aside.exists());
        assert!(store.load().unwrap().is_empty());
    }
}
