//! The node agent (`ztunnel-agent`): it receives plugin events, installs
//! each ambient pod's in-pod redirection, keeps the set of pods on disk,
//! and hands pods to ztunnel over ZDS.
//!
//! [`run`] is the whole agent: the binary and tests call it with an
//! [`AgentConfig`] and a shutdown future.
//!
//! | Module | Owns |
//! |---|---|
//! | `server` | the plugin-event HTTP socket |
//! | `mesh` | adding and deleting pods (look-up, rules, record, ZDS events, annotation) |
//! | `source` | who the pod of an add is: the registry file or the Kubernetes API, and the checks before it may join |
//! | `kube` | the watches of this node's Pods and of Namespaces, direct reads, the redirection annotation |
//! | `enablement` | whether a pod belongs in the ambient mesh (exclusions, enablement selectors) |
//! | `rules` | the iptables and policy-routing text, and applying it in a netns |
//! | `netns` | entering a netns and running tools there |
//! | `pods` | the pod set and `pods.json` |
//! | `zds` | the ZDS socket and the snapshot/ack sequence |
//! | `socket_file` | the sockets' paths: made ready to bind, removed on exit |
//! | `install` | the plugin binary and its chained entry in the node's CNI configuration (copy, choose, insert, watch, uninstall) |
//! | `procfs` | finding a running pod's netns from the host through procfs (cgroup pod UID, verified by the pod's IP) |

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use ztunnel_mesh::{FileRegistry, RegistryError};

use crate::event::DEFAULT_SOCKET;

use enablement::EnablementSettings;
use kube::PodWatch;
use mesh::Mesh;
use pods::{PodSet, PodStore, PodStoreError};
use rules::RuleSettings;
use source::{FileSource, KubeSource, PodSource};
use zds::socket::SeqPacketListener;

pub mod enablement;
pub mod install;
pub mod kube;
pub mod mesh;
pub mod netns;
pub mod pods;
pub mod procfs;
pub mod rules;
pub mod server;
mod socket_file;
pub mod source;
pub mod zds;

/// Default ZDS socket (WIRE.md §5).
pub const DEFAULT_ZDS_SOCKET: &str = "/var/run/ztunnel/ztunnel.sock";
/// Default state directory, holding `pods.json`.
pub const DEFAULT_STATE_DIR: &str = "/var/run/istio-cni";
/// Default IPv4 source of SNATed kubelet probes (WIRE.md §1).
pub const DEFAULT_PROBE_SNAT_IPV4: Ipv4Addr = Ipv4Addr::new(169, 254, 7, 127);
/// Default IPv6 source of SNATed kubelet probes (WIRE.md §1).
pub const DEFAULT_PROBE_SNAT_IPV6: Ipv6Addr = Ipv6Addr::new(
    0xfd16, 0x9254, 0x7127, 0x1337, 0xffff, 0xffff, 0xffff, 0xffff,
);
/// Pause after a failed accept on either socket (e.g. out of fds), so the
/// accept loop cannot spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Everything the agent runs with.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Where the CNI plugin posts events.
    pub plugin_socket: PathBuf,
    /// Where ztunnel connects for ZDS.
    pub zds_socket: PathBuf,
    /// Holds `pods.json`, so a restarted agent can re-snapshot.
    pub state_dir: PathBuf,
    /// Where the uid and service account of an added pod come from.
    pub pods: PodSourceConfig,
    /// This node; pods placed on another node are refused. Required with
    /// the Kubernetes source, whose watch holds only this node's pods.
    pub node_name: Option<String>,
    /// How the in-pod rules are written.
    pub rules: RuleSettings,
}

impl AgentConfig {
    /// A configuration with the default paths and rule settings, reading
    /// the registry at `pods`.
    pub fn with_registry(pods: PathBuf) -> AgentConfig {
        AgentConfig::with_source(PodSourceConfig::File(pods), None)
    }

    /// A configuration with the default paths, rule settings and
    /// enablement, taking pods of `node_name` from the Kubernetes API.
    pub fn with_kubernetes(credentials: KubeCredentials, node_name: String) -> AgentConfig {
        let source = PodSourceConfig::Kubernetes {
            credentials,
            enablement: EnablementSettings::default(),
        };
        AgentConfig::with_source(source, Some(node_name))
    }

    fn with_source(pods: PodSourceConfig, node_name: Option<String>) -> AgentConfig {
        AgentConfig {
            plugin_socket: PathBuf::from(DEFAULT_SOCKET),
            zds_socket: PathBuf::from(DEFAULT_ZDS_SOCKET),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            pods,
            node_name,
            rules: RuleSettings {
                probe_snat_ipv4: DEFAULT_PROBE_SNAT_IPV4,
                probe_snat_ipv6: DEFAULT_PROBE_SNAT_IPV6,
                dns_capture: false,
                virtual_interfaces: Vec::new(),
            },
        }
    }
}

/// Where the agent learns who a pod is.
#[derive(Debug, Clone)]
pub enum PodSourceConfig {
    /// The pod registry YAML file (the CA's format): uid, service account
    /// and node of each pod, re-read when an add names a pod it does not
    /// know (or knows with another uid).
    File(PathBuf),
    /// The Kubernetes API: this node's Pods and all Namespaces, watched.
    Kubernetes {
        /// How to reach the API server.
        credentials: KubeCredentials,
        /// Which pods belong in the mesh.
        enablement: EnablementSettings,
    },
}

/// How the agent authenticates to the API server.
#[derive(Debug, Clone)]
pub enum KubeCredentials {
    /// A kubeconfig file (its current context).
    Kubeconfig(PathBuf),
    /// The service account of the pod the agent runs in.
    InCluster,
}

impl KubeCredentials {
    /// A client with these credentials.
    async fn client(&self) -> Result<::kube::Client, AgentError> {
        let failed = |reason: String| AgentError::KubeClient {
            credentials: self.to_string(),
            reason,
        };
        let config = match self {
            KubeCredentials::Kubeconfig(path) => {
                let file = ::kube::config::Kubeconfig::read_from(path)
                    .map_err(|error| failed(error.to_string()))?;
                ::kube::Config::from_custom_kubeconfig(file, &Default::default())
                    .await
                    .map_err(|error| failed(error.to_string()))?
            }
            KubeCredentials::InCluster => {
                ::kube::Config::incluster().map_err(|error| failed(error.to_string()))?
            }
        };
        ::kube::Client::try_from(config).map_err(|error| failed(error.to_string()))
    }
}

impl std::fmt::Display for KubeCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KubeCredentials::Kubeconfig(path) => write!(f, "kubeconfig {}", path.display()),
            KubeCredentials::InCluster => f.write_str("the in-cluster service account"),
        }
    }
}

/// Runs the agent until `shutdown` resolves; both sockets are removed on
/// the way out unless a newer agent has bound them since. Returns once
/// both servers have stopped and every started add or delete has finished.
pub async fn run(
    config: AgentConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    let (stop, stopped) = watch::channel(false);
    let source = match &config.pods {
        PodSourceConfig::File(path) => PodSource::File(FileSource {
            registry: Arc::new(FileRegistry::load(path)?),
            node_name: config.node_name.clone(),
        }),
        PodSourceConfig::Kubernetes {
            credentials,
            enablement,
        } => {
            let node_name = config
                .node_name
                .clone()
                .ok_or(AgentError::NodeNameRequired)?;
            let client = credentials.client().await?;
            PodSource::Kubernetes(KubeSource {
                watch: PodWatch::start(client, &node_name, stopped.clone()),
                node_name,
                enablement: enablement.clone(),
            })
        }
    };
    let store = PodStore::open(&config.state_dir)?;
    let pods = match store.load() {
        Ok(pods) => pods,
        Err(PodStoreError::Parse { .. } | PodStoreError::TooLarge(_)) => {
            let aside = store.quarantine()?;
            tracing::error!(aside = %aside.display(), "pod set unreadable; moved aside, starting empty");
            PodSet::default()
        }
        Err(error) => return Err(error.into()),
    };
    let mesh = Arc::new(Mesh::new(source, config.rules.clone(), store, pods)?);

    let bind_error = |path: &PathBuf| {
        let path = path.clone();
        move |source| AgentError::Bind { path, source }
    };
    let plugin_listener =
        server::bind(&config.plugin_socket).map_err(bind_error(&config.plugin_socket))?;
    let zds_listener =
        SeqPacketListener::bind(&config.zds_socket).map_err(bind_error(&config.zds_socket))?;
    tracing::info!(
        plugin_socket = %config.plugin_socket.display(),
        zds_socket = %config.zds_socket.display(),
        "node agent listening"
    );

    let plugin_server = tokio::spawn(server::serve(
        plugin_listener,
        Arc::clone(&mesh),
        stopped.clone(),
    ));
    let zds_server = tokio::spawn(zds::serve(zds_listener, mesh, stopped));
    shutdown.await;
    tracing::info!("node agent shutting down");
    let _ = stop.send(true);
    let _ = plugin_server.await;
    let _ = zds_server.await;
    Ok(())
}

/// Resolves once the stop flag is raised or its sender is gone: the one
/// shutdown signal every long-lived task of the agent watches. Cancel
/// safe: it only waits.
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The pod registry could not be loaded.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The pod set could not be read or written.
    #[error(transparent)]
    Store(#[from] PodStoreError),
    /// The stored pod set could not be reconciled.
    #[error(transparent)]
    Mesh(#[from] mesh::MeshError),
    /// The Kubernetes source needs this node's name.
    #[error("the Kubernetes pod source needs the node name")]
    NodeNameRequired,
    /// No Kubernetes client could be made.
    #[error("no Kubernetes client from {credentials}: {reason}")]
    KubeClient {
        /// Which credentials (kubeconfig path or in-cluster).
        credentials: String,
        /// What went wrong.
        reason: String,
    },
    /// A socket could not be bound.
    #[error("cannot listen on {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The bind error.
        source: std::io::Error,
    },
}
