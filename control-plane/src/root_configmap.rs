//! The root publisher: keeps the ConfigMap `istio-ca-root-cert` (key
//! `root-cert.pem`, the CA's root bundle) in the control plane's namespace
//! and in each namespace it is given. ztunnel mounts it at
//! `/var/run/secrets/istio` to verify the CA and its peers (KUBERNETES.md
//! G1), so a missing or edited ConfigMap is put back: each namespace's
//! ConfigMap of that name is watched (field selector `metadata.name`), and
//! every change is compared with the root.
//!
//! As istiod does, only the `root-cert.pem` key is compared and written;
//! other keys someone added stay. Writes carry the `resourceVersion` that
//! was read, so a concurrent change (or a second replica writing the same)
//! fails with a conflict and is read again rather than overwritten. What
//! to write is decided by the pure [`desired_write`]; [`run`] is the shell.
//! Where the root comes from is `crate::ca`'s business.
//!
//! The role: `deploy/rbac/control-plane-ca.yaml` (a RoleBinding in each
//! namespace).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::sync::Notify;
use ztunnel_certs::error_chain::ErrorChain;

use crate::ca::signing_secret::ROOT_CERT_KEY;
use crate::kubernetes::watch_waking;

/// The ConfigMap's name, as ztunnel's chart mounts it.
pub const NAME: &str = "istio-ca-root-cert";

/// The label istiod puts on the ConfigMaps it publishes.
const LABEL: (&str, &str) = ("istio.io/config", "true");

/// The controller's name in logs.
const CONTROLLER: &str = "root publisher";

/// How long after a failed write every namespace is checked again: a
/// conflict clears at once, but a namespace that does not exist yet or a
/// missing role do not, and every attempt is logged.
const RETRY: Duration = Duration::from_secs(5);

/// A write that makes a namespace's ConfigMap hold the root.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// The ConfigMap does not exist.
    Create(ConfigMap),
    /// It exists with another root: the object as read, with the root.
    Update(ConfigMap),
}

/// What to write so that `namespace`'s ConfigMap, now `existing`, holds
/// `root_bundle_pem` under `root-cert.pem`; `None` when it does.
pub fn desired_write(
    existing: Option<&ConfigMap>,
    namespace: &str,
    root_bundle_pem: &str,
) -> Option<Write> {
    let Some(existing) = existing else {
        let labels = BTreeMap::from([(LABEL.0.to_owned(), LABEL.1.to_owned())]);
        return Some(Write::Create(ConfigMap {
            metadata: ObjectMeta {
                name: Some(NAME.to_owned()),
                namespace: Some(namespace.to_owned()),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                ROOT_CERT_KEY.to_owned(),
                root_bundle_pem.to_owned(),
            )])),
            ..ConfigMap::default()
        }));
    };
    let current = existing
        .data
        .as_ref()
        .and_then(|data| data.get(ROOT_CERT_KEY));
    if current.map(String::as_str) == Some(root_bundle_pem) {
        return None;
    }
    let mut updated = existing.clone();
    updated
        .data
        .get_or_insert_with(BTreeMap::new)
        .insert(ROOT_CERT_KEY.to_owned(), root_bundle_pem.to_owned());
    Some(Write::Update(updated))
}

/// Keeps the root published in every one of `namespaces` until
/// `shutdown` resolves.
pub async fn run(
    client: kube::Client,
    namespaces: BTreeSet<String>,
    root_bundle_pem: String,
    shutdown: impl Future<Output = ()> + Send,
) {
    let changed = Arc::new(Notify::new());
    let targets: Vec<Target> = namespaces
        .into_iter()
        .map(|namespace| {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
            let config = watcher::Config::default().fields(&format!("metadata.name={NAME}"));
            let store = watch_waking(api.clone(), config, (CONTROLLER, "ConfigMap"), &changed);
            Target {
                namespace,
                api,
                store,
            }
        })
        .collect();
    tracing::info!(
        namespaces = %targets.iter().map(|target| target.namespace.as_str()).collect::<Vec<_>>().join(","),
        "publishing the root as ConfigMap {NAME}"
    );
    tokio::pin!(shutdown);
    let mut retry = false;
    loop {
        // `Notify::notified` and `sleep` are cancel safe: a wake-up that
        // comes while the namespaces are written is kept for the next turn.
        tokio::select! {
            () = &mut shutdown => return,
            () = changed.notified() => {}
            () = tokio::time::sleep(RETRY), if retry => {}
        }
        retry = false;
        for target in &targets {
            retry |= !target.publish(&root_bundle_pem).await;
        }
    }
}

/// One namespace's ConfigMap: how to write it, and its watch.
struct Target {
    /// Where it is published.
    namespace: String,
    /// Writes go to this namespace alone, which is all the role grants.
    api: Api<ConfigMap>,
    /// The ConfigMap as last seen, compared with the root on every change.
    store: Store<ConfigMap>,
}

impl Target {
    /// Writes the ConfigMap if it does not hold the root; `false` when the
    /// write failed and should be tried again.
    async fn publish(&self, root_bundle_pem: &str) -> bool {
        let existing = self
            .store
            .get(&ObjectRef::new(NAME).within(&self.namespace));
        let Some(write) = desired_write(existing.as_deref(), &self.namespace, root_bundle_pem)
        else {
            return true;
        };
        let params = PostParams::default();
        let (result, verb) = match &write {
            Write::Create(object) => (self.api.create(&params, object).await, "created"),
            Write::Update(object) => (self.api.replace(NAME, &params, object).await, "updated"),
        };
        let namespace = self.namespace.as_str();
        match result {
            Ok(_) => {
                tracing::info!(namespace, "root ConfigMap {NAME} {verb}");
                true
            }
            Err(kube::Error::Api(status)) if status.is_already_exists() || status.is_conflict() => {
                // The watch has not shown the current object yet (it is
                // still listing, or a replica wrote meanwhile).
                tracing::debug!(namespace, reason = %status.reason, "root ConfigMap changed meanwhile; reading it again");
                false
            }
            Err(error) => {
                tracing::warn!(
                    namespace,
                    error = %ErrorChain(&error),
                    "cannot publish the root ConfigMap {NAME}; retrying (role: deploy/rbac/control-plane-ca.yaml)"
                );
                false
            }
        }
    }
}

#[cfg(test)]
mod tests;
