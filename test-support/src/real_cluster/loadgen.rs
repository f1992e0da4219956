//! The pod that runs `ztunnel-loadgen` once from the test application
//! image: a step's client, a soak through a rollout. The tests and the
//! demo create it through the API; this builds its YAML.

/// One `ztunnel-loadgen` run in a pod of its own (`restartPolicy: Never`),
/// pinned to a node.
pub struct LoadgenPod<'a> {
    /// The pod's name.
    pub name: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// The service account it runs under: its mesh identity.
    pub service_account: &'a str,
    /// The node it is pinned to.
    pub node: &'a str,
    /// The pod's one label, `key: value`.
    pub label: (&'a str, &'a str),
    /// The container's name, for reading its log.
    pub container: &'a str,
    /// `ztunnel-loadgen`'s arguments after `--quiet`.
    pub args: &'a [&'a str],
}

impl LoadgenPod<'_> {
    /// The pod as YAML for `kubectl apply`, running `image`.
    pub fn yaml(&self, image: &str) -> String {
        // A JSON array is a YAML flow sequence, with every argument quoted.
        let args = serde_json::Value::from(self.args.to_vec());
        format!(
            "apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {namespace}, labels: {{{key}: {value}}}}}
spec:
  serviceAccountName: {service_account}
  restartPolicy: Never
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  containers:
    - name: {container}
      image: {image}
      imagePullPolicy: Never
      command: [ztunnel-loadgen, --quiet]
      args: {args}
",
            name = self.name,
            namespace = self.namespace,
            key = self.label.0,
            value = self.label.1,
            service_account = self.service_account,
            node = self.node,
            container = self.container,
        )
    }
}
