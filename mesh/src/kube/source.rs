//! The Kubernetes source of the mesh, as a [`PodRegistry`]: one watch per
//! kind (Pods, Namespaces, Services, EndpointSlices, Nodes,
//! AuthorizationPolicies, PeerAuthentications, ServiceEntries,
//! WorkloadEntries, Gateways, GatewayClasses)
//! feeding a reflector
//! store, and one task that
//! turns the stores into a new [`MeshSnapshot`] through the pure
//! conversion (`convert.rs`) after each change.
//!
//! What a failure does:
//! - a watch that fails keeps its store as it was and resumes with
//!   backoff (kube-runtime's), re-listing when it must; a re-list replaces
//!   a store at once when complete, so the mesh never empties meanwhile;
//! - an object that does not convert is left out and reported, with its
//!   kind and name, once per distinct problem; the rest of the mesh is kept;
//! - until every watch has listed once, the source is not ready and the
//!   snapshot is empty (readers check [`KubeRegistry::is_ready`]);
//! - the Gateway API, PeerAuthentication, ServiceEntry and WorkloadEntry
//!   are optional: while their
//!   CRDs are not installed, their kinds count as listed and empty (said
//!   once, through
//!   [`SourceObserver::kind_absent`]), and their watches keep retrying, so
//!   objects of a CRD installed later are picked up.

use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use ztunnel_certs::error_chain::ErrorChain;

use super::convert::{ConvertSettings, KubeObjects, ObjectProblem, convert};
use super::gateway_crd::{Gateway, GatewayClass};
use super::peer_authentication_crd::PeerAuthentication;
use super::policy_crd::AuthorizationPolicy;
use super::service_entry_crd::ServiceEntry;
use super::workload_entry_crd::WorkloadEntry;
use crate::{MeshSnapshot, PodRegistry};

/// How long changes are gathered before a rebuild: a burst of events (a
/// re-list, a rollout) becomes one snapshot, and a single change still
/// reaches the snapshot well within a second.
const REBUILD_DELAY: Duration = Duration::from_millis(50);

/// What the source tells its owner about, for logs it cannot write itself
/// with the owner's context, and for metrics.
pub trait SourceObserver: Send + Sync {
    /// A watch of `kind` failed; it resumes with backoff.
    fn watch_failed(&self, kind: &'static str, error: &str);
    /// An object was left out of the mesh (reported once per problem).
    fn object_refused(&self, problem: &ObjectProblem);
    /// A new snapshot was built from the stores.
    fn snapshot_built(&self, snapshot: &MeshSnapshot);
    /// The API server does not serve `kind` (its CRD is not installed); the
    /// mesh is built without it until it appears. Told once per absence.
    fn kind_absent(&self, kind: &'static str);
}

/// The mesh as the API server says it is.
pub struct KubeRegistry {
    /// The latest snapshot; empty until ready.
    current: watch::Sender<Arc<MeshSnapshot>>,
    /// True once every watch has listed once.
    ready: watch::Sender<bool>,
    /// Why the source is not ready, for the readiness endpoint.
    waiting_for: Mutex<String>,
}

impl KubeRegistry {
    /// Starts the watches through `client` and the task that rebuilds the
    /// snapshot; they run until `shutdown` resolves. Must be called inside a
    /// Tokio runtime.
    pub fn start(
        client: kube::Client,
        settings: ConvertSettings,
        observer: Arc<dyn SourceObserver>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Arc<KubeRegistry> {
        let registry = Arc::new(KubeRegistry {
            current: watch::Sender::new(Arc::new(MeshSnapshot::default())),
            ready: watch::Sender::new(false),
            waiting_for: Mutex::new("the first list of every watched kind".to_owned()),
        });
        let changed = Arc::new(Notify::new());
        // One shutdown for the watches and the rebuild.
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop.send(true);
        });
        let until_stopped = move || {
            let mut stopped = stopped.clone();
            async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            }
        };
        let watch = |kind| (kind, &changed, &observer, until_stopped());
        let stores = Stores {
            pods: watch_kind::<Pod>(&client, watch("Pod")),
            namespaces: watch_kind::<Namespace>(&client, watch("Namespace")),
            services: watch_kind::<Service>(&client, watch("Service")),
            endpoint_slices: watch_kind::<EndpointSlice>(&client, watch("EndpointSlice")),
            nodes: watch_kind::<Node>(&client, watch("Node")),
            authorization_policies: watch_kind::<AuthorizationPolicy>(
                &client,
                watch("AuthorizationPolicy"),
            ),
            peer_authentications: watch_optional_kind::<PeerAuthentication>(
                &client,
                watch("PeerAuthentication"),
            ),
            gateways: watch_optional_kind::<Gateway>(&client, watch("Gateway")),
            gateway_classes: watch_optional_kind::<GatewayClass>(&client, watch("GatewayClass")),
            service_entries: watch_optional_kind::<ServiceEntry>(&client, watch("ServiceEntry")),
            workload_entries: watch_optional_kind::<WorkloadEntry>(&client, watch("WorkloadEntry")),
        };
        let task = rebuild(Arc::clone(&registry), stores, settings, changed, observer);
        let shutdown = until_stopped();
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown => {}
                () = task => {}
            }
        });
        registry
    }

    /// Whether every watch has listed once.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// A receiver of readiness changes.
    pub fn readiness(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }

    /// What the source still waits for, while not ready.
    pub fn waiting_for(&self) -> String {
        self.waiting_for
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_waiting_for(&self, what: &str) {
        let mut waiting = self
            .waiting_for
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        what.clone_into(&mut waiting);
    }
}

impl PodRegistry for KubeRegistry {
    fn snapshot(&self) -> Arc<MeshSnapshot> {
        Arc::clone(&self.current.borrow())
    }

    fn changes(&self) -> watch::Receiver<Arc<MeshSnapshot>> {
        self.current.subscribe()
    }
}

/// One reflector store per kind.
struct Stores {
    pods: Store<Pod>,
    namespaces: Store<Namespace>,
    services: Store<Service>,
    endpoint_slices: Store<EndpointSlice>,
    nodes: Store<Node>,
    authorization_policies: Store<AuthorizationPolicy>,
    peer_authentications: OptionalStore<PeerAuthentication>,
    gateways: OptionalStore<Gateway>,
    gateway_classes: OptionalStore<GatewayClass>,
    service_entries: OptionalStore<ServiceEntry>,
    workload_entries: OptionalStore<WorkloadEntry>,
}

/// The store of a kind whose CRD may be absent, and whether the API server
/// said so.
struct OptionalStore<K: kube::Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    absent: watch::Receiver<bool>,
}

impl<K: kube::Resource<DynamicType = ()> + Clone + 'static> OptionalStore<K> {
    /// Until the first list, or until the API server says the kind is not
    /// served.
    async fn wait_until_settled(&self) {
        let mut absent = self.absent.clone();
        tokio::select! {
            _ = self.store.wait_until_ready() => {}
            _ = absent.wait_for(|absent| *absent) => {}
        }
    }
}

impl Stores {
    /// Waits until every store has its first list, saying which it still
    /// waits for.
    async fn wait_until_ready(&self, registry: &KubeRegistry) {
        macro_rules! wait {
            ($store:expr, $kind:literal) => {
                registry.set_waiting_for(concat!("the first list of ", $kind));
                // The writer lives as long as its watch task, which runs
                // until shutdown.
                let _ = $store.wait_until_ready().await;
            };
        }
        wait!(self.pods, "Pods");
        wait!(self.namespaces, "Namespaces");
        wait!(self.services, "Services");
        wait!(self.endpoint_slices, "EndpointSlices");
        wait!(self.nodes, "Nodes");
        wait!(self.authorization_policies, "AuthorizationPolicies");
        registry.set_waiting_for(
            "the first list of PeerAuthentications (or word that they are not served)",
        );
        self.peer_authentications.wait_until_settled().await;
        registry.set_waiting_for("the first list of Gateways (or word that they are not served)");
        self.gateways.wait_until_settled().await;
        registry
            .set_waiting_for("the first list of GatewayClasses (or word that they are not served)");
        self.gateway_classes.wait_until_settled().await;
        registry
            .set_waiting_for("the first list of ServiceEntries (or word that they are not served)");
        self.service_entries.wait_until_settled().await;
        registry.set_waiting_for(
            "the first list of WorkloadEntries (or word that they are not served)",
        );
        self.workload_entries.wait_until_settled().await;
    }

    fn objects(&self) -> KubeObjects {
        KubeObjects {
            pods: self.pods.state(),
            namespaces: self.namespaces.state(),
            services: self.services.state(),
            endpoint_slices: self.endpoint_slices.state(),
            nodes: self.nodes.state(),
            authorization_policies: self.authorization_policies.state(),
            peer_authentications: self.peer_authentications.store.state(),
            gateways: self.gateways.store.state(),
            gateway_classes: self.gateway_classes.store.state(),
            service_entries: self.service_entries.store.state(),
            workload_entries: self.workload_entries.store.state(),
        }
    }
}

/// Starts the watch of one kind with `config` into a reflector store and
/// returns the store. Every event and every error (after which the watch
/// resumes with kube-runtime's backoff) goes to `on_event`; the watch ends
/// when `shutdown` resolves. The one way this workspace watches a kind:
/// the control plane's mesh and untaint controller and the node agent use
/// it.
pub fn watch_into_store<K>(
    api: Api<K>,
    config: watcher::Config,
    mut on_event: impl FnMut(Result<(), watcher::Error>) + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let stream = watcher(api, config).default_backoff().reflect(writer);
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        tokio::pin!(shutdown);
        loop {
            let event = tokio::select! {
                () = &mut shutdown => return,
                event = stream.next() => event,
            };
            match event {
                Some(event) => on_event(event.map(drop)),
                None => return,
            }
        }
    });
    store
}

/// The settings of one of the mesh's watches: the kind's name in reports,
/// what to wake, whom to tell, and until when.
type MeshWatch<'a, S> = (
    &'static str,
    &'a Arc<Notify>,
    &'a Arc<dyn SourceObserver>,
    S,
);

/// Watches one kind over all namespaces for the mesh: every event wakes
/// the rebuild, every error is reported.
fn watch_kind<K>(
    client: &kube::Client,
    watch: MeshWatch<'_, impl Future<Output = ()> + Send + 'static>,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    watch_mesh_kind(client, watch, false).store
}

/// Watches a kind whose CRD may not be installed: as [`watch_kind`], but a
/// "not found" from the API server is told once through
/// [`SourceObserver::kind_absent`] (until the kind is served again) rather
/// than as a failure, and settles the store's first list as empty.
fn watch_optional_kind<K>(
    client: &kube::Client,
    watch: MeshWatch<'_, impl Future<Output = ()> + Send + 'static>,
) -> OptionalStore<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    watch_mesh_kind(client, watch, true)
}

fn watch_mesh_kind<K>(
    client: &kube::Client,
    (kind, changed, observer, shutdown): MeshWatch<'_, impl Future<Output = ()> + Send + 'static>,
    optional: bool,
) -> OptionalStore<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let changed = Arc::clone(changed);
    let observer = Arc::clone(observer);
    let (absent_sender, absent) = watch::channel(false);
    let on_event = move |event: Result<(), watcher::Error>| match event {
        Ok(()) => {
            absent_sender.send_replace(false);
            changed.notify_one();
        }
        Err(error) if optional && is_not_served(&error) => {
            if !absent_sender.send_replace(true) {
                observer.kind_absent(kind);
            }
        }
        Err(error) => observer.watch_failed(kind, &ErrorChain(&error).to_string()),
    };
    let store = watch_into_store(
        Api::all(client.clone()),
        watcher::Config::default(),
        on_event,
        shutdown,
    );
    OptionalStore { store, absent }
}

/// Whether a watch failed because the API server does not serve the kind
/// (404: its CRD is not installed). The API server answers a path of an
/// unknown group with a plain-text "404 page not found", not a Status of
/// reason `NotFound`, so the code alone decides.
pub fn is_not_served(error: &watcher::Error) -> bool {
    const NOT_FOUND: u16 = 404;
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == NOT_FOUND,
        watcher::Error::WatchError(status) => status.code == NOT_FOUND,
        _ => false,
    }
}

/// Builds a snapshot once every store is ready, then after each burst of
/// changes.
async fn rebuild(
    registry: Arc<KubeRegistry>,
    stores: Stores,
    settings: ConvertSettings,
    changed: Arc<Notify>,
    observer: Arc<dyn SourceObserver>,
) {
    stores.wait_until_ready(&registry).await;
    let mut reported: HashSet<String> = HashSet::new();
    loop {
        let conversion = convert(&stores.objects(), &settings);
        let mut still_reported = HashSet::with_capacity(conversion.problems.len());
        for problem in &conversion.problems {
            let key = problem.to_string();
            if !reported.contains(&key) {
                observer.object_refused(problem);
            }
            still_reported.insert(key);
        }
        reported = still_reported;
        match MeshSnapshot::new(conversion.mesh) {
            Ok(snapshot) => {
                observer.snapshot_built(&snapshot);
                registry.current.send_replace(Arc::new(snapshot));
                registry.ready.send_replace(true);
            }
            // The conversion leaves out what the snapshot would refuse; if
            // it ever does not, the last good snapshot stays.
            Err(error) => observer.watch_failed("snapshot", &ErrorChain(&error).to_string()),
        }
        changed.notified().await;
        tokio::time::sleep(REBUILD_DELAY).await;
    }
}
