//! The control plane on Kubernetes: the API client (a kubeconfig file, or
//! the pod's own in-cluster credentials), the mesh source watching the API
//! (`ztunnel_mesh::kube`), token authentication by TokenReview, and the
//! check that the control plane's role grants what it needs.
//!
//! Readiness waits for all three: every permission granted, the API
//! server's service-account keys fetched (`ca::published_keys`), and every
//! watch listed once. A missing verb keeps the control plane unready with a
//! log line naming it, re-checked until it is granted; it is never a crash.
//!
//! The small controllers (`crate::untaint`, `crate::root_configmap`) watch
//! what they act on with [`watch_waking`].

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tokio::sync::Notify;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_mesh::MeshSnapshot;
use ztunnel_mesh::kube::convert::ObjectProblem;
use ztunnel_mesh::kube::source::{KubeRegistry, SourceObserver, is_not_served, watch_into_store};

use crate::ca::metrics::{CaMetrics, Readiness};
use crate::ca::published_keys::{DISCOVERY_PATH, JWKS_PATH, PublishedKeys};

/// What the control plane does with the API: (verb, group, resource, with
/// `/subresource` where it acts on one). The ClusterRole in
/// `deploy/rbac/control-plane.yaml` grants exactly these.
pub const REQUIRED_ACCESS: &[(&str, &str, &str)] = &[
    ("list", "", "pods"),
    ("watch", "", "pods"),
    ("list", "", "namespaces"),
    ("watch", "", "namespaces"),
    ("list", "", "services"),
    ("watch", "", "services"),
    ("list", "", "nodes"),
    ("watch", "", "nodes"),
    ("list", "discovery.k8s.io", "endpointslices"),
    ("watch", "discovery.k8s.io", "endpointslices"),
    ("list", "security.istio.io", "authorizationpolicies"),
    ("watch", "security.istio.io", "authorizationpolicies"),
    ("list", "security.istio.io", "peerauthentications"),
    ("watch", "security.istio.io", "peerauthentications"),
    ("list", "gateway.networking.k8s.io", "gateways"),
    ("watch", "gateway.networking.k8s.io", "gateways"),
    ("list", "gateway.networking.k8s.io", "gatewayclasses"),
    ("watch", "gateway.networking.k8s.io", "gatewayclasses"),
    // The status addresses of our waypoints (`waypoint_status.rs`).
    ("patch", "gateway.networking.k8s.io", "gateways/status"),
    ("list", "networking.istio.io", "serviceentries"),
    ("watch", "networking.istio.io", "serviceentries"),
    ("list", "networking.istio.io", "workloadentries"),
    ("watch", "networking.istio.io", "workloadentries"),
    // The VIPs allocated to ServiceEntries (`service_entry_status.rs`).
    ("patch", "networking.istio.io", "serviceentries/status"),
    ("create", "authentication.k8s.io", "tokenreviews"),
];

/// The paths the control plane `get`s outside the API's resources: the
/// service-account issuer's discovery document and keys, which tokens are
/// checked against before a TokenReview (`ca::published_keys`). Kubernetes
/// grants them to every service account by default
/// (`system:service-account-issuer-discovery`); the ClusterRole grants
/// them too, so that a cluster without that binding works the same.
pub const REQUIRED_PATHS: &[&str] = &[DISCOVERY_PATH, JWKS_PATH];

/// What the node untaint controller adds (`deploy/rbac/control-plane-untaint.yaml`).
pub const UNTAINT_ACCESS: &[(&str, &str, &str)] = &[("patch", "", "nodes")];

/// How often missing permissions are checked again.
const PERMISSION_RECHECK: Duration = Duration::from_secs(5);

/// A client from `kubeconfig`, or from the pod's service account when none
/// is given.
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => kube::Config::incluster()
            .context("no --kubeconfig, and not inside a pod (in-cluster configuration)")?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// Logs and counts what the mesh source reports.
pub struct MetricsObserver(pub Arc<CaMetrics>);

impl SourceObserver for MetricsObserver {
    fn watch_failed(&self, kind: &'static str, error: &str) {
        self.0.record_kube_watch_error(kind);
        tracing::warn!(
            kind,
            error,
            "Kubernetes watch failed; keeping the last state, retrying"
        );
    }

    fn object_refused(&self, problem: &ObjectProblem) {
        self.0.record_kube_object_refused(problem.kind);
        tracing::warn!(
            kind = problem.kind,
            object = %format_args!("{}/{}", problem.namespace, problem.name),
            reason = %problem.reason,
            "Kubernetes object left out of the mesh"
        );
    }

    fn kind_absent(&self, kind: &'static str) {
        tracing::info!(
            kind,
            "the API server does not serve this kind (CRD not installed); the mesh is built \
             without it until it is"
        );
    }

    fn snapshot_built(&self, snapshot: &MeshSnapshot) {
        tracing::debug!(
            pods = snapshot.len(),
            services = snapshot.services().len(),
            policies = snapshot.policies().len(),
            "mesh rebuilt from the Kubernetes API"
        );
    }
}

/// Permissions the control plane lacks, kept up to date by
/// [`watch_permissions`].
#[derive(Default)]
pub struct Permissions {
    /// `verb group/resource` of each missing permission; `None` until the
    /// first check.
    missing: Mutex<Option<Vec<String>>>,
}

impl Permissions {
    /// Why the permissions are not in place, or `None` when they are.
    pub fn problem(&self) -> Option<String> {
        let missing = self.missing.lock().unwrap_or_else(PoisonError::into_inner);
        match missing.as_deref() {
            None => Some("permissions not checked yet".to_owned()),
            Some([]) => None,
            Some(list) => Some(format!("the control plane may not {}", list.join(", "))),
        }
    }

    fn set(&self, list: Vec<String>) {
        *self.missing.lock().unwrap_or_else(PoisonError::into_inner) = Some(list);
    }
}

/// Checks `required` (e.g. [`REQUIRED_ACCESS`]) and [`REQUIRED_PATHS`]
/// with SelfSubjectAccessReviews until all are granted, logging what is
/// missing each time it changes.
pub async fn watch_permissions(
    client: kube::Client,
    permissions: Arc<Permissions>,
    required: Vec<(&'static str, &'static str, &'static str)>,
) {
    let mut last: Option<Vec<String>> = None;
    loop {
        let missing = match missing_access(&client, &required).await {
            Ok(missing) => missing,
            Err(error) => vec![format!("(access review failed: {})", ErrorChain(&*error))],
        };
        if last.as_ref() != Some(&missing) {
            if missing.is_empty() {
                tracing::info!("the control plane's Kubernetes permissions are in place");
            } else {
                tracing::error!(
                    missing = %missing.join(", "),
                    "the control plane's role lacks permissions it needs; not ready until granted"
                );
            }
        }
        let done = missing.is_empty();
        permissions.set(missing.clone());
        last = Some(missing);
        if done {
            return;
        }
        tokio::time::sleep(PERMISSION_RECHECK).await;
    }
}

async fn missing_access(
    client: &kube::Client,
    required: &[(&str, &str, &str)],
) -> anyhow::Result<Vec<String>> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let mut missing = Vec::new();
    for (verb, group, resource) in required {
        let (kind, subresource) = match resource.split_once('/') {
            Some((kind, subresource)) => (kind, Some(subresource.to_owned())),
            None => (*resource, None),
        };
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some((*verb).to_owned()),
                    group: Some((*group).to_owned()),
                    resource: Some(kind.to_owned()),
                    subresource,
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        if !allowed(&api, review).await? {
            let group = if group.is_empty() { "core" } else { group };
            missing.push(format!("{verb} {group}/{resource}"));
        }
    }
    for path in REQUIRED_PATHS {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                non_resource_attributes: Some(NonResourceAttributes {
                    verb: Some("get".to_owned()),
                    path: Some((*path).to_owned()),
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        if !allowed(&api, review).await? {
            missing.push(format!("get {path}"));
        }
    }
    Ok(missing)
}

async fn allowed(
    api: &Api<SelfSubjectAccessReview>,
    review: SelfSubjectAccessReview,
) -> anyhow::Result<bool> {
    let answer = api.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|status| status.allowed))
}

/// Readiness of the Kubernetes control plane: permissions, then the
/// service-account keys, then the first list of every watch.
pub fn readiness(
    registry: Arc<KubeRegistry>,
    permissions: Arc<Permissions>,
    keys: Arc<PublishedKeys>,
) -> Readiness {
    Arc::new(move || {
        permissions
            .problem()
            .or_else(|| keys.problem())
            .or_else(|| {
                (!registry.is_ready()).then(|| format!("waiting for {}", registry.waiting_for()))
            })
    })
}

/// [`watch_waking`] for a kind whose CRD may not be installed (yet): until
/// it is, the store stays empty and `absent` (e.g. "Gateway API CRDs not
/// installed") is logged once, not each retry.
pub fn watch_optional_waking<K>(
    api: Api<K>,
    (controller, kind, absent): (&'static str, &'static str, &'static str),
    changed: &Arc<Notify>,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let changed = Arc::clone(changed);
    let mut missing = false;
    let on_event = move |event: Result<(), watcher::Error>| match event {
        Ok(()) => {
            missing = false;
            changed.notify_one();
        }
        Err(error) if is_not_served(&error) => {
            if !missing {
                tracing::info!(controller, "{absent}; waiting for it");
            }
            missing = true;
        }
        Err(error) => {
            tracing::warn!(controller, kind, error = %ErrorChain(&error), "watch failed; retrying")
        }
    };
    watch_into_store(
        api,
        watcher::Config::default(),
        on_event,
        std::future::pending(),
    )
}

/// Watches `api` into a store for `controller`, waking `changed` on every
/// event (the first list included); errors are logged and the watch
/// resumes with backoff. It runs as long as the process.
pub fn watch_waking<K>(
    api: Api<K>,
    config: watcher::Config,
    (controller, kind): (&'static str, &'static str),
    changed: &Arc<Notify>,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let changed = Arc::clone(changed);
    let on_event = move |event: Result<(), watcher::Error>| match event {
        Ok(()) => changed.notify_one(),
        Err(error) => {
            tracing::warn!(controller, kind, error = %ErrorChain(&error), "watch failed; retrying")
        }
    };
    watch_into_store(api, config, on_event, std::future::pending())
}
