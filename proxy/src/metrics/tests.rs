use super::*;

fn registry_with_metrics() -> (Registry, Metrics) {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry, "1.2.3");
    (registry, metrics)
}

fn lines_of<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|line| line.starts_with(name) && line[name.len()..].starts_with('{'))
        .collect()
}

fn inbound_labels() -> TrafficLabels {
    let mut labels = TrafficLabels::new(Reporter::Destination);
    labels.source.principal = "spiffe://cluster.local/ns/a/sa/client".into();
    labels.destination.workload = "server".into();
    labels.destination.workload_namespace = "b".into();
    labels.security_policy = SecurityPolicy::MutualTls;
    labels
}

#[test]
fn response_flags_read_as_on_the_wire() {
    let table = [
        (ResponseFlags::None, "-"),
        (ResponseFlags::Deny, "DENY"),
        (ResponseFlags::Connect, "CONNECT"),
        (ResponseFlags::TlsFailure, "TLS_FAILURE"),
        (ResponseFlags::H2HandshakeFailure, "H2_HANDSHAKE_FAILURE"),
        (ResponseFlags::NetworkPolicy, "NETWORK_POLICY"),
        (ResponseFlags::IdentityError, "IDENTITY_ERROR"),
        (ResponseFlags::CertRevoked, "CERT_REVOKED"),
    ];
    for (flags, text) in table {
        assert_eq!(flags.as_str(), text);
    }
}

#[test]
fn traffic_labels_are_exposed_in_wire_order_with_unknown_for_missing() {
    let (registry, metrics) = registry_with_metrics();
    let connection = metrics.open(inbound_labels());
    connection.add_sent(10);
    let text = encode(&registry).unwrap();
    let opened = lines_of(&text, "istio_tcp_connections_opened_total");
    assert_eq!(opened.len(), 1, "{text}");
    assert_eq!(
        opened[0],
        "istio_tcp_connections_opened_total{reporter=\"destination\",\
         source_workload=\"unknown\",source_canonical_service=\"unknown\",\
         source_canonical_revision=\"unknown\",source_workload_namespace=\"unknown\",\
         source_principal=\"spiffe://cluster.local/ns/a/sa/client\",source_app=\"unknown\",\
         source_version=\"unknown\",source_cluster=\"unknown\",\
         destination_service=\"unknown\",destination_service_namespace=\"unknown\",\
         destination_service_name=\"unknown\",destination_workload=\"server\",\
         destination_canonical_service=\"unknown\",destination_canonical_revision=\"unknown\",\
         destination_workload_namespace=\"b\",destination_principal=\"unknown\",\
         destination_app=\"unknown\",destination_version=\"unknown\",\
         destination_cluster=\"unknown\",request_protocol=\"tcp\",response_flags=\"-\",\
         connection_security_policy=\"mutual_tls\",source_region=\"unknown\",\
         source_zone=\"unknown\",destination_region=\"unknown\",destination_zone=\"unknown\"} 1"
    );
    assert_eq!(lines_of(&text, "istio_tcp_sent_bytes_total").len(), 1);
    drop(connection);
}

#[test]
fn a_clean_close_is_not_a_failure_and_a_flagged_one_is() {
    let (registry, metrics) = registry_with_metrics();
    let clean = metrics.open(inbound_labels());
    clean.add_sent(5);
    clean.add_received(7);
    assert_eq!(
        clean.close(ResponseFlags::None),
        ByteTotals {
            sent: 5,
            received: 7
        }
    );
    metrics.open(inbound_labels()).close(ResponseFlags::Deny);

    let text = encode(&registry).unwrap();
    let closed = lines_of(&text, "istio_tcp_connections_closed_total");
    assert_eq!(closed.len(), 2, "{text}");
    let failed = lines_of(&text, "istio_tcp_connections_failed_total");
    assert_eq!(failed.len(), 1, "{text}");
    assert!(failed[0].contains("response_flags=\"DENY\""));
    assert!(failed[0].ends_with(" 1"));
}

#[test]
fn sockets_open_follows_open_and_close_including_a_dropped_handle() {
    let (registry, metrics) = registry_with_metrics();
    let first = metrics.open(inbound_labels());
    let second = metrics.open(inbound_labels());
    let gauge = |registry: &Registry| {
        let text = encode(registry).unwrap();
        lines_of(&text, "istio_tcp_sockets_open")
            .first()
            .map(|line| line.to_string())
    };
    assert_eq!(
        gauge(&registry).as_deref(),
        Some("istio_tcp_sockets_open{reporter=\"destination\"} 2")
    );
    first.close(ResponseFlags::None);
    drop(second);
    assert_eq!(
        gauge(&registry).as_deref(),
        Some("istio_tcp_sockets_open{reporter=\"destination\"} 0")
    );
    let text = encode(&registry).unwrap();
    let closed = lines_of(&text, "istio_tcp_connections_closed_total");
    assert_eq!(closed.len(), 1);
    assert!(closed[0].ends_with(" 2"), "{text}");
}

#[test]
fn build_and_policy_close_have_their_exact_names() {
    let (registry, metrics) = registry_with_metrics();
    metrics.record_policy_close(Reporter::Destination);
    metrics.record_crl_rejection(Reporter::Source);
    metrics.record_crl_untracked(Reporter::Destination);
    let text = encode(&registry).unwrap();
    assert!(
        text.contains("istio_crl_policy_rejections_total{reporter=\"source\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("istio_crl_untracked_connections_total{reporter=\"destination\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("istio_build{component=\"ztunnel\",tag=\"1.2.3\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("ztunnel_policy_closed_connections_total{reporter=\"destination\"} 1"),
        "{text}"
    );
}

#[test]
fn locality_labels_come_last_and_read_unknown_when_not_known() {
    let (registry, metrics) = registry_with_metrics();
    let mut labels = inbound_labels();
    labels.source.region = "eu".into();
    labels.source.zone = "eu-1".into();
    labels.destination.region = "eu".into();
    labels.destination.zone = "eu-2".into();
    let with_locality = metrics.open(labels);
    let without = metrics.open(inbound_labels());
    let text = encode(&registry).unwrap();
    let opened = lines_of(&text, "istio_tcp_connections_opened_total");
    assert_eq!(opened.len(), 2);
    for (locality, count) in [
        (
            "source_region=\"eu\",source_zone=\"eu-1\",\
             destination_region=\"eu\",destination_zone=\"eu-2\"}",
            1,
        ),
        (
            "source_region=\"unknown\",source_zone=\"unknown\",\
             destination_region=\"unknown\",destination_zone=\"unknown\"}",
            1,
        ),
    ] {
        let after_policy = format!("connection_security_policy=\"mutual_tls\",{locality}");
        assert_eq!(
            opened
                .iter()
                .filter(|line| line.contains(&after_policy))
                .count(),
            count,
            "{text}"
        );
    }
    drop((with_locality, without));
}

#[test]
fn an_empty_value_reads_unknown() {
    assert_eq!(LabelValue::from("").as_str(), "unknown");
    assert_eq!(LabelValue::unknown().as_str(), "unknown");
    assert_eq!(LabelValue::from(None).as_str(), "unknown");
}

#[test]
fn connections_with_the_same_labels_share_one_copy() {
    let (_registry, metrics) = registry_with_metrics();
    let first = metrics.open(inbound_labels());
    let second = metrics.open(inbound_labels());
    assert!(Arc::ptr_eq(&first.labels, &second.labels));
}
