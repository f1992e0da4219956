//! Where each pod of a rollout was in its life, as the rollout's polling
//! saw it, and a soak's failures placed against that: a failure in CI then
//! says which ztunnel was starting, ready or draining on each node when it
//! came, and in which step of the connection it came.

use std::time::SystemTime;

use super::*;

/// One pod of the workload being rolled. Times are seconds since the Unix
/// epoch: `created` and `stopping` from the API (whole seconds), `ready`
/// and `gone` when the polling first saw them (within its half second).
#[derive(Debug)]
struct PodLife {
    name: String,
    node: String,
    /// Whether it ran before the upgrade.
    old: bool,
    created: Option<f64>,
    ready: Option<f64>,
    /// When it was asked to stop: its deletionTimestamp less its grace
    /// period.
    stopping: Option<f64>,
    gone: Option<f64>,
}

impl PodLife {
    /// A pod known by name only, so far.
    fn seen(name: &str, old: bool) -> PodLife {
        PodLife {
            name: name.to_owned(),
            node: String::new(),
            old,
            created: None,
            ready: None,
            stopping: None,
            gone: None,
        }
    }
}

/// The pods of one rollout and when it started.
#[derive(Debug)]
pub(super) struct Lifecycle {
    /// When `helm upgrade` was run.
    upgraded: f64,
    pods: Vec<PodLife>,
}

/// Now, in seconds since the Unix epoch.
pub(super) fn now_unix_s() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

impl Lifecycle {
    /// A rollout started now, `old` its pods before the upgrade.
    pub(super) fn start(old: &[String]) -> Lifecycle {
        Lifecycle {
            upgraded: now_unix_s(),
            pods: old.iter().map(|name| PodLife::seen(name, true)).collect(),
        }
    }

    /// Takes in one listing of the workload's pods (`kubectl get pods -o
    /// json`'s items), made at `now`.
    pub(super) fn observe(&mut self, items: &[Value], now: f64) {
        for item in items {
            let Some(name) = item["metadata"]["name"].as_str() else {
                continue;
            };
            let index = match self.pods.iter().position(|pod| pod.name == name) {
                Some(index) => index,
                None => {
                    self.pods.push(PodLife::seen(name, false));
                    self.pods.len() - 1
                }
            };
            let pod = &mut self.pods[index];
            if let Some(node) = item["spec"]["nodeName"].as_str() {
                node.clone_into(&mut pod.node);
            }
            if pod.created.is_none() {
                pod.created = item["metadata"]["creationTimestamp"]
                    .as_str()
                    .map(unix_seconds);
            }
            let ready = item["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|condition| condition["type"] == "Ready" && condition["status"] == "True");
            // An old pod's readiness predates the rollout.
            if ready && pod.ready.is_none() && !pod.old {
                pod.ready = Some(now);
            }
            if let (None, Some(deletion), Some(grace)) = (
                pod.stopping,
                item["metadata"]["deletionTimestamp"].as_str(),
                item["metadata"]["deletionGracePeriodSeconds"].as_f64(),
            ) {
                pod.stopping = Some(unix_seconds(deletion) - grace);
            }
        }
        for pod in &mut self.pods {
            let listed = items
                .iter()
                .any(|item| item["metadata"]["name"].as_str() == Some(pod.name.as_str()));
            if !listed && pod.gone.is_none() {
                pod.gone = Some(now);
            }
        }
    }

    /// When the first old pod was asked to stop.
    pub(super) fn first_stop(&self) -> f64 {
        self.pods
            .iter()
            .filter_map(|pod| pod.stopping)
            .fold(f64::INFINITY, f64::min)
    }

    /// `at` as seconds after the upgrade: `+3.2 s`.
    fn relative(&self, at: f64) -> String {
        format!("{:+.1} s", at - self.upgraded)
    }

    /// Each pod's steps, one line each.
    pub(super) fn steps(&self) -> Vec<String> {
        let mut pods: Vec<&PodLife> = self.pods.iter().collect();
        pods.sort_by(|a, b| (&a.node, !a.old).cmp(&(&b.node, !b.old)));
        pods.into_iter()
            .map(|pod| {
                let step = |what: &str, at: Option<f64>| {
                    at.map(|at| format!(", {what} {}", self.relative(at)))
                        .unwrap_or_default()
                };
                format!(
                    "{} ({}, {}){}{}{}{}",
                    pod.name,
                    if pod.old { "old" } else { "new" },
                    pod.node,
                    step("created", pod.created),
                    step("ready", pod.ready),
                    step("asked to stop", pod.stopping),
                    step("gone", pod.gone),
                )
            })
            .collect()
    }

    /// Where every pod was at `at`, by node: `node-a: ztunnel-x (old)
    /// draining since +2.0 s, ztunnel-y (new) ready since +1.1 s`.
    pub(super) fn at(&self, at: f64) -> String {
        let mut nodes: Vec<&str> = self.pods.iter().map(|pod| pod.node.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
            .iter()
            .map(|node| {
                let states: Vec<String> = self
                    .pods
                    .iter()
                    .filter(|pod| pod.node == *node)
                    .filter_map(|pod| {
                        let (state, since) = pod_state(pod, at)?;
                        let age = if pod.old { "old" } else { "new" };
                        let since = since
                            .map(|since| format!(" since {}", self.relative(since)))
                            .unwrap_or_default();
                        Some(format!("{} ({age}) {state}{since}", pod.name))
                    })
                    .collect();
                format!("{node}: {}", states.join(", "))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// What `pod` was doing at `at`, and since when; `None` before it was
/// created or once it was gone.
fn pod_state(pod: &PodLife, at: f64) -> Option<(&'static str, Option<f64>)> {
    if pod.created.is_some_and(|created| at < created) || pod.gone.is_some_and(|gone| at >= gone) {
        return None;
    }
    Some(match (pod.ready, pod.stopping) {
        (_, Some(stopping)) if at >= stopping => ("draining", Some(stopping)),
        (Some(ready), _) if at >= ready => ("ready", Some(ready)),
        // An old pod was ready before the polling began.
        _ if pod.old => ("ready", None),
        _ => ("starting", pod.created),
    })
}

/// The failures a soak listed after `since` (seconds into its run), each as
/// a line with its time after the upgrade and every node's pods then, and
/// whether it is a long-lived connection's break at or after `deadline`
/// (the old ztunnel's forced close, which a rollout may make).
pub(super) fn failures_since(
    lifecycle: &Lifecycle,
    soak: &Value,
    since: f64,
    deadline: f64,
) -> Vec<(bool, String)> {
    let started = soak["started_unix_s"].as_f64().unwrap_or(0.0);
    soak["failures"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|failure| failure["at_s"].as_f64().is_some_and(|at| at > since))
        .map(|failure| {
            let at = started + failure["at_s"].as_f64().unwrap_or(0.0);
            let resolve = match failure["resolve_s"].as_f64() {
                Some(took) => format!(", name resolved in {took:.3} s"),
                None if failure["step"] == "resolve" => ", name lookup unanswered".to_owned(),
                None => String::new(),
            };
            let allowed = failure["attempt"] == "break" && at >= deadline;
            let line = format!(
                "{} {} in {}: {} ({}{resolve}); {}",
                lifecycle.relative(at),
                failure["attempt"].as_str().unwrap_or("?"),
                failure["step"].as_str().unwrap_or("?"),
                failure["kind"].as_str().unwrap_or("?"),
                failure["error"].as_str().unwrap_or(""),
                lifecycle.at(at),
            );
            (allowed, line)
        })
        .collect()
}
