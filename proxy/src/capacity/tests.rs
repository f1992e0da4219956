use super::*;

fn pod(name: &str) -> WorkloadInfo {
    format!("shop/{name}/default").parse().unwrap()
}

fn text(registry: &Registry) -> String {
    crate::metrics::encode(registry).unwrap()
}

fn assert_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(text.lines().any(|got| got == *line), "{line} in:\n{text}");
    }
}

#[test]
fn refusals_are_counted_by_listener_and_reason_on_the_node_and_by_reason_for_the_pod() {
    let mut registry = Registry::default();
    let capacity = Capacity::register(&mut registry, 4, 1);
    let (busy, quiet) = (capacity.join(&pod("busy")), capacity.join(&pod("quiet")));
    let held: Vec<Slot> = (0..3)
        .map(|_| busy.admit(Listener::Outbound).unwrap())
        .collect();
    assert!(
        busy.admit(Listener::HboneStream).is_none(),
        "the quiet pod's floor is kept"
    );
    let _quiet_slot = quiet.admit(Listener::InboundPlaintext).unwrap();
    assert!(quiet.admit(Listener::SameNode).is_none());
    assert_lines(
        &text(&registry),
        &[
            "ztunnel_connections_refused_total{listener=\"hbone_stream\",reason=\"pod_share\"} 1",
            "ztunnel_connections_refused_total{listener=\"same_node\",reason=\"node_limit\"} 1",
            "ztunnel_connections_carried 4",
            "ztunnel_connection_limit 4",
            "ztunnel_pod_connections_carried{namespace=\"shop\",pod=\"busy\"} 3",
            "ztunnel_pod_connections_carried{namespace=\"shop\",pod=\"quiet\"} 1",
            // Half, now that both are busy: it holds more, from before.
            "ztunnel_pod_connection_share{namespace=\"shop\",pod=\"busy\"} 2",
            "ztunnel_pod_connections_refused_total{namespace=\"shop\",pod=\"busy\",reason=\"pod_share\"} 1",
            "ztunnel_pod_connections_refused_total{namespace=\"shop\",pod=\"quiet\",reason=\"node_limit\"} 1",
        ],
    );
    drop(held);
    let _again = busy.admit(Listener::Hbone).unwrap();
    assert_lines(
        &text(&registry),
        &[
            "ztunnel_connections_carried 2",
            "ztunnel_pod_connection_share{namespace=\"shop\",pod=\"busy\"} 2",
        ],
    );
}

#[test]
fn a_pods_series_go_with_its_last_slot_after_its_proxy_is_gone() {
    let mut registry = Registry::default();
    let capacity = Capacity::register(&mut registry, 8, 2);
    let leaving = capacity.join(&pod("leaving"));
    let _staying = capacity.join(&pod("staying"));
    let slot = leaving.admit(Listener::Outbound).unwrap();
    drop(leaving);
    let carried = "ztunnel_pod_connections_carried{namespace=\"shop\",pod=\"leaving\"} 1";
    assert_lines(&text(&registry), &[carried]);
    drop(slot);
    let text = text(&registry);
    assert!(!text.contains("pod=\"leaving\""), "{text}");
    assert_lines(
        &text,
        &["ztunnel_pod_connection_share{namespace=\"shop\",pod=\"staying\"} 8"],
    );
}

#[test]
fn one_proxy_alone_may_carry_every_slot_and_a_limit_of_zero_one() {
    let capacity = Arc::new(Capacity::new(3, 1));
    let only = capacity.join(&pod("only"));
    let held: Vec<Slot> = (0..3)
        .map(|_| only.admit(Listener::Outbound).unwrap())
        .collect();
    assert!(only.admit(Listener::Outbound).is_none());
    drop(held);
    let capacity = Arc::new(Capacity::new(0, 0));
    let only = capacity.join(&pod("only"));
    let _one = only.admit(Listener::Outbound).unwrap();
    assert!(only.admit(Listener::Outbound).is_none());
}
