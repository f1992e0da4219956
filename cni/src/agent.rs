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
//! | `health` | the readiness and liveness endpoint for the kubelet |
//! | `mesh` | adding and deleting pods (look-up, rules, record, ZDS events, annotation) |
//! | `source` | who the pod of an add is: the registry file or the Kubernetes API, and the checks before it may join |
//! | `kube` | the watches of this node's Pods and of Namespaces, direct reads, the redirection annotation |
//! | `enablement` | whether a pod belongs in the ambient mesh (exclusions, enablement selectors) |
//! | `rules` | the iptables and policy-routing text, and applying it in a netns |
//! | `host_rules` | the node's side of kubelet probes: the probe ipsets and the `ISTIO_POSTRT` SNAT |
//! | `netns` | entering a netns and running tools there |
//! | `pods` | the pod set and `pods.json` |
//! | `zds` | the ZDS socket and the snapshot/ack sequence |
//! | `socket_file` | the sockets' paths: bound owner-only (0600) whatever the umask, removed on exit |
//! | `peer` | who may connect to the two sockets (`SO_PEERCRED` uid) |
//! | `install` | the plugin binary and its chained entry in the node's CNI configuration (copy, choose, insert, watch, uninstall) |
//! | `upgrade` | whether a stopping agent leaves that installation and the host probe rules for the next one (Istio's safe upgrade) |
//! | `reconcile` | following the API without CNI events: running pods enrolled, opted-out and deleted pods taken out, the start-up repairs (A5, A6) |
//! | `procfs` | finding a running pod's netns from the host through procfs (cgroup pod UID, verified by the pod's IP) |

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_mesh::{FileRegistry, RegistryError};

use crate::event::DEFAULT_SOCKET;

use enablement::{DEFAULT_SYSTEM_NAMESPACE, EnablementSettings};
use health::Readiness;
use host_rules::HostRules;
use install::{InstallConfig, InstallError, Installer};
use kube::PodWatch;
use mesh::Mesh;
use peer::PeerPolicy;
use pods::{PodSet, PodStore, PodStoreError};
use reconcile::Reconciler;
use rules::RuleSettings;
use source::{FileSource, KubeSource, PodSource};
use upgrade::{AgentPod, Exit, ExitPolicy, Observation};
use zds::socket::SeqPacketListener;

pub mod enablement;
pub mod health;
pub mod host_rules;
pub mod http_server;
pub mod install;
pub mod kube;
pub mod mesh;
pub mod netns;
pub mod peer;
pub mod pods;
pub mod procfs;
pub mod reconcile;
pub mod rules;
pub mod server;
mod socket_file;
pub mod source;
pub mod upgrade;
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
    /// Who may connect to either socket (`peer`): root and the agent's own
    /// uid by default.
    pub peers: PeerPolicy,
    /// Where the uid and service account of an added pod come from.
    pub pods: PodSourceConfig,
    /// This node; pods placed on another node are refused. Required with
    /// the Kubernetes source, whose watch holds only this node's pods.
    pub node_name: Option<String>,
    /// How the in-pod rules are written.
    pub rules: RuleSettings,
    /// Install the plugin binary and its chained entry on start, keep them
    /// in place while running, and take them out on exit as `on_exit`
    /// says; `None` leaves the node's CNI configuration alone. The entry's
    /// `agent_socket` is always set to `plugin_socket`, so the installed
    /// plugin reaches this agent, and its `pod_namespace` to
    /// `agent_pod.namespace`, so the plugin lets the next agent's pod
    /// start.
    pub install: Option<InstallConfig>,
    /// Whether the installation and the host probe rules are taken out on
    /// exit, or left for the agent that replaces this one (`upgrade`).
    pub on_exit: ExitPolicy,
    /// This agent's pod, whose DaemonSet tells an upgrade from an
    /// uninstall at exit.
    pub agent_pod: AgentPod,
    /// Where the kubelet's readiness and liveness probes are answered
    /// (`health`); `None` serves no probes.
    pub readiness_listen: Option<SocketAddr>,
    /// Where the host's root filesystem is seen: `/` on the host, the
    /// mount point of the host's paths in a container (istio-cni's is
    /// `/host`). The netns paths the plugin reports are the host's.
    pub host_root: PathBuf,
    /// The host's procfs, where running pods' netns are found (`/proc` on
    /// the host, the host's `/proc` mounted elsewhere in a container).
    pub procfs: PathBuf,
    /// Keep the node's side of kubelet probes (`host_rules`) in the
    /// agent's own netns, which must then be the node's. Off in
    /// constructors: an agent run inside a test process would change the
    /// test machine's own netns.
    pub host_probe_rules: bool,
    /// The node's netns for `host_probe_rules`, entered for each change,
    /// when the agent runs in a netns of its own (istio-cni's chart without
    /// host networking: the host's `/proc/1/ns/net`); `None` means the
    /// agent's own.
    pub host_netns: Option<PathBuf>,
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
            peers: PeerPolicy::default(),
            pods,
            node_name,
            rules: RuleSettings {
                probe_snat_ipv4: DEFAULT_PROBE_SNAT_IPV4,
                probe_snat_ipv6: DEFAULT_PROBE_SNAT_IPV6,
                dns_capture: false,
                virtual_interfaces: Vec::new(),
            },
            install: None,
            on_exit: ExitPolicy::default(),
            agent_pod: AgentPod {
                namespace: DEFAULT_SYSTEM_NAMESPACE.to_owned(),
                name: None,
            },
            readiness_listen: None,
            host_root: PathBuf::from("/"),
            procfs: PathBuf::from(procfs::DEFAULT_PROCFS),
            host_probe_rules: false,
            host_netns: None,
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
                    .map_err(|error| failed(ErrorChain(&error).to_string()))?;
                ::kube::Config::from_custom_kubeconfig(file, &Default::default())
                    .await
                    .map_err(|error| failed(ErrorChain(&error).to_string()))?
            }
            KubeCredentials::InCluster => ::kube::Config::incluster()
                .map_err(|error| failed(ErrorChain(&error).to_string()))?,
        };
        ::kube::Client::try_from(config).map_err(|error| failed(ErrorChain(&error).to_string()))
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
///
/// With [`AgentConfig::install`], the plugin is installed once both sockets
/// are bound (so an installed plugin finds the agent listening), kept in
/// place until `shutdown`, then uninstalled, with the host probe rules,
/// unless [`AgentConfig::on_exit`] and the API say another agent follows
/// ([`upgrade::decide`]). A failed install is logged and retried by the
/// watcher; the agent serves meanwhile, not ready.
pub async fn run(
    config: AgentConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    let (stop, stopped) = watch::channel(false);
    let installers = match &config.install {
        Some(install) => {
            let mut install = install.clone();
            install.entry.agent_socket.clone_from(&config.plugin_socket);
            install.entry.pod_namespace = Some(config.agent_pod.namespace.clone());
            Some((Installer::new(install.clone())?, Installer::new(install)?))
        }
        None => None,
    };
    let readiness = Arc::new(Readiness::new(
        installers.as_ref().map(|(installer, _)| installer.state()),
    ));
    let health_server = match config.readiness_listen {
        Some(address) => {
            let listener = TcpListener::bind(address)
                .await
                .map_err(|source| AgentError::Listen { address, source })?;
            tracing::info!(%address, "health probes listening");
            Some(tokio::spawn(health::serve(
                listener,
                Arc::clone(&readiness),
                stopped.clone(),
            )))
        }
        None => None,
    };
    let source = pod_source(&config, &stopped).await?;
    let pod_watch = match &source {
        PodSource::Kubernetes(source) => Some(Arc::clone(&source.watch)),
        PodSource::File(_) => None,
    };
    let store = PodStore::open(&config.state_dir)?;
    let pods = load_pods(&store)?;
    let host_rules = if config.host_probe_rules {
        Some(install_host_rules(&config.rules, config.host_netns.clone()).await)
    } else {
        None
    };
    let exit_host_rules = host_rules.clone();
    let mesh = Arc::new(
        Mesh::new(source, config.rules.clone(), host_rules, store, pods)?
            .with_host_root(config.host_root.clone()),
    );
    let reconciler = Reconciler::new(Arc::clone(&mesh), config.procfs.clone());

    let bind_error = |path: &PathBuf| {
        let path = path.clone();
        move |source| AgentError::Bind { path, source }
    };
    // ZDS first: the plugin socket's appearance is what says the agent is
    // up (to the plugin, and to whoever waits for the agent), so by then
    // ztunnel's socket is there too.
    let zds_listener = SeqPacketListener::bind(&config.zds_socket, config.peers.clone())
        .map_err(bind_error(&config.zds_socket))?;
    let plugin_listener = server::bind(&config.plugin_socket, config.peers.clone())
        .map_err(bind_error(&config.plugin_socket))?;
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
    let zds_server = tokio::spawn(zds::serve(zds_listener, mesh, stopped.clone()));
    let reconciliation = reconciler.map(|reconciler| tokio::spawn(reconciler.run(stopped.clone())));
    readiness.serving(pod_watch.clone());
    let installation = installers
        .map(|(installer, uninstaller)| (start_installation(installer, stopped), uninstaller));
    shutdown.await;
    tracing::info!("node agent shutting down");
    let _ = stop.send(true);
    let _ = plugin_server.await;
    let _ = zds_server.await;
    if let Some(reconciliation) = reconciliation {
        let _ = reconciliation.await;
    }
    // Every add has finished, so none puts an address back into the probe
    // sets once they are gone.
    if installation.is_some() || exit_host_rules.is_some() {
        let exit = exit(&config, pod_watch.as_deref()).await;
        if let Some((watcher, uninstaller)) = installation {
            finish_installation(watcher, uninstaller, exit.keeps()).await;
        }
        if let (Some(host_rules), false) = (exit_host_rules, exit.keeps()) {
            uninstall_host_rules(host_rules).await;
        }
    }
    if let Some(health_server) = health_server {
        let _ = health_server.await;
    }
    Ok(())
}

/// The pod source `config` names; the Kubernetes watch stops with
/// `shutdown`.
async fn pod_source(
    config: &AgentConfig,
    shutdown: &watch::Receiver<bool>,
) -> Result<PodSource, AgentError> {
    Ok(match &config.pods {
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
                watch: PodWatch::start(client, &node_name, shutdown.clone()),
                node_name,
                enablement: enablement.clone(),
            })
        }
    })
}

/// The node's probe rules, put in place (on a blocking thread: they run
/// `ipset` and `iptables`). A failure is logged and the agent goes on:
/// pods are still redirected, only their kubelet probes are captured, and
/// every enrollment tries the probe sets again.
async fn install_host_rules(rules: &RuleSettings, netns: Option<PathBuf>) -> Arc<HostRules> {
    let mut host_rules = HostRules::new(rules.probe_snat_ipv4, rules.probe_snat_ipv6);
    if let Some(path) = netns {
        tracing::info!(netns = %path.display(), "host probe rules go in the node's netns");
        host_rules = host_rules.in_netns(path);
    }
    let host_rules = Arc::new(host_rules);
    let installing = Arc::clone(&host_rules);
    match tokio::task::spawn_blocking(move || installing.install()).await {
        Ok(Ok(())) => tracing::info!("host probe rules in place"),
        Ok(Err(error)) => {
            tracing::error!(error = %ErrorChain(&error), "host probe rules not installed: kubelet probes of meshed pods will be captured")
        }
        Err(_) => tracing::error!("the host probe rules task failed"),
    }
    host_rules
}

/// The stored pod set; an unreadable one is moved aside and the agent
/// starts empty.
fn load_pods(store: &PodStore) -> Result<PodSet, AgentError> {
    match store.load() {
        Ok(pods) => Ok(pods),
        Err(PodStoreError::Parse { .. } | PodStoreError::TooLarge(_)) => {
            let aside = store.quarantine()?;
            tracing::error!(aside = %aside.display(), "pod set unreadable; moved aside, starting empty");
            Ok(PodSet::default())
        }
        Err(error) => Err(error.into()),
    }
}

/// Installs the plugin, then keeps it in place until `shutdown` on a task
/// of its own. A failed install only leaves the agent not ready: the
/// watcher checks again at start, on every change, and after a pause.
/// The install's few small file writes run on the async thread, as the
/// watcher's do.
fn start_installation(
    installer: Installer,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<Result<(), InstallError>> {
    if let Err(error) = installer.install() {
        tracing::error!(error = %ErrorChain(&error), "installing the CNI plugin; the watcher retries");
    }
    tokio::spawn(installer.watch(async move { stopped(&mut shutdown).await }))
}

/// Whether this agent's installation stays for the next agent: asks the
/// API when the policy needs it, and logs the decision.
async fn exit(config: &AgentConfig, pod_watch: Option<&PodWatch>) -> Exit {
    let observation = match (config.on_exit, pod_watch, &config.node_name) {
        (ExitPolicy::SafeUpgrade, Some(watch), Some(node_name)) => {
            upgrade::observe(watch.client(), &config.agent_pod, node_name).await
        }
        _ => Observation::NoApi,
    };
    let exit = upgrade::decide(config.on_exit, &observation);
    match &exit {
        Exit::Keep(reason) => tracing::info!(
            %reason,
            "leaving the CNI plugin, its entry and the host probe rules for the next agent; new pods fail until it answers"
        ),
        Exit::Remove(reason) => tracing::info!(
            %reason,
            "no agent follows: removing the CNI plugin, its entry and the host probe rules"
        ),
    }
    exit
}

/// Removes the node's probe SNAT and ipsets, off the async threads (they
/// run iptables and ipset).
async fn uninstall_host_rules(host_rules: Arc<HostRules>) {
    match tokio::task::spawn_blocking(move || host_rules.uninstall()).await {
        Ok(Ok(())) => tracing::info!("host probe rules removed"),
        Ok(Err(error)) => {
            tracing::error!(error = %ErrorChain(&error), "removing the host probe rules")
        }
        Err(_) => tracing::error!("the host probe rules task failed"),
    }
}

/// Waits for the stopped watcher, then uninstalls (or, `upgrading`,
/// leaves the installation in place). The watcher must have stopped
/// first, or it would put back what uninstalling takes out.
async fn finish_installation(
    watcher: JoinHandle<Result<(), InstallError>>,
    uninstaller: Installer,
    upgrading: bool,
) {
    match watcher.await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::error!(error = %ErrorChain(&error), "the CNI installation watch failed")
        }
        Err(error) => {
            tracing::error!(error = %ErrorChain(&error), "the CNI installation watch panicked")
        }
    }
    if let Err(error) = uninstaller.uninstall(upgrading) {
        tracing::error!(error = %ErrorChain(&error), "uninstalling the CNI plugin");
    }
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
    /// The installation settings are invalid.
    #[error(transparent)]
    Install(#[from] InstallError),
    /// The health endpoint could not be bound.
    #[error("cannot listen on {address}")]
    Listen {
        /// The address.
        address: SocketAddr,
        /// The bind error.
        source: std::io::Error,
    },
    /// A socket could not be bound.
    #[error("cannot listen on {path}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The bind error.
        source: std::io::Error,
    },
}
