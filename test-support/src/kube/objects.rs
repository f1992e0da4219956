//! Objects tests write to the API server, standing in for what a kubelet, a
//! scheduler and the namespace controllers would do: namespaces and service
//! accounts, pods bound to a node with their status written through the
//! status subresource, pod-bound tokens from the TokenRequest API, and
//! manifests applied server-side.

use std::collections::BTreeMap;
use std::net::IpAddr;

use anyhow::Context;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    Container, Namespace, Pod, PodCondition, PodIP, PodSpec, PodStatus, ServiceAccount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

/// The field manager of everything tests write.
const FIELD_MANAGER: &str = "ztunnel-tests";

/// A pod as a test describes it.
#[derive(Debug, Clone, Default)]
pub struct PodSpecForTest {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Service account (created if missing).
    pub service_account: String,
    /// Node it is bound to.
    pub node: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
}

/// Creates `namespace` with `labels` if it does not exist, or sets its
/// labels.
pub async fn ensure_namespace(
    client: &kube::Client,
    namespace: &str,
    labels: &[(&str, &str)],
) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let object = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_owned()),
            labels: Some(owned_map(labels)),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    api.patch(namespace, &apply(), &Patch::Apply(&object))
        .await
        .with_context(|| format!("applying namespace {namespace}"))?;
    Ok(())
}

/// Creates the service account `namespace/name` if it does not exist.
pub async fn ensure_service_account(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<()> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let object = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    api.patch(name, &apply(), &Patch::Apply(&object))
        .await
        .with_context(|| format!("applying service account {namespace}/{name}"))?;
    Ok(())
}

/// Creates a pod bound to its node (as the scheduler would), its service
/// account first, and returns the pod's UID. Its phase is Pending until
/// [`set_pod_running`].
pub async fn create_pod(client: &kube::Client, pod: &PodSpecForTest) -> anyhow::Result<String> {
    ensure_service_account(client, &pod.namespace, &pod.service_account).await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let object = Pod {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            namespace: Some(pod.namespace.clone()),
            labels: Some(pod.labels.clone()),
            annotations: Some(pod.annotations.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(pod.node.clone()),
            service_account_name: Some(pod.service_account.clone()),
            // No kubelet runs it; the image is never pulled.
            containers: vec![Container {
                name: "app".to_owned(),
                image: Some("registry.invalid/app:test".to_owned()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let created = api
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating pod {}/{}", pod.namespace, pod.name))?;
    created
        .metadata
        .uid
        .context("the API server returned a pod without a uid")
}

/// Writes a pod's status as its kubelet would once it runs: phase Running,
/// its IPs, and the Ready condition.
pub async fn set_pod_running(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    ips: &[IpAddr],
    ready: bool,
) -> anyhow::Result<()> {
    let status = PodStatus {
        phase: Some("Running".to_owned()),
        pod_ip: ips.first().map(ToString::to_string),
        pod_ips: Some(ips.iter().map(|ip| PodIP { ip: ip.to_string() }).collect()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".to_owned(),
            status: if ready { "True" } else { "False" }.to_owned(),
            ..PodCondition::default()
        }]),
        ..PodStatus::default()
    };
    set_pod_status(client, namespace, name, status).await
}

/// Writes a pod's phase alone (e.g. `Failed`, `Succeeded`).
pub async fn set_pod_phase(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    phase: &str,
) -> anyhow::Result<()> {
    let status = PodStatus {
        phase: Some(phase.to_owned()),
        ..PodStatus::default()
    };
    set_pod_status(client, namespace, name, status).await
}

async fn set_pod_status(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    status: PodStatus,
) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({ "status": status });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("writing the status of pod {namespace}/{name}"))?;
    Ok(())
}

/// Deletes a pod at once (no kubelet will confirm a graceful deletion).
pub async fn delete_pod(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    api.delete(name, &DeleteParams::default().grace_period(0))
        .await
        .with_context(|| format!("deleting pod {namespace}/{name}"))?;
    Ok(())
}

/// A token for `namespace/service_account` from the TokenRequest API,
/// bound to the pod `pod` (name, uid) when given, for `audience` (the API
/// server's own when `None`: a token to call the API with).
pub async fn request_token(
    client: &kube::Client,
    namespace: &str,
    service_account: &str,
    pod: Option<(&str, &str)>,
    audience: Option<&str>,
) -> anyhow::Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: audience.map(|audience| vec![audience.to_owned()]),
            bound_object_ref: pod.map(|(name, uid)| BoundObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Pod".to_owned()),
                name: Some(name.to_owned()),
                uid: Some(uid.to_owned()),
            }),
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let response: TokenRequest = api
        .create_subresource("token", service_account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token for {namespace}/{service_account}"))?;
    let status = response
        .status
        .context("the TokenRequest response carries no status")?;
    status
        .token
        .context("the TokenRequest response carries no token")
}

fn apply() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

fn owned_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

/// Creates `namespace/name`'s service account and a ClusterRoleBinding of
/// it to `cluster_role`, and returns a token for it to call the API with.
pub async fn service_account_with_role(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    cluster_role: &str,
) -> anyhow::Result<String> {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
    ensure_service_account(client, namespace, name).await?;
    let binding_name = format!("{namespace}-{name}-{cluster_role}");
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(binding_name.clone()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: cluster_role.to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: name.to_owned(),
            namespace: Some(namespace.to_owned()),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(&binding_name, &apply(), &Patch::Apply(&binding))
        .await
        .with_context(|| format!("binding {namespace}/{name} to {cluster_role}"))?;
    request_token(client, namespace, name, None, None).await
}
