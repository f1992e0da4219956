//! The waypoint phase: a waypoint that is a pod on a node
//! (`ztunnel-test-waypoint` from the application image, its certificate
//! issued by the test from the root the mesh was installed with), a
//! Gateway of class `istio-waypoint` with its Service, and the application
//! namespace labelled `istio.io/use-waypoint`: the client's connections to
//! the echo Service go through the waypoint pod, which forwards them with
//! its own identity and applies its own deny rule; the label removed, they
//! go direct again. As `proxy/tests/waypoint.rs` on the netns cluster, here
//! on real kubelets, with the chart's Gateway API CRDs.

use ztunnel_test_support::ca::TestRoot;

use super::*;

/// The waypoint's namespace: not ambient, as Istio's waypoint pods are
/// never captured.
const WAYPOINT_NAMESPACE: &str = "waypoints";
/// The name of the Gateway, its Service, its service account and its pod.
const WAYPOINT: &str = "waypoint";
/// The waypoint pod's container.
const CONTAINER: &str = "waypoint";
/// The Secret holding the waypoint's certificate.
const CERT_SECRET: &str = "waypoint-cert";
/// Where the pod mounts it.
const CERT_DIR: &str = "/etc/waypoint";
/// The port the waypoint listens on (its Gateway listener and Service).
const WAYPOINT_PORT: u16 = 15008;
/// Where the client pods run, the waypoint pod, and the echo pod the
/// waypoint forwards to: every hop crosses nodes.
const CLIENT_NODE: &str = "node-a";
const WAYPOINT_NODE: &str = "node-b";
const SERVER_NODE: &str = "node-a";
/// The bound on an access log line appearing once its connection closed.
const LOG_WITHIN: Duration = Duration::from_secs(10);
/// Connections per client pod.
const CONNECTIONS: u32 = 5;

/// What a client pod's run looked like from the waypoint and the servers.
#[derive(Debug)]
struct Seen {
    /// Connections it made and errors it had.
    report: (u64, u64),
    /// The waypoint's records of connections from the pod, as (identity,
    /// authority, outcome).
    at_waypoint: Vec<(String, String, String)>,
    /// Connections from the pod that the servers' ztunnels delivered under
    /// the client's own identity.
    direct: usize,
}

pub(super) fn a_namespace_labelled_to_use_a_waypoint_pod_reaches_its_service_through_it(
    cluster: &RealCluster,
    app: &App,
    root: &TestRoot,
) {
    if let Err(reason) = helm::chart_gateway_api_crds() {
        skip(format_args!("the waypoint phase: {reason}"));
        return;
    }
    let identity = format!("spiffe://{TRUST_DOMAIN}/ns/{WAYPOINT_NAMESPACE}/sa/{WAYPOINT}");
    let (server, server_ip) = app.echo_on(SERVER_NODE);
    let vip = format!("{}:{APP_PORT}", app.cluster_ip);
    let route = format!(
        "{vip}={server_ip}:{WAYPOINT_PORT},{server_ip}:{APP_PORT},spiffe://{TRUST_DOMAIN}/ns/{APP_NAMESPACE}/sa/echo"
    );
    deploy(cluster, root, &identity);
    let started = Instant::now();
    let waypoint_ip = start_waypoint(cluster, &route, None);
    let addressed = wait::until(POD_WITHIN, || {
        get_json(
            cluster,
            &["get", "gateway", "-n", WAYPOINT_NAMESPACE, WAYPOINT],
        )
        .is_ok_and(|gateway| gateway["status"]["addresses"][0].is_object())
    });
    assert!(
        addressed,
        "the control plane wrote no status address on the Gateway"
    );
    println!(
        "figure: waypoint pod created to Ready and its Gateway addressed: {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // Labelled: every connection to the Service goes through the waypoint.
    use_waypoint(cluster, true);
    let started = Instant::now();
    let mut clients = Clients {
        cluster,
        host: &app.cluster_ip,
        attempt: 0,
    };
    let (through, seen) = clients.until("via-waypoint", |run| {
        run.report == (u64::from(CONNECTIONS), 0)
            && run.at_waypoint.len() == CONNECTIONS as usize
            && run.direct == 0
    });
    assert!(
        through,
        "the client's connections to {vip} did not all go through the waypoint: {seen:?}\n{}",
        waypoint_log(cluster).join("\n")
    );
    println!(
        "figure: namespace labelled to the Service's traffic through the waypoint pod: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for (client, authority, outcome) in &seen.at_waypoint {
        assert_eq!(client, &client_identity(), "the waypoint saw the client");
        assert_eq!(authority, &vip, "the waypoint was asked for the VIP:port");
        assert_eq!(outcome, "Forwarded");
    }
    let mut from_waypoint = 0;
    let delivered = wait::until(LOG_WITHIN, || {
        from_waypoint = delivered_from_waypoint(cluster, server, &waypoint_ip, &identity);
        from_waypoint >= CONNECTIONS as usize
    });
    assert!(
        delivered,
        "{server}'s ztunnel delivered {from_waypoint} connections from the waypoint as {identity}"
    );
    println!(
        "waypoint: {CONNECTIONS} connections from {} to {vip} through the waypoint pod, delivered to {server} as {identity}",
        client_identity()
    );

    // The waypoint's own rule, given to a new waypoint pod.
    let started = Instant::now();
    cluster
        .kubectl(&[
            "delete",
            "pod",
            "-n",
            WAYPOINT_NAMESPACE,
            WAYPOINT,
            "--wait=true",
        ])
        .unwrap();
    start_waypoint(cluster, &route, Some(&client_identity()));
    let (denied, seen) = clients.until("denied-by-waypoint", |run| {
        run.report == (0, u64::from(CONNECTIONS))
            && run.at_waypoint.len() == CONNECTIONS as usize
            && run
                .at_waypoint
                .iter()
                .all(|(_, _, outcome)| outcome == "Denied")
    });
    assert!(
        denied,
        "the waypoint's deny rule did not refuse the client: {seen:?}\n{}",
        waypoint_log(cluster).join("\n")
    );
    println!(
        "figure: waypoint pod recreated with a deny rule to the client refused there: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let other = clients.run("other-via-waypoint", "echo");
    assert!(
        other.report == (u64::from(CONNECTIONS), 0)
            && other.at_waypoint.len() == CONNECTIONS as usize
            && other
                .at_waypoint
                .iter()
                .all(|(client, _, outcome)| client.ends_with("/sa/echo") && outcome == "Forwarded"),
        "the waypoint forwards another identity's connections: {other:?}"
    );

    // The label removed, traffic goes direct: the client, still denied by
    // the waypoint, is served, and the servers see its own identity.
    use_waypoint(cluster, false);
    let started = Instant::now();
    let (direct, seen) = clients.until("direct-again", |run| {
        run.report == (u64::from(CONNECTIONS), 0)
            && run.at_waypoint.is_empty()
            && run.direct == CONNECTIONS as usize
    });
    assert!(
        direct,
        "the client's connections did not go direct once the label was removed: {seen:?}"
    );
    println!(
        "figure: label removed to the Service's traffic direct again: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    cluster
        .kubectl(&["delete", "namespace", WAYPOINT_NAMESPACE, "--wait=false"])
        .unwrap();
}

/// The waypoint's namespace, service account, certificate Secret, Gateway
/// and Service.
fn deploy(cluster: &RealCluster, root: &TestRoot, identity: &str) {
    let issued = root.issue_pem(&identity.parse().unwrap()).unwrap();
    let api = cluster.api().unwrap();
    api.apply_server_side(&format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {WAYPOINT_NAMESPACE}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: {WAYPOINT}, namespace: {WAYPOINT_NAMESPACE}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {WAYPOINT}, namespace: {WAYPOINT_NAMESPACE}}}
spec:
  gatewayClassName: istio-waypoint
  listeners:
    - name: mesh
      port: {WAYPOINT_PORT}
      protocol: HBONE
      allowedRoutes: {{namespaces: {{from: All}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: {WAYPOINT}, namespace: {WAYPOINT_NAMESPACE}}}
spec:
  selector: {{app: {WAYPOINT}}}
  ports: [{{name: mesh, port: {WAYPOINT_PORT}, targetPort: {WAYPOINT_PORT}}}]
"#
    ))
    .unwrap();
    let secret = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": CERT_SECRET, "namespace": WAYPOINT_NAMESPACE},
        "stringData": {
            "cert-chain.pem": issued.cert_chain_pem,
            "key.pem": issued.key_pem,
            "root-cert.pem": issued.root_cert_pem,
        },
    });
    api.apply_server_side(&secret.to_string()).unwrap();
}

/// Creates the waypoint pod on [`WAYPOINT_NODE`] with `route` and, if
/// given, the identity it denies; waits until it is Ready and listening.
/// Its IP.
fn start_waypoint(cluster: &RealCluster, route: &str, deny: Option<&str>) -> String {
    let image = cluster.images().reference(real_cluster::APP);
    let mut args = vec![
        "--listen".to_owned(),
        format!("$(POD_IP):{WAYPOINT_PORT}"),
        "--cert-chain".to_owned(),
        format!("{CERT_DIR}/cert-chain.pem"),
        "--key".to_owned(),
        format!("{CERT_DIR}/key.pem"),
        "--roots".to_owned(),
        format!("{CERT_DIR}/root-cert.pem"),
        "--route".to_owned(),
        route.to_owned(),
    ];
    if let Some(identity) = deny {
        args.extend(["--deny".to_owned(), identity.to_owned()]);
    }
    // A JSON array is a YAML flow sequence, with every argument quoted.
    let args = serde_json::to_string(&args).unwrap();
    cluster
        .api()
        .unwrap()
        .apply_server_side(&format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: {WAYPOINT}, namespace: {WAYPOINT_NAMESPACE}, labels: {{app: {WAYPOINT}}}}}
spec:
  serviceAccountName: {WAYPOINT}
  nodeSelector: {{kubernetes.io/hostname: {WAYPOINT_NODE}}}
  terminationGracePeriodSeconds: 2
  containers:
    - name: {CONTAINER}
      image: {image}
      imagePullPolicy: Never
      command: [ztunnel-test-waypoint]
      args: {args}
      env: [{{name: POD_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}]
      ports: [{{containerPort: {WAYPOINT_PORT}}}]
      readinessProbe: {{tcpSocket: {{port: {WAYPOINT_PORT}}}, periodSeconds: 1}}
      volumeMounts: [{{name: cert, mountPath: {CERT_DIR}, readOnly: true}}]
  volumes: [{{name: cert, secret: {{secretName: {CERT_SECRET}}}}}]
"#
        ))
        .unwrap();
    let mut pod = PodStatus::default();
    let ready = wait::until(POD_WITHIN, || {
        pod = cluster
            .pods(WAYPOINT_NAMESPACE, &format!("app={WAYPOINT}"))
            .unwrap_or_default()
            .into_iter()
            .next()
            .unwrap_or_default();
        pod.ready
            && waypoint_log(cluster)
                .iter()
                .any(|line| line.contains("\"listening\""))
    });
    assert!(
        ready,
        "the waypoint pod was not Ready in {POD_WITHIN:?}: {pod:?}\n{}\n{}",
        waypoint_log(cluster).join("\n"),
        pods_summary(cluster)
    );
    assert!(!captured(&pod), "the waypoint pod was captured: {pod:?}");
    pod.ip.unwrap()
}

/// The client pods of the phase, on [`CLIENT_NODE`], each opening
/// [`CONNECTIONS`] connections to `host`'s [`APP_PORT`].
struct Clients<'a> {
    cluster: &'a RealCluster,
    host: &'a str,
    /// Numbers the pods: each has a name of its own.
    attempt: u32,
}

impl Clients<'_> {
    /// Runs client pods named after `prefix` under the service account
    /// `client` until one's run is `done`, within [`POD_WITHIN`]: whether
    /// one was, and the last run. Every run is printed; once one is
    /// `done`, one more must be too, so that a state that flaps back fails
    /// rather than passing on one run.
    fn until(&mut self, prefix: &str, done: impl Fn(&Seen) -> bool) -> (bool, Seen) {
        let mut last = None;
        let reached = wait::until(POD_WITHIN, || {
            let run = self.run(prefix, "client");
            let reached = done(&run);
            eprintln!(
                "clients {prefix}, run {}: done {reached}: {run:?}",
                self.attempt
            );
            last = Some(run);
            reached
        });
        if !reached {
            return (false, last.unwrap());
        }
        let confirming = self.run(prefix, "client");
        let confirmed = done(&confirming);
        eprintln!(
            "clients {prefix}, run {} confirming: done {confirmed}: {confirming:?}",
            self.attempt
        );
        (confirmed, confirming)
    }

    /// Runs one client pod named after `prefix` under `service_account`,
    /// and gathers what the waypoint and the servers saw of it.
    fn run(&mut self, prefix: &str, service_account: &str) -> Seen {
        self.attempt += 1;
        let cluster = self.cluster;
        let (pod, report) = run_client_as(
            cluster,
            &format!("{prefix}-{}", self.attempt),
            CLIENT_NODE,
            service_account,
            &as_str(&connect_args(self.host, CONNECTIONS)),
        );
        let source = format!("{}:", pod.ip.as_deref().unwrap_or("none"));
        let at_waypoint = waypoint_log(cluster)
            .iter()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|record| {
                record["peer"]
                    .as_str()
                    .is_some_and(|peer| peer.starts_with(&source))
            })
            .map(|record| {
                let text = |key: &str| record[key].as_str().unwrap_or_default().to_owned();
                (text("identity"), text("authority"), text("outcome"))
            })
            .collect();
        let direct = ["node-a", "node-b"]
            .iter()
            .map(|node| delivered_as_client(cluster, node, &echo_pod_on(cluster, node), &pod))
            .sum();
        Seen {
            report: (
                report["connections_made"].as_u64().unwrap_or(0),
                report["errors"].as_u64().unwrap_or(0),
            ),
            at_waypoint,
            direct,
        }
    }
}

/// The waypoint pod's output: a line once listening, one per CONNECT.
fn waypoint_log(cluster: &RealCluster) -> Vec<String> {
    cluster
        .pod_output(WAYPOINT_NAMESPACE, WAYPOINT, CONTAINER)
        .unwrap_or_default()
}

/// How many connections the ztunnel of [`SERVER_NODE`] delivered to
/// `server` from the waypoint pod, under the waypoint's identity.
fn delivered_from_waypoint(
    cluster: &RealCluster,
    server: &str,
    waypoint_ip: &str,
    identity: &str,
) -> usize {
    let source = format!("{waypoint_ip}:");
    access_log(cluster, SERVER_NODE)
        .iter()
        .filter(|entry| {
            entry.direction == "inbound"
                && entry.src_identity.as_deref() == Some(identity)
                && entry.src_addr.starts_with(&source)
                && entry.dst_workload.as_deref() == Some(server)
                && entry.error.is_none()
        })
        .count()
}

/// Labels the application namespace to use the waypoint, or takes the
/// labels away.
fn use_waypoint(cluster: &RealCluster, on: bool) {
    let labels = if on {
        [
            format!("istio.io/use-waypoint={WAYPOINT}"),
            format!("istio.io/use-waypoint-namespace={WAYPOINT_NAMESPACE}"),
        ]
    } else {
        [
            "istio.io/use-waypoint-".to_owned(),
            "istio.io/use-waypoint-namespace-".to_owned(),
        ]
    };
    cluster
        .kubectl(&[
            "label",
            "namespace",
            APP_NAMESPACE,
            "--overwrite",
            &labels[0],
            &labels[1],
        ])
        .unwrap();
}
