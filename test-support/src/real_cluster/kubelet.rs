//! The kubelet of a node and its configuration, for this machine kind:
//! cgroup v1 (`failCgroupV1: false`), cgroupfs under the node's own cgroup
//! root, containerd's CRI socket, the cluster DNS, no eviction (a busy
//! test machine's disk must not evict the pods under test), and the
//! node's registration taints. It authenticates with a client certificate
//! as `system:node:<name>`, so the Node authorizer and NodeRestriction
//! limit it as in any cluster.

use super::containerd;
use super::node::Node;
use crate::kube::KubeApi;

/// Writes the kubelet's configuration and kubeconfig (whose server is
/// `api_server`, the address the node reaches the API server at) and
/// starts it.
pub fn start(
    node: &mut Node,
    api: &KubeApi,
    api_server: &str,
    cluster_dns: &str,
    taints: &[&str],
) -> anyhow::Result<()> {
    let user = format!("system:node:{}", node.name);
    let local =
        api.kubeconfig_for_user(&format!("kubelet-{}", node.name), &user, &["system:nodes"])?;
    let kubeconfig = api.kubeconfig_with_server(&local, api_server)?;
    let config = node.dir.join("kubelet.yaml");
    std::fs::write(&config, config_yaml(node, api, cluster_dns, taints))?;
    let resolv = node.dir.join("resolv.conf");
    // Pods with dnsPolicy Default, and CoreDNS's upstream: nothing outside
    // the cluster answers here.
    std::fs::write(&resolv, "")?;
    let args = vec![
        format!("--config={}", config.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--hostname-override={}", node.name),
        format!("--node-ip={}", node.ip),
        "--v=2".to_owned(),
    ];
    node.spawn("kubelet", &api.bin().join("kubelet"), &args)
}

fn config_yaml(node: &Node, api: &KubeApi, cluster_dns: &str, taints: &[&str]) -> String {
    let register_with_taints: Vec<serde_json::Value> = taints
        .iter()
        .map(|key| serde_json::json!({"key": key, "effect": "NoSchedule"}))
        .collect();
    serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": api.ca_file()},
        },
        "authorization": {"mode": "Webhook"},
        "address": node.ip.to_string(),
        "healthzBindAddress": "127.0.0.1",
        "readOnlyPort": 0,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": format!("/{}", node.cgroup_root()),
        "failCgroupV1": false,
        "failSwapOn": false,
        "containerRuntimeEndpoint": format!("unix://{}", containerd::SOCKET),
        "clusterDNS": [cluster_dns],
        "clusterDomain": "cluster.local",
        "resolvConf": node.dir.join("resolv.conf"),
        "registerWithTaints": register_with_taints,
        "evictionHard": {
            "memory.available": "0%",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": false,
        "protectKernelDefaults": false,
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "localStorageCapacityIsolation": false,
    })
    .to_string()
}

/// The path of a pod's container log inside the node, as kubelet lays it
/// out: `/var/log/pods/<ns>_<pod>_<uid>/<container>/0.log`.
pub fn container_log_dir(namespace: &str, pod: &str, uid: &str) -> String {
    format!("/var/log/pods/{namespace}_{pod}_{uid}")
}

/// Reads every log file of a container inside the node, oldest first.
pub fn container_log(
    node: &Node,
    namespace: &str,
    pod: &str,
    uid: &str,
    container: &str,
) -> String {
    let dir = node.path(&format!(
        "{}/{container}",
        container_log_dir(namespace, pod, uid)
    ));
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .filter_map(|file| std::fs::read_to_string(file).ok())
        .collect::<Vec<_>>()
        .join("")
}
