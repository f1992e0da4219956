//! Process and runtime metrics under istio/ztunnel's names (AMBIENT.md
//! §6.8), read on each scrape rather than kept: `process_open_fds` and
//! `process_max_fds`, and the data-plane runtime's `tokio_*` gauges and
//! per-worker counters. No `istio_` prefix: these are the names Istio's
//! dashboards query.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::runtime::Handle;

/// Registers the process metrics, and the runtime metrics of `data` (the
/// runtime that carries connections).
pub fn register_process_and_runtime(registry: &mut Registry, data: Handle) {
    registry.register_collector(Box::new(ProcessCollector));
    registry.register_collector(Box::new(RuntimeCollector { data }));
}

/// File descriptors: how many are open, and the limit.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // A count that cannot be read is left out rather than shown as 0.
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            // The directory handle read_dir holds is one of the entries.
            let open = entries.count().saturating_sub(1);
            gauge(
                &mut encoder,
                "process_open_fds",
                "Open file descriptors",
                open,
            )?;
        }
        if let Ok((soft, _hard)) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        {
            gauge(
                &mut encoder,
                "process_max_fds",
                "The most file descriptors the process may open",
                soft,
            )?;
        }
        Ok(())
    }
}

/// The data-plane runtime, as tokio counts it.
#[derive(Debug)]
struct RuntimeCollector {
    data: Handle,
}

impl Collector for RuntimeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let metrics = self.data.metrics();
        let workers = metrics.num_workers();
        gauge(
            &mut encoder,
            "tokio_num_workers",
            "Worker threads of the data-plane runtime",
            workers,
        )?;
        gauge(
            &mut encoder,
            "tokio_global_queue_depth",
            "Tasks waiting in the data-plane runtime's global queue",
            metrics.global_queue_depth(),
        )?;
        gauge(
            &mut encoder,
            "tokio_num_alive_tasks",
            "Tasks alive in the data-plane runtime",
            metrics.num_alive_tasks(),
        )?;
        per_worker(
            &mut encoder,
            "tokio_worker_total_busy_duration_seconds",
            "Time each worker has spent busy, in seconds",
            workers,
            |worker| metrics.worker_total_busy_duration(worker).as_secs_f64(),
        )?;
        per_worker(
            &mut encoder,
            "tokio_worker_park_count",
            "Times each worker has parked",
            workers,
            |worker| metrics.worker_park_count(worker) as f64,
        )?;
        per_worker(
            &mut encoder,
            "tokio_worker_park_unpark_count",
            "Times each worker has parked or unparked",
            workers,
            |worker| metrics.worker_park_unpark_count(worker) as f64,
        )
    }
}

fn gauge<N>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: N,
) -> Result<(), std::fmt::Error>
where
    ConstGauge<N>: EncodeMetric,
{
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// A counter family with one sample per worker, labelled `worker`.
fn per_worker(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    workers: usize,
    value: impl Fn(usize) -> f64,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for worker in 0..workers {
        let labels = [("worker", worker.to_string())];
        ConstCounter::new(value(worker)).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn process_and_runtime_metrics_have_istios_names_and_labels() {
        let mut registry = Registry::default();
        register_process_and_runtime(&mut registry, Handle::current());
        let text = crate::metrics::encode(&registry).unwrap();
        let value = |prefix: &str| {
            text.lines()
                .find(|line| line.starts_with(prefix))
                .and_then(|line| line.rsplit(' ').next())
                .and_then(|value| value.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {prefix}:\n{text}"))
        };
        assert!(
            value("process_open_fds ") >= 3.0,
            "stdin, stdout, stderr at least"
        );
        assert!(value("process_max_fds ") >= value("process_open_fds "));
        assert_eq!(value("tokio_num_workers "), 2.0);
        assert!(value("tokio_num_alive_tasks ") >= 0.0);
        assert!(value("tokio_global_queue_depth ") >= 0.0);
        for family in [
            "tokio_worker_total_busy_duration_seconds_total",
            "tokio_worker_park_count_total",
            "tokio_worker_park_unpark_count_total",
        ] {
            for worker in ["0", "1"] {
                value(&format!("{family}{{worker=\"{worker}\"}} "));
            }
        }
        assert!(
            text.contains("# HELP tokio_worker_park_count Times each worker has parked"),
            "counter HELP lines lack _total, as Istio's do:\n{text}"
        );
    }
}
