//! The cluster's control plane beside the API server: kube-controller-
//! manager and kube-scheduler on this machine's loopback (each with a
//! client certificate of its bootstrap RBAC identity), kube-proxy on every
//! node, and the cluster DNS (CoreDNS, as a Deployment behind the
//! `kube-dns` Service, as kubeadm installs it).

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;

use super::node::Node;
use crate::kube::{KubeApi, SERVICE_CLUSTER_IP_RANGE};

/// The cluster DNS Service's address (kubeadm's tenth of the range).
pub const CLUSTER_DNS: &str = "198.19.128.10";

/// The controller-manager and the scheduler, stopped (by PID) on drop.
pub struct Controllers {
    children: Vec<Child>,
}

impl Controllers {
    /// Starts both, logging into `dir`.
    pub fn start(api: &KubeApi, dir: &Path, pod_cidrs: &str) -> anyhow::Result<Controllers> {
        let manager =
            api.kubeconfig_for_user("controller-manager", "system:kube-controller-manager", &[])?;
        let scheduler = api.kubeconfig_for_user("scheduler", "system:kube-scheduler", &[])?;
        let mut children = vec![];
        children.push(spawn(
            Command::new(api.bin().join("kube-controller-manager"))
                .arg(format!("--kubeconfig={}", manager.display()))
                .arg(format!("--authentication-kubeconfig={}", manager.display()))
                .arg(format!("--authorization-kubeconfig={}", manager.display()))
                .arg(format!(
                    "--service-account-private-key-file={}",
                    api.service_account_key().display()
                ))
                .arg(format!("--root-ca-file={}", api.ca_file().display()))
                .arg("--use-service-account-credentials=true")
                .arg("--leader-elect=false")
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={}", free_port()?))
                .arg(format!("--cluster-cidr={pod_cidrs}"))
                .arg(format!(
                    "--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"
                ))
                // A node that stops reporting is noticed in seconds, not
                // the default 50: tests stop nodes' components.
                .arg("--node-monitor-grace-period=20s"),
            &dir.join("controller-manager.log"),
        )?);
        children.push(spawn(
            Command::new(api.bin().join("kube-scheduler"))
                .arg(format!("--kubeconfig={}", scheduler.display()))
                .arg(format!(
                    "--authentication-kubeconfig={}",
                    scheduler.display()
                ))
                .arg(format!(
                    "--authorization-kubeconfig={}",
                    scheduler.display()
                ))
                .arg("--leader-elect=false")
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={}", free_port()?)),
            &dir.join("scheduler.log"),
        )?);
        Ok(Controllers { children })
    }

    /// Fails with the name of a component that has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        for (child, name) in self
            .children
            .iter_mut()
            .zip(["kube-controller-manager", "kube-scheduler"])
        {
            if let Some(status) = child.try_wait()? {
                anyhow::bail!("{name} exited ({status})");
            }
        }
        Ok(())
    }
}

impl Drop for Controllers {
    fn drop(&mut self) {
        for mut child in self.children.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts kube-proxy (iptables mode) on `node`, authenticated as
/// `system:kube-proxy` (bound to `system:node-proxier` by the API
/// server's bootstrap policy).
pub fn start_kube_proxy(
    node: &mut Node,
    api: &KubeApi,
    api_server: &str,
    pod_cidrs: &str,
) -> anyhow::Result<()> {
    let local = api.kubeconfig_for_user(
        &format!("kube-proxy-{}", node.name),
        "system:kube-proxy",
        &[],
    )?;
    let kubeconfig = api.kubeconfig_with_server(&local, api_server)?;
    let config = node.dir.join("kube-proxy.yaml");
    std::fs::write(
        &config,
        serde_json::json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": kubeconfig},
            "hostnameOverride": node.name,
            "mode": "iptables",
            "clusterCIDR": pod_cidrs,
            // The conntrack table and its timeouts are the machine's, not
            // the node's: leave them as they are.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "metricsBindAddress": "127.0.0.1:10249",
            "healthzBindAddress": "127.0.0.1:10256",
        })
        .to_string(),
    )?;
    node.spawn(
        "kube-proxy",
        &api.bin().join("kube-proxy"),
        &[format!("--config={}", config.display())],
    )
}

/// CoreDNS as the cluster DNS: its RBAC, configuration, Deployment (image
/// `coredns_image`, loaded on every node) and the `kube-dns` Service, as
/// kubeadm installs them.
pub fn cluster_dns_manifest(coredns_image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: coredns, namespace: kube-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: "system:coredns"}}
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "system:coredns"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}}
subjects: [{{kind: ServiceAccount, name: coredns, namespace: kube-system}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: coredns, namespace: kube-system}}
data:
  Corefile: |
    .:53 {{
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {{
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 5
        }}
        cache 5
        loop
        reload
    }}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: coredns, namespace: kube-system, labels: {{k8s-app: kube-dns}}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{k8s-app: kube-dns}}}}
  template:
    metadata: {{labels: {{k8s-app: kube-dns}}}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      tolerations:
        - {{key: CriticalAddonsOnly, operator: Exists}}
      containers:
        - name: coredns
          image: {coredns_image}
          imagePullPolicy: Never
          args: [-conf, /etc/coredns/Corefile]
          volumeMounts: [{{name: config, mountPath: /etc/coredns, readOnly: true}}]
          ports:
            - {{name: dns, containerPort: 53, protocol: UDP}}
            - {{name: dns-tcp, containerPort: 53, protocol: TCP}}
          readinessProbe:
            httpGet: {{path: /ready, port: 8181}}
            periodSeconds: 2
          livenessProbe:
            httpGet: {{path: /health, port: 8080}}
      volumes:
        - name: config
          configMap: {{name: coredns, items: [{{key: Corefile, path: Corefile}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: kube-dns, namespace: kube-system, labels: {{k8s-app: kube-dns}}}}
spec:
  selector: {{k8s-app: kube-dns}}
  clusterIP: {CLUSTER_DNS}
  ports:
    - {{name: dns, port: 53, protocol: UDP}}
    - {{name: dns-tcp, port: 53, protocol: TCP}}
"#
    )
}

fn spawn(command: &mut Command, log: &Path) -> anyhow::Result<Child> {
    let out = File::create(log)?;
    let err = out.try_clone()?;
    command
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("starting {:?}", command.get_program()))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(crate::ports::unused_loopback_port()?.port())
}
