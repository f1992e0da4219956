//! The Kubernetes objects the scenario creates, as YAML for `kubectl
//! apply`: the namespaces and service accounts, the echo pods, and the
//! short-lived pods that make a step's connections. Creating them and
//! waiting on them is `real_cluster.rs`'s business.

use ztunnel_test_support::real_cluster::LoadgenPod;

use super::Source;
use crate::APP_PORT;

/// The namespaces (`default` labelled ambient, `legacy` left out of the
/// mesh) and a service account for every identity of the scenario.
pub fn namespaces_and_accounts() -> String {
    let mut objects = String::from(
        "apiVersion: v1
kind: Namespace
metadata: {name: default, labels: {istio.io/dataplane-mode: ambient}}
---
apiVersion: v1
kind: Namespace
metadata: {name: legacy}
",
    );
    for (namespace, service_account) in [
        ("default", "client"),
        ("default", "db"),
        ("default", "web"),
        ("legacy", "legacy"),
    ] {
        objects.push_str(&format!(
            "---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: {service_account}, namespace: {namespace}}}
"
        ));
    }
    objects
}

/// An echo pod named `name` on `node`, under the service account of the
/// same name, in the ambient namespace, running `image`. kubelet probes it,
/// which a meshed pod lets through by the node agent's probe exemption.
pub fn echo_pod(image: &str, name: &str, node: &str) -> String {
    format!(
        r#"---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, labels: {{app: {name}, role: echo}}}}
spec:
  serviceAccountName: {name}
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  containers:
    - name: echo
      image: {image}
      imagePullPolicy: Never
      command: [ztunnel-loadgen, --quiet, serve, --listen, "0.0.0.0:{APP_PORT}"]
      ports: [{{containerPort: {APP_PORT}}}]
      readinessProbe: {{tcpSocket: {{port: {APP_PORT}}}, periodSeconds: 1}}
"#
    )
}

/// A pod named `name` (and labelled `run=<name>`) under `from` that runs
/// `ztunnel-loadgen` from `image` with `args` once, in a container named
/// `client`.
pub fn client_pod(image: &str, name: &str, from: Source, args: &[&str]) -> String {
    LoadgenPod {
        name,
        namespace: from.namespace,
        service_account: from.service_account,
        node: from.node,
        label: ("run", name),
        container: "client",
        args,
    }
    .yaml(image)
}
