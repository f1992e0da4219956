//! The pod registry the CA authorizes impersonation against: which pods
//! exist, with which UID and service account, on which node.
//!
//! [`PodRegistry`] is the seam: today a YAML file ([`FileRegistry`]),
//! tomorrow a Kubernetes pod informer. Readers take an immutable
//! [`PodSnapshot`], so one request sees one consistent registry, and a reload
//! swaps the whole snapshot at once.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use serde::Deserialize;

/// Largest registry file read, in bytes: far above any node's pods, and a
/// bound on what a bad file can make the CA hold.
const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// Where pod facts come from.
pub trait PodRegistry: Send + Sync {
    /// The current registry. Cheap: an `Arc` clone.
    fn snapshot(&self) -> Arc<PodSnapshot>;
}

/// One pod, as the registry file spells it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Pod {
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod UID; a token for a deleted and recreated pod of the same name
    /// carries the old UID and must not match.
    pub uid: String,
    /// `spec.serviceAccountName`.
    pub service_account: String,
    /// `spec.nodeName`; absent while the pod is unscheduled.
    #[serde(default)]
    pub node_name: Option<String>,
    /// `status.phase`.
    #[serde(default)]
    pub phase: PodPhase,
    /// Pod IPs.
    #[serde(default)]
    pub ips: Vec<IpAddr>,
}

/// `status.phase`. Failed pods do not count as running an identity on a node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum PodPhase {
    /// Accepted, not all containers started.
    Pending,
    /// Bound to a node, containers started.
    #[default]
    Running,
    /// All containers exited successfully.
    Succeeded,
    /// All containers exited, at least one in failure.
    Failed,
    /// The node stopped reporting.
    Unknown,
}

/// An immutable view of all pods, indexed for the authorizer.
#[derive(Debug, Default)]
pub struct PodSnapshot {
    /// By (namespace, name).
    pods: HashMap<(String, String), Pod>,
    /// (node, namespace, service account) of every pod not in phase Failed:
    /// the identities each node may be issued.
    live_on_node: HashMap<(String, String, String), usize>,
}

impl PodSnapshot {
    /// Indexes a list of pods.
    pub fn from_pods(pods: Vec<Pod>) -> Result<Self, RegistryError> {
        let mut snapshot = PodSnapshot::default();
        for pod in pods {
            if pod.phase != PodPhase::Failed
                && let Some(node) = &pod.node_name
            {
                let key = (
                    node.clone(),
                    pod.namespace.clone(),
                    pod.service_account.clone(),
                );
                *snapshot.live_on_node.entry(key).or_default() += 1;
            }
            let key = (pod.namespace.clone(), pod.name.clone());
            if snapshot.pods.contains_key(&key) {
                let (namespace, name) = key;
                return Err(RegistryError::DuplicatePod { namespace, name });
            }
            snapshot.pods.insert(key, pod);
        }
        Ok(snapshot)
    }

    /// The pod `namespace/name`, if it exists.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&Pod> {
        self.pods.get(&(namespace.to_owned(), name.to_owned()))
    }

    /// Whether some pod with this namespace and service account, not in
    /// phase Failed, is on `node`.
    pub fn has_live_pod(&self, node: &str, namespace: &str, service_account: &str) -> bool {
        let key = (
            node.to_owned(),
            namespace.to_owned(),
            service_account.to_owned(),
        );
        self.live_on_node.get(&key).is_some_and(|count| *count > 0)
    }

    /// How many pods there are.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

/// A registry that never changes: for tests, and for pods built in code.
#[derive(Debug, Clone)]
pub struct StaticRegistry(Arc<PodSnapshot>);

impl StaticRegistry {
    /// A registry that always returns `snapshot`.
    pub fn new(snapshot: PodSnapshot) -> Self {
        StaticRegistry(Arc::new(snapshot))
    }
}

impl PodRegistry for StaticRegistry {
    fn snapshot(&self) -> Arc<PodSnapshot> {
        Arc::clone(&self.0)
    }
}

/// A registry read from a YAML file and reloaded when its content changes.
#[derive(Debug)]
pub struct FileRegistry {
    /// The file.
    path: PathBuf,
    /// The last good snapshot, and the bytes it came from (to detect change).
    current: RwLock<(Arc<PodSnapshot>, Vec<u8>)>,
}

impl FileRegistry {
    /// Loads the file; an invalid file is an error (the CA must not start
    /// with a registry it cannot read).
    pub fn load(path: &Path) -> Result<Self, RegistryError> {
        let bytes = read_bounded(path)?;
        let snapshot = parse(path, &bytes)?;
        Ok(FileRegistry {
            path: path.to_owned(),
            current: RwLock::new((Arc::new(snapshot), bytes)),
        })
    }

    /// The file this registry reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Re-reads the file. Unchanged content does nothing and returns
    /// `Ok(false)`; new valid content is swapped in and returns `Ok(true)`;
    /// an invalid file keeps the last good registry and returns the error.
    pub fn reload(&self) -> Result<bool, RegistryError> {
        let bytes = read_bounded(&self.path)?;
        {
            let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
            if current.1 == bytes {
                return Ok(false);
            }
        }
        let snapshot = parse(&self.path, &bytes)?;
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        *current = (Arc::new(snapshot), bytes);
        Ok(true)
    }

    /// Polls the file every `interval` until `shutdown` resolves, logging
    /// each reload and each refused file (with its line).
    pub async fn watch(self: Arc<Self>, interval: Duration, shutdown: impl Future<Output = ()>) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            match self.reload() {
                Ok(false) => {}
                Ok(true) => tracing::info!(
                    path = %self.path.display(),
                    pods = self.snapshot().len(),
                    "pod registry reloaded"
                ),
                Err(error) => tracing::error!(
                    path = %self.path.display(),
                    %error,
                    "pod registry not reloaded; keeping the last good one"
                ),
            }
        }
    }
}

impl PodRegistry for FileRegistry {
    fn snapshot(&self) -> Arc<PodSnapshot> {
        let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(&current.0)
    }
}

/// Why a registry file was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The file could not be read.
    #[error("cannot read pod registry {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is larger than the registry accepts.
    #[error("pod registry {path} is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The YAML does not parse as a list of pods.
    #[error("pod registry {path}:{line}:{column}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error (0 when unknown).
        line: usize,
        /// 1-based column of the error (0 when unknown).
        column: usize,
        /// What serde_yaml_ng said.
        message: String,
    },
    /// Two pods share a namespace and name.
    #[error("pod registry: pod {namespace}/{name} appears twice")]
    DuplicatePod {
        /// Namespace of the pod.
        namespace: String,
        /// Name of the pod.
        name: String,
    },
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, RegistryError> {
    let read_error = |source| RegistryError::Read {
        path: path.to_owned(),
        source,
    };
    let len = std::fs::metadata(path).map_err(read_error)?.len();
    if len > MAX_FILE_BYTES {
        return Err(RegistryError::TooLarge {
            path: path.to_owned(),
        });
    }
    std::fs::read(path).map_err(read_error)
}

/// Parses the YAML list of pods; an empty file is an empty registry.
fn parse(path: &Path, bytes: &[u8]) -> Result<PodSnapshot, RegistryError> {
    let blank = bytes.iter().all(u8::is_ascii_whitespace);
    let pods: Vec<Pod> = if blank {
        Vec::new()
    } else {
        serde_yaml_ng::from_slice(bytes).map_err(|error| {
            let (line, column) = error
                .location()
                .map_or((0, 0), |at| (at.line(), at.column()));
            RegistryError::Parse {
                path: path.to_owned(),
                line,
                column,
                message: error.to_string(),
            }
        })?
    };
    PodSnapshot::from_pods(pods)
}

#[cfg(test)]
mod tests;
