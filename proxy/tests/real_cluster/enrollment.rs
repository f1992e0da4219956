//! Pods joining the mesh after the install: one scaled up later, one
//! created while its node agent is stopped, and running pods whose
//! namespace is labelled afterwards. Each must reach its server through
//! ztunnel under its identity from its first connection on.

use super::*;

/// A Deployment scaled from 0 to 1 after everything runs: its pod's first
/// run of connections (the first thing it does) all reach the server over
/// ztunnel under its identity.
pub(super) fn a_pod_scaled_up_later_is_meshed_before_its_first_connection(
    cluster: &RealCluster,
    app: &App,
) {
    let (server, target) = app.echo_on("node-b");
    let image = cluster.images().reference(real_cluster::APP);
    let args = serde_json::to_string(&connect_args(target, 20)).unwrap();
    cluster
        .api()
        .unwrap()
        .apply_server_side(&format!(
            r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: late, namespace: {APP_NAMESPACE}}}
spec:
  replicas: 0
  selector: {{matchLabels: {{app: late}}}}
  template:
    metadata: {{labels: {{app: late}}}}
    spec:
      serviceAccountName: client
      nodeSelector: {{kubernetes.io/hostname: node-a}}
      containers:
        - name: client
          image: {image}
          imagePullPolicy: Never
          command: [ztunnel-loadgen, --quiet]
          args: {args}
"#
        ))
        .unwrap();
    let started = Instant::now();
    cluster
        .kubectl(&[
            "scale",
            "deployment",
            "-n",
            APP_NAMESPACE,
            "late",
            "--replicas=1",
        ])
        .unwrap();
    let mut pod = PodStatus::default();
    let mut report = Value::Null;
    let reported = wait::until(POD_WITHIN, || {
        let Some(found) = cluster
            .pods(APP_NAMESPACE, "app=late")
            .unwrap_or_default()
            .into_iter()
            .next()
        else {
            return false;
        };
        pod = found;
        // The first report: the container restarts once it is done.
        report = cluster
            .pod_output(APP_NAMESPACE, &pod.name, "client")
            .unwrap_or_default()
            .iter()
            .find_map(|line| {
                serde_json::from_str::<Value>(line)
                    .ok()
                    .filter(|value| value.get("mode").is_some())
            })
            .unwrap_or(Value::Null);
        // Its address too, which the server's access log is searched by:
        // on a busy node kubelet posts it to the API after the container
        // has already run (the runs of issue 35 saw both orders).
        !report.is_null() && pod.ip.is_some()
    });
    assert!(
        reported,
        "the scaled-up pod reported nothing, or has no address in the API: {pod:?}"
    );
    assert_eq!(
        (
            report["connections_made"].as_u64(),
            report["errors"].as_u64()
        ),
        (Some(20), Some(0)),
        "{report}"
    );
    // Each connection is logged when it closes: wait for the server's
    // ztunnel to have logged the 20 (a busy node writes them late).
    let mut delivered = 0;
    wait::until(Duration::from_secs(15), || {
        delivered = delivered_as_client(cluster, "node-b", server, &pod);
        delivered >= 20
    });
    assert!(
        delivered >= 20,
        "of the scaled-up pod's first 20 connections, {delivered} reached the server through ztunnel\n{}",
        traces_of(cluster, &pod)
    );
    println!(
        "figure: scale-up to the new pod's 20 connections served through ztunnel: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    cluster
        .kubectl(&[
            "scale",
            "deployment",
            "-n",
            APP_NAMESPACE,
            "late",
            "--replicas=0",
        ])
        .unwrap();
}

/// node-b's agent stopped (SIGSTOP, so it neither answers the CNI plugin
/// nor exits): a pod created there cannot get its sandbox (the plugin
/// fails the ADD) until the agent is back, and then starts meshed: every
/// connection it makes reaches the server through ztunnel.
pub(super) fn a_pod_created_while_its_agent_is_down_is_meshed_once_it_is_back(
    cluster: &RealCluster,
    app: &App,
) {
    let node = cluster.node("node-b").unwrap();
    let agent = get_json(
        cluster,
        &[
            "get",
            "pods",
            "-n",
            MESH_NAMESPACE,
            "-l",
            "k8s-app=istio-cni-node",
            "--field-selector",
            "spec.nodeName=node-b",
        ],
    )
    .unwrap();
    let container = agent["items"][0]["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_owned();
    let pid = cluster
        .crictl(
            node,
            &[
                "inspect",
                "-o",
                "go-template",
                "--template",
                "{{.info.pid}}",
                &container,
            ],
        )
        .unwrap()
        .trim()
        .to_owned();
    node.run(std::path::Path::new("/bin/kill"), &["-STOP", &pid])
        .unwrap();
    let stopped = Instant::now();

    let (server, target) = app.echo_on("node-a");
    let name = "while-agent-down";
    let image = cluster.images().reference(real_cluster::APP);
    let args = serde_json::to_string(&connect_args(target, 20)).unwrap();
    let created = cluster.api().unwrap().apply_server_side(&format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {APP_NAMESPACE}, labels: {{app: client}}}}
spec:
  serviceAccountName: client
  restartPolicy: Never
  nodeSelector: {{kubernetes.io/hostname: node-b}}
  containers:
    - name: client
      image: {image}
      imagePullPolicy: Never
      command: [ztunnel-loadgen, --quiet]
      args: {args}
"#
    ));
    let refused = wait::until(POD_WITHIN, || sandbox_refused(cluster, name));
    let pod_before = cluster
        .pods(APP_NAMESPACE, "app=client")
        .unwrap_or_default();
    node.run(std::path::Path::new("/bin/kill"), &["-CONT", &pid])
        .unwrap();
    println!(
        "agent on node-b stopped for {:.1} s",
        stopped.elapsed().as_secs_f64()
    );
    created.unwrap();
    assert!(
        refused,
        "no failed sandbox while the agent was stopped: {pod_before:?}"
    );
    let pod = wait_client_done(cluster, name);
    let delivered = delivered_as_client(cluster, "node-a", server, &pod);
    assert_eq!(
        delivered, 20,
        "of the 20 connections of a pod created while its agent was down, {delivered} reached the server through ztunnel"
    );
    // Its annotation is gone by now: a pod that has ended leaves the mesh
    // with its sandbox. The connections it made are the proof.
}

/// A server started in a namespace that is not ambient, then the
/// namespace labelled: the node agent finds the running pod through the
/// node's procfs (its cgroup path in cgroupfs form, kubelet's
/// `.../kubepods/besteffort/pod<uid>/<container>`), meshes it without a
/// restart, and a client's connections reach it through ztunnel.
pub(super) fn running_pods_join_when_their_namespace_is_labelled(cluster: &RealCluster) {
    let namespace = "joins-later";
    let image = cluster.images().reference(real_cluster::APP);
    cluster
        .api()
        .unwrap()
        .apply_server_side(&format!(
            r#"apiVersion: v1
kind: Namespace
metadata: {{name: {namespace}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: server, namespace: {namespace}, labels: {{app: server}}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: node-b}}
  containers:
    - name: server
      image: {image}
      imagePullPolicy: Never
      command: [ztunnel-loadgen, --quiet, serve, --listen, "0.0.0.0:{APP_PORT}"]
      readinessProbe: {{tcpSocket: {{port: {APP_PORT}}}, periodSeconds: 1}}
"#
        ))
        .unwrap();
    let mut server = PodStatus::default();
    let running = wait::until(POD_WITHIN, || {
        server = cluster
            .pods(namespace, "app=server")
            .unwrap_or_default()
            .into_iter()
            .next()
            .unwrap_or_default();
        server.ready
    });
    assert!(running, "the plain server did not start: {server:?}");
    assert!(
        !captured(&server),
        "a pod of a plain namespace was captured: {server:?}"
    );

    let started = Instant::now();
    cluster
        .kubectl(&[
            "label",
            "namespace",
            namespace,
            "istio.io/dataplane-mode=ambient",
        ])
        .unwrap();
    let joined = wait::until(POD_WITHIN, || {
        cluster
            .pods(namespace, "app=server")
            .is_ok_and(|pods| pods.iter().any(captured))
    });
    assert!(
        joined,
        "the running pod was not meshed after its namespace was labelled"
    );
    println!(
        "figure: namespace labelled to its running pod meshed (found through procfs): {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let target = server.ip.clone().unwrap();
    let (client, report) = run_client(
        cluster,
        "client-joins-later",
        "node-a",
        &as_str(&connect_args(&target, 20)),
    );
    assert_eq!(
        (
            report["connections_made"].as_u64(),
            report["errors"].as_u64()
        ),
        (Some(20), Some(0)),
        "{report}"
    );
    let delivered = delivered_as_client(cluster, "node-b", "server", &client);
    assert_eq!(
        delivered, 20,
        "of 20 connections to the pod meshed while running, {delivered} reached it through ztunnel"
    );
}

/// Whether kubelet reported the pod `name`'s sandbox refused (its CNI ADD
/// failed): an event `FailedCreatePodSandBox`.
pub(super) fn sandbox_refused(cluster: &RealCluster, name: &str) -> bool {
    cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            APP_NAMESPACE,
            "--field-selector",
            &format!("involvedObject.name={name},reason=FailedCreatePodSandBox"),
            "-o",
            "name",
        ])
        .is_ok_and(|events| !events.trim().is_empty())
}
