//! One Kubernetes Pod → one mesh [`Pod`] (KUBERNETES.md E2–E4): identity
//! for the CA (uid, service account, node, phase) and the workload fields
//! istiod derives (workload uid and name, tunnel protocol, readiness,
//! locality, named ports). Which pods make workloads is the model's
//! decision (`Pod::is_live` and an address), not this file's.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Node, Pod as KubePod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::identity::Identity;

use super::{ConvertSettings, Outcome, ProblemReason, labels, name_and_namespace, value};
use crate::{Locality, Pod, PodPhase, WorkloadProtocol, WorkloadType};

/// Set by the CNI node agent once the pod's traffic is redirected to its
/// node's proxy.
const REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";

/// Lists the tunnels the pod itself terminates.
const TUNNEL_LABEL: &str = "networking.istio.io/tunnel";

/// Names the workload explicitly, overriding the owner's name.
pub(super) const WORKLOAD_NAME_LABEL: &str = "service.istio.io/workload-name";

/// The hash a Deployment's ReplicaSet appends to its name.
const POD_TEMPLATE_HASH_LABEL: &str = "pod-template-hash";

/// The hash an Argo Rollout's ReplicaSet appends to its name.
const ROLLOUTS_POD_TEMPLATE_HASH_LABEL: &str = "rollouts-pod-template-hash";

/// The DeploymentConfig behind an OpenShift ReplicationController.
const DEPLOYMENT_CONFIG_LABEL: &str = "deploymentconfig";

/// Node labels of the pod's locality.
const REGION_LABEL: &str = "topology.kubernetes.io/region";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const SUBZONE_LABEL: &str = "topology.istio.io/subzone";

/// The trust domain peers assume when a workload names none.
const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// The service account Kubernetes gives a pod that names none.
const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// Node name → the locality its labels give, for nodes with any of the
/// labels.
pub(super) fn localities(nodes: &[Arc<Node>]) -> HashMap<&str, Locality> {
    nodes
        .iter()
        .filter_map(|node| {
            let name = node.metadata.name.as_deref()?;
            let labels = &node.metadata.labels;
            let label = |key| value(labels, key).unwrap_or_default().to_owned();
            let locality = Locality {
                region: label(REGION_LABEL),
                zone: label(ZONE_LABEL),
                subzone: label(SUBZONE_LABEL),
            };
            (locality != Locality::default()).then_some((name, locality))
        })
        .collect()
}

/// The mesh pod of a Kubernetes Pod; left out when it lacks a name,
/// namespace or uid.
pub(super) fn pod(
    object: &KubePod,
    localities: &HashMap<&str, Locality>,
    settings: &ConvertSettings,
) -> Outcome<Pod> {
    let metadata = &object.metadata;
    let names = name_and_namespace(metadata).and_then(|(name, namespace)| {
        let uid = uid(metadata.uid.as_deref())?;
        Ok((name, namespace, uid))
    });
    let (name, namespace, uid) = match names {
        Ok(names) => names,
        Err(reason) => return Outcome::left_out(reason),
    };
    let spec = object.spec.as_ref();
    let (ips, problems) = addresses(object);
    let node_name = spec
        .and_then(|spec| spec.node_name.clone())
        .filter(|node| !node.is_empty());
    let service_account = service_account(object).to_owned();
    if let Err(error) = Identity::check_parts(&namespace, &service_account) {
        return Outcome::left_out(ProblemReason::InvalidIdentity(
            ErrorChain(&error).to_string(),
        ));
    }
    let (protocol, native_tunnel) = tunnel(metadata);
    let status = object.status.as_ref();
    let pod = Pod {
        workload_uid: Some(format!("{}//Pod/{namespace}/{name}", settings.cluster_id)),
        workload_name: Some(workload_name(object, &name)),
        workload_type: Some(WorkloadType::Pod),
        locality: node_name
            .as_deref()
            .and_then(|node| localities.get(node).cloned()),
        node_name,
        service_account,
        phase: phase(status.and_then(|status| status.phase.as_deref())),
        ips,
        labels: labels(metadata),
        protocol,
        native_tunnel,
        network: settings.network.clone(),
        cluster_id: Some(settings.cluster_id.clone()),
        host_network: spec.and_then(|spec| spec.host_network) == Some(true),
        ready: Some(is_ready(object)),
        trust_domain: Some(wire_trust_domain(settings)),
        container_ports: spec.map(container_ports).unwrap_or_default(),
        // Bound by `convert.rs`, which sees the Gateways.
        waypoint: None,
        application_tunnel: None,
        name,
        namespace,
        uid,
    };
    Outcome {
        entry: Some(pod),
        problems,
    }
}

/// `metadata.uid`: present, and without a `/`.
fn uid(uid: Option<&str>) -> Result<String, ProblemReason> {
    match uid {
        None | Some("") => Err(ProblemReason::MissingField {
            field: "metadata.uid",
        }),
        Some(uid) if uid.contains('/') => Err(ProblemReason::SlashInUid {
            uid: uid.to_owned(),
        }),
        Some(uid) => Ok(uid.to_owned()),
    }
}

/// Condition `Ready` is `True` and no deletion is pending.
fn is_ready(object: &KubePod) -> bool {
    let conditions = object
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_deref())
        .unwrap_or_default();
    object.metadata.deletion_timestamp.is_none()
        && conditions
            .iter()
            .any(|condition| condition.type_ == "Ready" && condition.status == "True")
}

/// `status.phase`; absent is Pending (the API server sets it on create).
fn phase(phase: Option<&str>) -> PodPhase {
    match phase {
        None | Some("Pending") => PodPhase::Pending,
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        Some(_) => PodPhase::Unknown,
    }
}

/// `status.podIPs`, else `status.podIP`; unparsable ones are reported.
/// The pod's service account: `spec.serviceAccountName`, or the one
/// Kubernetes gives a pod that names none.
pub fn service_account(object: &KubePod) -> &str {
    object
        .spec
        .as_ref()
        .and_then(|spec| spec.service_account_name.as_deref())
        .filter(|account| !account.is_empty())
        .unwrap_or(DEFAULT_SERVICE_ACCOUNT)
}

/// The pod's addresses (`status.podIPs`, else `status.podIP`), each once;
/// text that is no address is left out.
pub fn pod_addresses(object: &KubePod) -> Vec<IpAddr> {
    addresses(object).0
}

/// The pod's addresses, and a problem for each text that is no address.
fn addresses(object: &KubePod) -> (Vec<IpAddr>, Vec<ProblemReason>) {
    let Some(status) = &object.status else {
        return (Vec::new(), Vec::new());
    };
    let listed: Vec<&str> = match &status.pod_ips {
        Some(ips) if !ips.is_empty() => ips.iter().map(|ip| ip.ip.as_str()).collect(),
        _ => status.pod_ip.as_deref().into_iter().collect(),
    };
    let mut ips = Vec::with_capacity(listed.len());
    let mut problems = Vec::new();
    for text in listed.into_iter().filter(|text| !text.is_empty()) {
        match text.parse::<IpAddr>() {
            Ok(ip) if !ips.contains(&ip) => ips.push(ip),
            Ok(_) => {}
            Err(_) => problems.push(ProblemReason::BadAddress {
                address: text.to_owned(),
            }),
        }
    }
    (ips, problems)
}

/// The workload a pod belongs to (E3): the workload-name label; else, for
/// a pod made by a controller, the controller's owner as far as its name
/// tells; else the pod's own name.
fn workload_name(object: &KubePod, pod_name: &str) -> String {
    let metadata = &object.metadata;
    if let Some(name) = value(&metadata.labels, WORKLOAD_NAME_LABEL) {
        return name.to_owned();
    }
    let generated = metadata
        .generate_name
        .as_deref()
        .is_some_and(|prefix| !prefix.is_empty());
    let controller = metadata
        .owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true));
    let Some(owner) = controller.filter(|_| generated) else {
        return pod_name.to_owned();
    };
    let label = |key| value(&metadata.labels, key);
    match owner.kind.as_str() {
        "ReplicaSet" => [POD_TEMPLATE_HASH_LABEL, ROLLOUTS_POD_TEMPLATE_HASH_LABEL]
            .into_iter()
            .filter_map(label)
            .find_map(|hash| owner.name.strip_suffix(hash)?.strip_suffix('-'))
            .unwrap_or(&owner.name)
            .to_owned(),
        "Job" => cron_job_name(&owner.name).unwrap_or(&owner.name).to_owned(),
        "ReplicationController" => label(DEPLOYMENT_CONFIG_LABEL)
            .unwrap_or(&owner.name)
            .to_owned(),
        _ => owner.name.clone(),
    }
}

/// The CronJob behind a Job it scheduled: a CronJob names its Jobs
/// `<cronjob>-<scheduled time in minutes>`, 8 to 10 digits.
fn cron_job_name(job: &str) -> Option<&str> {
    let (cron_job, time) = job.rsplit_once('-')?;
    let digits = (8..=10).contains(&time.len()) && time.bytes().all(|byte| byte.is_ascii_digit());
    (digits && !cron_job.is_empty()).then_some(cron_job)
}

/// Named TCP ports of the containers and of the init containers that run
/// alongside them (`restartPolicy: Always`); the first of a name wins.
fn container_ports(spec: &PodSpec) -> BTreeMap<String, u16> {
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|container| container.restart_policy.as_deref() == Some("Always"));
    let mut ports = BTreeMap::new();
    for container in spec.containers.iter().chain(sidecars) {
        for (name, number) in named_tcp_ports(container) {
            ports.entry(name).or_insert(number);
        }
    }
    ports
}

fn named_tcp_ports(container: &Container) -> impl Iterator<Item = (String, u16)> + '_ {
    container.ports.iter().flatten().filter_map(|port| {
        let tcp = matches!(port.protocol.as_deref(), None | Some("TCP"));
        let name = port.name.as_deref().filter(|name| !name.is_empty())?;
        let number = u16::try_from(port.container_port)
            .ok()
            .filter(|number| *number != 0)?;
        tcp.then(|| (name.to_owned(), number))
    })
}

/// How peers reach a workload of this metadata (a pod, a WorkloadEntry, a
/// ServiceEntry's endpoints), as istiod decides it: HBONE when the node
/// agent redirected it or it terminates HBONE itself (the second value),
/// plain TCP otherwise.
pub(super) fn tunnel(metadata: &ObjectMeta) -> (WorkloadProtocol, bool) {
    let native_tunnel = value(&metadata.labels, TUNNEL_LABEL)
        .is_some_and(|tunnels| tunnels.split(',').any(|tunnel| tunnel.trim() == "http"));
    let redirected = value(&metadata.annotations, REDIRECTION_ANNOTATION) == Some("enabled");
    let protocol = if redirected || native_tunnel {
        WorkloadProtocol::Hbone
    } else {
        WorkloadProtocol::Tcp
    };
    (protocol, native_tunnel)
}

/// `Workload.trust_domain` as istiod fills it: empty for the default
/// `cluster.local`.
pub(super) fn wire_trust_domain(settings: &ConvertSettings) -> String {
    if settings.trust_domain == DEFAULT_TRUST_DOMAIN {
        String::new()
    } else {
        settings.trust_domain.clone()
    }
}

#[cfg(test)]
mod tests;
