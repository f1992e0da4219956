//! `deploy/dashboards/ztunnel.json` queries only metrics the proxy exports:
//! every name in its queries is registered by the functions start-up
//! registers with (traffic and build, xDS, process and runtime, and the
//! shared mode's pod proxies, the DNS proxy), save the kubelet's
//! `container_*`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use hickory_proto::rr::RecordType;
use prometheus_client::registry::Registry;
use tokio::runtime::Handle;
use ztunnel_proxy::dns::metrics::{DnsLabels, DnsMetrics, query_type_label};
use ztunnel_proxy::dns::wire::Transport;
use ztunnel_proxy::metrics::{
    LabelValue, Metrics, Reporter, ResponseFlags, TrafficLabels, WorkloadManagerMetrics,
    register_process_and_runtime,
};
use ztunnel_proxy::xds::XdsMetrics;

/// Every metric the dashboard queries (each is written `name{…}` there),
/// except the kubelet's `container_*`.
fn dashboard_metrics() -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/dashboards/ztunnel.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut names = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            for (at, _) in expr.match_indices('{') {
                let start = expr[..at]
                    .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                    .map_or(0, |before| before + 1);
                let name = &expr[start..at];
                if !name.is_empty()
                    && !name.starts_with("container_")
                    && !names.iter().any(|known| known == name)
                {
                    names.push(name.to_owned());
                }
            }
        }
    }
    names
}

/// The `# TYPE` names of everything registered that has counted something.
fn declared(registry: &Registry) -> Vec<String> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split(' ').next())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_exported() {
    let mut registry = Registry::default();
    let traffic = Metrics::register(&mut registry, "1.28.0");
    let xds = XdsMetrics::register(&mut registry);
    register_process_and_runtime(&mut registry, Handle::current());
    let pods = WorkloadManagerMetrics::register(&mut registry);
    let dns = DnsMetrics::register(&mut registry);
    // Families show once they have counted something: one failed
    // connection, one ended xDS stream, one pod proxy, one DNS query of
    // each kind.
    traffic
        .open(TrafficLabels::new(Reporter::Source))
        .close(ResponseFlags::Connect);
    xds.record_termination("test");
    pods.started(1);
    let dns_labels = DnsLabels {
        query_type: query_type_label(RecordType::A),
        protocol: Transport::Udp,
        canonical_service: LabelValue::unknown(),
        canonical_revision: LabelValue::unknown(),
    };
    for family in [
        &dns.requests,
        &dns.upstream_requests,
        &dns.upstream_failures,
    ] {
        family.get_or_create(&dns_labels).inc();
    }
    let declared = declared(&registry);

    let queried = dashboard_metrics();
    assert!(queried.len() >= 10, "the dashboard's metrics: {queried:?}");
    let missing: Vec<&String> = queried
        .iter()
        .filter(|name| {
            // A counter is declared without its `_total`.
            let base = name.strip_suffix("_total").unwrap_or(name);
            !declared.iter().any(|known| known == base)
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries {missing:?}, which ztunnel does not export; it exports {declared:?}"
    );
    // The families Istio's own ztunnel dashboard reads keep their names.
    for istio in [
        "istio_build",
        "istio_tcp_connections_opened_total",
        "istio_tcp_connections_closed_total",
        "istio_tcp_sent_bytes_total",
        "istio_tcp_received_bytes_total",
        "istio_xds_connection_terminations_total",
        "workload_manager_active_proxy_count",
        "workload_manager_pending_proxy_count",
    ] {
        assert!(queried.iter().any(|name| name == istio), "{istio}");
    }
}
