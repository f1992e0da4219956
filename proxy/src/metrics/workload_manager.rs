//! The shared mode's pod proxy counts under istio/ztunnel's names
//! (AMBIENT.md §6.8): `workload_manager_active_proxy_count`,
//! `workload_manager_pending_proxy_count`, and the proxies started and
//! stopped. Registered in shared mode only; `inpod/workloads.rs` counts.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The pod proxy counts; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct WorkloadManagerMetrics {
    active: Gauge,
    pending: Gauge,
    started: Counter,
    stopped: Counter,
}

impl WorkloadManagerMetrics {
    /// Registers the four metrics on `registry`.
    pub fn register(registry: &mut Registry) -> WorkloadManagerMetrics {
        let metrics = WorkloadManagerMetrics::default();
        registry.register(
            "workload_manager_active_proxy_count",
            "Pod proxies serving",
            metrics.active.clone(),
        );
        // A pod whose proxy failed to start (NACKed) is retried every 5 s
        // by the ZDS session until it starts or the agent deletes it.
        registry.register(
            "workload_manager_pending_proxy_count",
            "Pod proxies that failed to start and wait for a retry",
            metrics.pending.clone(),
        );
        registry.register(
            "workload_manager_proxies_started",
            "Pod proxies started",
            metrics.started.clone(),
        );
        registry.register(
            "workload_manager_proxies_stopped",
            "Pod proxies stopped",
            metrics.stopped.clone(),
        );
        metrics
    }

    /// A pod proxy started; `active` are serving now.
    pub fn started(&self, active: usize) {
        self.started.inc();
        self.set_active(active);
    }

    /// A pod proxy stopped; `active` are serving now.
    pub fn stopped(&self, active: usize) {
        self.stopped.inc();
        self.set_active(active);
    }

    /// `count` pods wait for a retry of their proxy's start.
    pub fn pending(&self, count: usize) {
        self.pending.set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    fn set_active(&self, active: usize) {
        self.active.set(i64::try_from(active).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counts_have_istios_names() {
        let mut registry = Registry::default();
        let metrics = WorkloadManagerMetrics::register(&mut registry);
        metrics.started(1);
        metrics.started(2);
        metrics.stopped(1);
        let text = crate::metrics::encode(&registry).unwrap();
        for line in [
            "workload_manager_active_proxy_count 1",
            "workload_manager_pending_proxy_count 0",
            "workload_manager_proxies_started_total 2",
            "workload_manager_proxies_stopped_total 1",
        ] {
            assert!(text.lines().any(|shown| shown == line), "{line}:\n{text}");
        }
    }
}
