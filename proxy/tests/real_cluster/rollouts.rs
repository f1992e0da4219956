//! The rollouts: load generators that soak through them, what each
//! rollout dropped, and the control plane's certificates afterwards.

use ztunnel_test_support::real_cluster::istio::IstioChart;

use super::lifecycle::{Lifecycle, failures_since, now_unix_s};
use super::*;

/// Load generators that run through every rollout (`ztunnel-loadgen
/// soak`): four long-lived connections each exchanging a message every
/// 200 ms, and 20 new connections a second; across nodes, on one node, and
/// to the Service by its name (resolved by the cluster DNS for every
/// connection).
pub(super) struct Soaks {
    /// (pod name, its node, what it covers).
    pods: Vec<(&'static str, &'static str, &'static str)>,
}

/// The bound on one soak run; the test ends them well before.
pub(super) const SOAK_DURATION_S: u32 = 1200;

impl Soaks {
    pub(super) fn start(cluster: &RealCluster, app: &App) -> Soaks {
        let (_, echo_a) = app.echo_on("node-a");
        let (_, echo_b) = app.echo_on("node-b");
        let service = format!("echo.{APP_NAMESPACE}.svc.cluster.local");
        let pods = vec![
            (
                "soak-cross-node",
                "node-a",
                echo_b.to_owned(),
                "across nodes",
            ),
            ("soak-same-node", "node-a", echo_a.to_owned(), "on one node"),
            (
                "soak-service-name",
                "node-b",
                service,
                "to the Service by name",
            ),
        ];
        for (name, node, target, _) in &pods {
            create_soak(cluster, name, node, target, 4, 20);
        }
        let soaks = Soaks {
            pods: pods
                .iter()
                .map(|(name, node, _, what)| (*name, *node, *what))
                .collect(),
        };
        let running = wait::until(POD_WITHIN, || {
            soaks.pods.iter().all(|(name, _, _)| {
                soak_counts(cluster, name).is_some_and(|counts| {
                    counts["long_lived"]["open"] == 4 && counts["new"]["ok"].as_u64() > Some(20)
                })
            })
        });
        let counts: Vec<_> = soaks
            .pods
            .iter()
            .map(|(name, _, _)| soak_counts(cluster, name))
            .collect();
        assert!(running, "the soak clients did not get going: {counts:?}");
        soaks
    }

    /// Deletes the soak pods (without waiting for them to go).
    pub(super) fn stop(self, cluster: &RealCluster) {
        for (name, _, _) in self.pods {
            cluster
                .kubectl(&["delete", "pod", "-n", APP_NAMESPACE, name, "--wait=false"])
                .unwrap();
        }
    }

    /// Each soak's latest counts.
    pub(super) fn counts(&self, cluster: &RealCluster) -> Vec<Value> {
        self.pods
            .iter()
            .map(|(name, _, _)| soak_counts(cluster, name).unwrap_or(Value::Null))
            .collect()
    }
}

/// Creates a soak pod `name` on `node` under the `client` service account:
/// `connections` long-lived connections to `target`'s echo port, kept
/// open and reopened when closed, and `rate` new short ones a second, for
/// [`SOAK_DURATION_S`].
pub(super) fn create_soak(
    cluster: &RealCluster,
    name: &str,
    node: &str,
    target: &str,
    connections: u32,
    rate: u32,
) {
    let image = cluster.images().reference(real_cluster::APP);
    let target = format!("{target}:{APP_PORT}");
    let connections = connections.to_string();
    let rate = rate.to_string();
    let duration = SOAK_DURATION_S.to_string();
    let pod = LoadgenPod {
        name,
        namespace: APP_NAMESPACE,
        service_account: "client",
        node,
        label: ("app", "soak"),
        container: "soak",
        args: &[
            "soak",
            "--target",
            &target,
            "--connections",
            &connections,
            "--rate",
            &rate,
            "--duration",
            &duration,
        ],
    };
    cluster
        .api()
        .unwrap()
        .apply_server_side(&pod.yaml(&image))
        .unwrap();
}

/// What a soak did between two of its counts.
pub(super) struct SoakChange {
    /// New connections served.
    pub(super) new_ok: u64,
    /// New connections refused or failed.
    pub(super) new_failed: u64,
    /// Long-lived connections broken.
    pub(super) breaks: usize,
}

impl SoakChange {
    /// From the counts `before` to the counts `after`.
    pub(super) fn between(before: &Value, after: &Value) -> SoakChange {
        let breaks = |counts: &Value| {
            counts["long_lived"]["breaks"]
                .as_array()
                .map_or(0, Vec::len)
        };
        SoakChange {
            new_ok: after["new"]["ok"].as_u64().unwrap_or(0)
                - before["new"]["ok"].as_u64().unwrap_or(0),
            new_failed: failures(&after["new"]["failed"]) - failures(&before["new"]["failed"]),
            breaks: breaks(after) - breaks(before),
        }
    }
}

/// The last line of counts a soak pod printed.
pub(super) fn soak_counts(cluster: &RealCluster, pod: &str) -> Option<Value> {
    cluster
        .pod_output(APP_NAMESPACE, pod, "soak")
        .ok()?
        .iter()
        .rev()
        .find_map(|line| {
            serde_json::from_str::<Value>(line)
                .ok()
                .filter(|value| value.get("long_lived").is_some())
        })
}

/// Failures of every kind in a soak's failure counts.
pub(super) fn failures(counts: &Value) -> u64 {
    counts
        .as_object()
        .map(|kinds| kinds.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0)
}

/// `helm upgrade` of ztunnel, of the node agent, and of the control plane,
/// each to the same image under a second tag, while the soaks run: no new
/// connection fails, and no long-lived one breaks before the drain
/// deadline of the ztunnel that carried it.
pub(super) fn rollouts_drop_nothing(cluster: &RealCluster, helm: &Helm, soaks: &Soaks) {
    let second = second_tag();
    let ztunnel = Rollout {
        what: "ztunnel",
        upgrade: Upgrade::Mesh(vec![format!(
            "ztunnel.image=docker.io/library/ztunnel:{second}"
        )]),
        kind: "daemonset",
        name: "ztunnel",
        selector: "app=ztunnel",
        drain_s: ZTUNNEL_DRAIN_S,
    };
    let dropped = ztunnel.run(cluster, helm, soaks, &|| {});
    assert_eq!(
        dropped,
        Dropped::default(),
        "the ztunnel rollout dropped connections"
    );

    let mut created = vec![];
    let agent = Rollout {
        what: "node agent",
        upgrade: Upgrade::Mesh(vec![format!(
            "nodeAgent.image=docker.io/library/ztunnel-agent:{second}"
        )]),
        kind: "daemonset",
        name: "istio-cni-node",
        selector: "k8s-app=istio-cni-node",
        drain_s: ZTUNNEL_DRAIN_S,
    };
    let created_cell = std::cell::RefCell::new(&mut created);
    let dropped = agent.run(cluster, helm, soaks, &|| {
        // Pods created while the agents roll: each must be meshed from its
        // first connection.
        let mut created = created_cell.borrow_mut();
        if created.len() < 6 {
            let node = if created.len() % 2 == 0 {
                "node-a"
            } else {
                "node-b"
            };
            let name = format!("during-agent-rollout-{}", created.len());
            create_client(
                cluster,
                &name,
                node,
                &connect_args(&target_on_other(cluster, node), 20),
            );
            created.push((name, node));
        }
    });
    assert_eq!(
        dropped,
        Dropped::default(),
        "the node agent's rollout dropped connections"
    );
    for (name, node) in created {
        let pod = wait_client_done(cluster, &name);
        let other = if node == "node-a" { "node-b" } else { "node-a" };
        let server = echo_pod_on(cluster, other);
        let delivered = delivered_as_client(cluster, other, &server, &pod);
        assert_eq!(
            delivered, 20,
            "{name}, created during the agents' rollout on {node}: {delivered} of 20 connections reached the server through ztunnel"
        );
    }
    println!("pods created during the agents' rollout: 6, every connection through ztunnel");

    let control_plane = Rollout {
        what: "control plane",
        upgrade: Upgrade::Mesh(vec![format!(
            "controlPlane.image=docker.io/library/ztunnel-ca:{second}"
        )]),
        kind: "deployment",
        name: "ztunnel-ca",
        selector: "app=ztunnel-ca",
        drain_s: ZTUNNEL_DRAIN_S,
    };
    let dropped = control_plane.run(cluster, helm, soaks, &|| {});
    assert_eq!(
        dropped,
        Dropped::default(),
        "the control plane's rollout dropped connections"
    );
    certificates_are_renewed_by_the_new_control_plane(cluster);
}

/// What a rollout dropped, summed over the soaks.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Dropped {
    /// New connections (short ones, and long-lived ones being reopened)
    /// refused or failed.
    new: u64,
    /// Long-lived connections broken before the drain deadline of the
    /// ztunnel that carried them.
    long_lived: u64,
}

/// One `helm upgrade` and what it replaces.
pub(super) struct Rollout {
    pub(super) what: &'static str,
    /// The release upgraded, and the `--set` that changes the image.
    pub(super) upgrade: Upgrade,
    pub(super) kind: &'static str,
    pub(super) name: &'static str,
    pub(super) selector: &'static str,
    /// The drain deadline of the ztunnels it replaces, in seconds: their
    /// grace period less one.
    pub(super) drain_s: u64,
}

/// The release a rollout upgrades (`--reuse-values`), with its `--set`s.
pub(super) enum Upgrade {
    /// Our chart's release.
    Mesh(Vec<String>),
    /// One of Istio's charts' releases.
    Istio(IstioChart, Vec<String>),
}

impl Rollout {
    /// Upgrades, calls `during` every half second until the rollout is
    /// done and every old pod gone, and returns the number of connections
    /// it dropped (printing the figures).
    pub(super) fn run(
        &self,
        cluster: &RealCluster,
        helm: &Helm,
        soaks: &Soaks,
        during: &dyn Fn(),
    ) -> Dropped {
        let before = soaks.counts(cluster);
        let old: Vec<String> = cluster
            .pods(MESH_NAMESPACE, self.selector)
            .unwrap()
            .into_iter()
            .map(|pod| pod.name)
            .collect();
        let started = Instant::now();
        let mut lifecycle = Lifecycle::start(&old);
        match &self.upgrade {
            Upgrade::Mesh(sets) => cluster.helm_upgrade(helm, sets),
            Upgrade::Istio(chart, sets) => cluster.istio_upgrade(helm, *chart, sets),
        }
        .unwrap();
        let done = wait::until(ROLLOUT_WITHIN, || {
            during();
            let pods = get_json(
                cluster,
                &["get", "pods", "-n", MESH_NAMESPACE, "-l", self.selector],
            )
            .unwrap_or(Value::Null);
            let Some(items) = pods["items"].as_array() else {
                return false;
            };
            lifecycle.observe(items, now_unix_s());
            let old_left = items.iter().any(|pod| {
                old.iter()
                    .any(|name| pod["metadata"]["name"].as_str() == Some(name.as_str()))
            });
            !old_left && self.complete(cluster)
        });
        assert!(
            done,
            "the {} rollout did not finish in {ROLLOUT_WITHIN:?}:\n{}",
            self.what,
            pods_summary(cluster)
        );
        let rollout_s = started.elapsed().as_secs_f64();
        // Counts printed after the last old pod is gone.
        std::thread::sleep(Duration::from_secs(2));
        let after = soaks.counts(cluster);
        let first_stop = lifecycle.first_stop();
        for step in lifecycle.steps() {
            println!("rollout: {}: {step}", self.what);
        }
        let mut dropped = Dropped::default();
        for (((pod, node, what), before), after) in soaks.pods.iter().zip(&before).zip(&after) {
            let new_failed = failures(&after["new"]["failed"]) - failures(&before["new"]["failed"]);
            let open_failed = failures(&after["long_lived"]["open_failed"])
                - failures(&before["long_lived"]["open_failed"]);
            let started_at = after["started_unix_s"].as_f64().unwrap_or(0.0);
            let since = before["elapsed_s"].as_f64().unwrap_or(0.0);
            let breaks: Vec<f64> = after["long_lived"]["breaks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| b["at_s"].as_f64())
                .filter(|at| *at > since)
                .map(|at| started_at + at)
                .collect();
            // Allowed: the old ztunnel's forced close at its deadline, and
            // anything after; half a second of slack for the timestamps'
            // rounding.
            let deadline = first_stop + self.drain_s as f64 - 0.5;
            let early = breaks.iter().filter(|at| **at < deadline).count() as u64;
            let new_ok = after["new"]["ok"].as_u64().unwrap_or(0)
                - before["new"]["ok"].as_u64().unwrap_or(0);
            println!(
                "figure: {} rollout, {what} ({pod}): {new_ok} new connections served, {new_failed} refused or failed; {} long-lived broken before the drain deadline, {} at or after it; {open_failed} reopenings failed",
                self.what,
                early,
                breaks.len() as u64 - early,
            );
            for (allowed, failure) in failures_since(&lifecycle, after, since, deadline) {
                // A break at the drain deadline is the forced close, not a drop.
                let what = if allowed {
                    "at the deadline"
                } else {
                    "failure"
                };
                println!("{what}: {} rollout, {pod} on {node}: {failure}", self.what);
            }
            let late = after["resolves"]["late"]
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(before["resolves"]["late"].as_u64().unwrap_or(0));
            if late > 0 {
                println!(
                    "late: {} rollout, {pod} on {node}: {late} name lookups took 1 s or more (a DNS query answered only when asked again)",
                    self.what
                );
            }
            dropped.new += new_failed + open_failed;
            dropped.long_lived += early;
        }
        println!(
            "figure: {} rollout done (every old pod gone) in {rollout_s:.1} s",
            self.what
        );
        dropped
    }

    /// Whether the workload reports every replica updated and available.
    pub(super) fn complete(&self, cluster: &RealCluster) -> bool {
        workload_rolled(cluster, self.kind, self.name)
    }
}

/// Whether the DaemonSet or Deployment `name` of [`MESH_NAMESPACE`]
/// reports its latest spec rolled out: every replica updated and
/// available.
pub(super) fn workload_rolled(cluster: &RealCluster, kind: &str, name: &str) -> bool {
    let Ok(object) = get_json(cluster, &["get", kind, "-n", MESH_NAMESPACE, name]) else {
        return false;
    };
    let status = &object["status"];
    let generation = object["metadata"]["generation"].as_u64();
    let observed = status["observedGeneration"].as_u64();
    if generation != observed {
        return false;
    }
    match kind {
        "daemonset" => {
            let desired = status["desiredNumberScheduled"].as_u64();
            desired == status["updatedNumberScheduled"].as_u64()
                && desired == status["numberAvailable"].as_u64()
        }
        _ => {
            let replicas = status["replicas"].as_u64();
            replicas == status["updatedReplicas"].as_u64()
                && replicas == status["availableReplicas"].as_u64()
        }
    }
}

/// Seconds since the epoch of an RFC 3339 time as the API writes it
/// (`2026-12-06T02:00:00Z`).
pub(super) fn unix_seconds(rfc3339: &str) -> f64 {
    let output = std::process::Command::new("date")
        .args(["-d", rfc3339, "+%s"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap()
}

/// The echo pod's IP on the node other than `node`.
pub(super) fn target_on_other(cluster: &RealCluster, node: &str) -> String {
    let other = if node == "node-a" { "node-b" } else { "node-a" };
    cluster
        .pods(APP_NAMESPACE, "app=echo")
        .unwrap()
        .into_iter()
        .find(|pod| pod.node.as_deref() == Some(other))
        .and_then(|pod| pod.ip)
        .unwrap()
}

/// The echo pod's name on `node`.
pub(super) fn echo_pod_on(cluster: &RealCluster, node: &str) -> String {
    cluster
        .pods(APP_NAMESPACE, "app=echo")
        .unwrap()
        .into_iter()
        .find(|pod| pod.node.as_deref() == Some(node))
        .unwrap()
        .name
}

/// After the control plane's rollout, the new control plane pod has
/// issued certificates (ztunnels renew every half `SECRET_TTL`) and serves
/// xDS to both ztunnels.
pub(super) fn certificates_are_renewed_by_the_new_control_plane(cluster: &RealCluster) {
    let pod = cluster
        .pods(MESH_NAMESPACE, "app=ztunnel-ca")
        .unwrap()
        .remove(0);
    let address: std::net::SocketAddr = format!("{}:15014", pod.ip.clone().unwrap())
        .parse()
        .unwrap();
    let node = cluster.node(pod.node.as_deref().unwrap()).unwrap();
    let started = Instant::now();
    let mut metrics = String::new();
    let renewed = wait::until(Duration::from_secs(90), || {
        metrics = node
            .netns()
            .http_get_from(address, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default();
        metric_sum(&metrics, "ca_certificates_issued") >= 2.0
    });
    assert!(
        renewed,
        "the new control plane issued no certificates in 90 s:\n{metrics}"
    );
    println!(
        "figure: control plane rolled to certificates renewed by the new one: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The sum of every sample of a metric family in Prometheus text.
pub(super) fn metric_sum(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(family))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The second tag every project image is loaded under: the same image, for
/// upgrades that change nothing but the tag.
pub(super) fn second_tag() -> String {
    format!("{}-b", env!("CARGO_PKG_VERSION"))
}
