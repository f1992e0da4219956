//! `/config_dump` in istio/ztunnel's shape (AMBIENT.md §6.2), which
//! `istioctl ztunnel-config` reads: workloads, services, policies,
//! certificates (public certificates only, never keys), the local file's
//! content read again (`staticConfig`), the build, part of the
//! configuration and, in shared mode, the pods served. Keys are sorted
//! at every level, as the dump is rendered through `serde_json::Value`.
//!
//! How each resource is rendered is `dump/{mesh,certificate}.rs`; a policy
//! is written in its own form (`rbac`), the one the local file reads.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use ztunnel_certs::error_chain::ErrorChain;

use crate::admin::ConfigDump;
use crate::config::{Config, ProxyMode, local};
use crate::context::ConnectionsShown;
use crate::identity::manager::{CertificateSummary, IdentityManager};
use crate::inpod::PodInfo;
use crate::inpod::workloads::Workloads;
use crate::rbac::Policy;
use crate::state::{SharedState, State};
use crate::tracker::Shown;
use crate::version::BuildInfo;

mod certificate;
mod mesh;

/// `/config_dump`'s sources.
pub struct Dump {
    /// Workloads, services and policies.
    pub state: SharedState,
    /// Certificates.
    pub identities: IdentityManager,
    /// The shared mode's pods; `None` in dedicated mode.
    pub pods: Option<Arc<Workloads>>,
    /// The configuration, part of which is shown.
    pub config: Arc<Config>,
}

impl ConfigDump for Dump {
    fn config_dump(&self) -> Value {
        let certificates = self.identities.snapshot();
        let pods = self.pods.as_ref().map(|pods| pods.pods());
        let file = self
            .config
            .local_xds_path
            .as_deref()
            .and_then(static_config);
        render(
            &self.state.read(),
            file.as_ref(),
            &certificates,
            pods.as_deref(),
            &self.config,
        )
    }
}

/// The local file (`LOCAL_XDS_PATH`) read again, as `staticConfig` shows
/// it; `None`, with a warning, when it does not load now.
fn static_config(path: &Path) -> Option<State> {
    match local::load(path) {
        Ok(file) => Some(file.into_state()),
        Err(error) => {
            tracing::warn!(error = %ErrorChain(&error), "config_dump: the local file does not load");
            None
        }
    }
}

/// The whole dump from its parts: `file` is the local file's content
/// (`staticConfig`, empty without one); `pods` is `None` in dedicated
/// mode, which has no `workloadState`.
fn render(
    state: &State,
    file: Option<&State>,
    certificates: &[CertificateSummary],
    pods: Option<&[(PodInfo, Option<ConnectionsShown>)]>,
    config: &Config,
) -> Value {
    let static_config = match file {
        Some(file) => json!({
            "policies": policies(file),
            "services": mesh::services(file),
            "workloads": mesh::workloads(file),
        }),
        None => json!({"policies": [], "services": [], "workloads": []}),
    };
    let mut dump = json!({
        "certificates": certificate::certificates(certificates),
        "config": ConfigShown::of(config),
        "policies": policies(state),
        "services": mesh::services(state),
        // Endpoints are kept whether or not their service has arrived, so
        // none waits for it here.
        "stagedServices": {},
        "staticConfig": static_config,
        "version": BuildInfo::new(&config.istio_version),
        "workloads": mesh::workloads(state),
    });
    if let (Some(pods), Value::Object(top)) = (pods, &mut dump) {
        top.insert("workloadState".to_owned(), workload_state(pods));
    }
    dump
}

/// `policies[]` (AMBIENT.md §6.4): every policy, sorted by resource name.
fn policies(state: &State) -> Vec<&Policy> {
    let mut policies: Vec<_> = state.policies().collect();
    policies.sort_by(|a, b| a.0.cmp(b.0));
    policies.into_iter().map(|(_, policy)| &**policy).collect()
}

/// `workloadState`: each pod served, by its uid from ZDS, with its
/// proxy's open connections while the proxy runs.
fn workload_state(pods: &[(PodInfo, Option<ConnectionsShown>)]) -> Value {
    let pods: BTreeMap<&str, Value> = pods
        .iter()
        .map(|(pod, connections)| {
            let info = json!({
                "name": &*pod.workload.name,
                "namespace": &*pod.workload.namespace,
                "serviceAccount": &*pod.workload.service_account,
            });
            let mut entry = json!({"info": info, "state": "Up"});
            if let (Some(connections), Value::Object(entry)) = (connections, &mut entry) {
                entry.insert("connections".to_owned(), connections_shown(connections));
            }
            (&*pod.uid, entry)
        })
        .collect();
    json!(pods)
}

/// A proxy's `connections`: each direction's items sorted by source,
/// then destination, so that the dump reads the same between requests.
fn connections_shown(connections: &ConnectionsShown) -> Value {
    let items = |shown: &[Shown]| {
        let mut shown = shown.to_vec();
        shown.sort_by_key(|item| (item.src, item.actual_dst, item.original_dst));
        shown.iter().map(connection_item).collect::<Vec<Value>>()
    };
    json!({
        "inbound": items(&connections.inbound),
        "outbound": items(&connections.outbound),
    })
}

/// One item: `{src, originalDst, actualDst, protocol}`, addresses as
/// `ip:port` and `originalDst` `null` when there is none.
fn connection_item(shown: &Shown) -> Value {
    json!({
        "actualDst": shown.actual_dst.to_string(),
        "originalDst": shown.original_dst.map(|addr| addr.to_string()),
        "protocol": shown.protocol.name(),
        "src": shown.src.to_string(),
    })
}

/// The settings an operator asks about first, under istio/ztunnel's names.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ConfigShown<'a> {
    proxy_mode: &'static str,
    cluster_id: &'a str,
    network: &'a str,
    trust_domain: &'a str,
    ca_address: &'a str,
    xds_address: Option<String>,
    local_xds_path: Option<String>,
    num_worker_threads: usize,
    self_termination_deadline: DurationShown,
    secret_ttl: DurationShown,
}

/// A duration as Rust's serde writes it, which is how Istio's dump shows one.
#[derive(Serialize)]
struct DurationShown {
    secs: u64,
    nanos: u32,
}

impl From<Duration> for DurationShown {
    fn from(duration: Duration) -> Self {
        DurationShown {
            secs: duration.as_secs(),
            nanos: duration.subsec_nanos(),
        }
    }
}

impl<'a> ConfigShown<'a> {
    fn of(config: &'a Config) -> Self {
        ConfigShown {
            proxy_mode: match config.mode {
                ProxyMode::Shared => "Shared",
                ProxyMode::Dedicated(_) => "Dedicated",
            },
            cluster_id: &config.cluster_id,
            network: &config.network,
            trust_domain: &config.trust_domain,
            ca_address: &config.ca_address,
            xds_address: config.xds.as_ref().map(|xds| xds.address.to_string()),
            local_xds_path: config
                .local_xds_path
                .as_ref()
                .map(|path| path.display().to_string()),
            num_worker_threads: config.worker_threads,
            self_termination_deadline: config.drain_deadline.into(),
            secret_ttl: config.secret_ttl.into(),
        }
    }
}

#[cfg(test)]
mod tests;
