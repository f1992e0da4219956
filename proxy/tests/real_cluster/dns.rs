//! The DNS proxy on the real cluster: a meshed pod's lookups (the system
//! resolver, its resolv.conf and search list as the kubelet wrote them) are
//! captured to its node's ztunnel, which answers the mesh's Service names
//! itself and forwards the rest to the cluster DNS (CoreDNS), the
//! nameserver of ztunnel's own resolv.conf.

use super::*;

/// `node`'s ztunnel's Prometheus text, scraped from the node as Prometheus
/// would from the pod network.
fn ztunnel_metrics(cluster: &RealCluster, node: &str) -> String {
    let ztunnel = cluster
        .pods(MESH_NAMESPACE, "app=ztunnel")
        .unwrap()
        .into_iter()
        .find(|pod| pod.node.as_deref() == Some(node))
        .unwrap();
    let address = format!("{}:15020", ztunnel.ip.as_deref().unwrap())
        .parse()
        .unwrap();
    let (status, text) = cluster
        .node(node)
        .unwrap()
        .netns()
        .http_get_from(address, "/metrics")
        .unwrap();
    assert_eq!(status, 200, "{text}");
    text
}

/// The addresses the `resolve` report gives `name`, or its error.
fn resolved(report: &Value, name: &str) -> Result<Vec<String>, String> {
    let result = report["results"]
        .as_array()
        .and_then(|results| results.iter().find(|result| result["name"] == name))
        .unwrap_or_else(|| panic!("no result for {name}: {report}"));
    match result["addresses"].as_array() {
        Some(addresses) => Ok(addresses
            .iter()
            .filter_map(|address| address.as_str().map(str::to_owned))
            .collect()),
        None => Err(result["error"].as_str().unwrap_or_default().to_owned()),
    }
}

/// A pod on node-a looks up the echo Service by each of its names, an echo
/// pod by its CoreDNS pod name and a Service that does not exist: the
/// Service names give the ClusterIP, the pod name its IP (forwarded), the
/// missing one nothing; node-a's ztunnel counts the queries and the
/// forwarded ones.
pub(super) fn a_meshed_pods_lookups_are_answered_by_its_ztunnel_or_forwarded_to_the_cluster_dns(
    cluster: &RealCluster,
    app: &App,
) {
    let before = ztunnel_metrics(cluster, "node-a");
    let service_names = [
        "echo".to_owned(),
        format!("echo.{APP_NAMESPACE}"),
        format!("echo.{APP_NAMESPACE}.svc"),
        format!("echo.{APP_NAMESPACE}.svc.cluster.local"),
    ];
    let (_, echo_ip) = app.echo_on("node-b");
    let pod_name = format!(
        "{}.{APP_NAMESPACE}.pod.cluster.local",
        echo_ip.replace('.', "-")
    );
    let missing = format!("no-such-service.{APP_NAMESPACE}.svc.cluster.local");
    let mut args = vec!["resolve".to_owned()];
    for name in service_names.iter().chain([&pod_name, &missing]) {
        args.extend(["--name".to_owned(), name.clone()]);
    }
    let (_, report) = run_client(cluster, "client-resolve", "node-a", &as_str(&args));
    for name in &service_names {
        assert_eq!(
            resolved(&report, name),
            Ok(vec![app.cluster_ip.clone()]),
            "{name}: {report}"
        );
    }
    assert_eq!(
        resolved(&report, &pod_name),
        Ok(vec![echo_ip.to_owned()]),
        "{report}"
    );
    assert!(resolved(&report, &missing).is_err(), "{report}");

    let after = ztunnel_metrics(cluster, "node-a");
    let grew = |family: &str| metric_sum(&after, family) - metric_sum(&before, family);
    let requests = grew("istio_dns_requests_total");
    let forwarded = grew("istio_dns_upstream_requests_total");
    // Each Service name is at least an A and an AAAA query; the pod name
    // and the missing Service (and its search-list expansions) go upstream.
    assert!(
        requests >= 2.0 * service_names.len() as f64,
        "node-a's ztunnel saw {requests} DNS queries"
    );
    assert!(forwarded >= 2.0, "{forwarded} queries forwarded");
    assert!(
        requests > forwarded,
        "the Service names were answered by ztunnel: {requests} queries, {forwarded} forwarded"
    );
    println!(
        "DNS from node-a: {} Service names answered by ztunnel, a pod name and a missing name forwarded to CoreDNS; {requests} queries, {forwarded} forwarded",
        service_names.len()
    );
}
