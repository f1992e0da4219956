//! istiod going away and istiod refusing: our running ztunnels keep
//! serving with what they have, reconnect, report not-ready only where
//! Istio's ztunnel does, and log a refused identity with istiod's answer.

use super::*;

/// istiod goes away (scaled to 0) and comes back as a new pod. Meanwhile
/// our running ztunnels keep serving with what they have: a soak's new and
/// long-lived connections across nodes go on without a failure, and both
/// ztunnels stay Ready, as Istio's do. A ztunnel that starts while istiod
/// is away (node-b's, deleted) is not Ready, as Istio's is not, and becomes
/// Ready once istiod is back; the running one (node-a's) reconnects: a
/// policy applied afterwards is enforced by it.
pub(crate) fn our_ztunnels_ride_out_an_istiod_outage(cluster: &RealCluster, app: &App) {
    let (_, echo_b) = app.echo_on("node-b");
    let soak = HeldOpen::start_with_rate(cluster, "through-outage", "node-a", echo_b, 10);
    std::thread::sleep(Duration::from_secs(2));
    let before = soak_counts(cluster, soak.name).unwrap();

    let scale = |replicas: &str| {
        cluster
            .kubectl(&[
                "scale",
                "deployment",
                "-n",
                MESH_NAMESPACE,
                ISTIOD,
                &format!("--replicas={replicas}"),
            ])
            .unwrap();
    };
    let istiod_pods = || {
        cluster
            .pods(MESH_NAMESPACE, "app=istiod")
            .unwrap_or_default()
    };
    scale("0");
    let gone = wait::until(POD_WITHIN, || istiod_pods().is_empty());
    assert!(gone, "istiod did not go:\n{}", pods_summary(cluster));
    let outage = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let during = soak_counts(cluster, soak.name).unwrap();
    let SoakChange {
        new_ok,
        new_failed,
        breaks,
    } = SoakChange::between(&before, &during);
    assert!(
        new_ok > 0 && new_failed == 0 && breaks == 0,
        "with istiod away, across nodes: {new_ok} new connections served, {new_failed} failed, {breaks} long-lived broken\n{during}"
    );
    let ztunnels = cluster.pods(MESH_NAMESPACE, "app=ztunnel").unwrap();
    assert!(
        ztunnels.len() == 2 && ztunnels.iter().all(|pod| pod.ready),
        "running ztunnels turned unready with istiod away: {ztunnels:?}"
    );
    println!(
        "figure: istiod away {:.1} s: {new_ok} new connections across nodes served, 0 failed, 0 long-lived broken; both ztunnels Ready",
        outage.elapsed().as_secs_f64()
    );
    soak.stop(cluster);

    // A ztunnel starting with istiod away.
    let old_b = ztunnels
        .iter()
        .find(|pod| pod.node.as_deref() == Some("node-b"))
        .unwrap()
        .name
        .clone();
    cluster
        .kubectl(&["delete", "pod", "-n", MESH_NAMESPACE, &old_b])
        .unwrap();
    let mut new_b = PodStatus::default();
    let started = wait::until(POD_WITHIN, || {
        new_b = cluster
            .pods(MESH_NAMESPACE, "app=ztunnel")
            .unwrap_or_default()
            .into_iter()
            .find(|pod| pod.node.as_deref() == Some("node-b") && pod.name != old_b)
            .unwrap_or_default();
        new_b.phase == "Running" && new_b.ip.is_some()
    });
    assert!(started, "node-b's new ztunnel did not start: {new_b:?}");
    let node_b = cluster.node("node-b").unwrap();
    let readiness = format!("{}:15021", new_b.ip.as_deref().unwrap())
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_secs(5));
    let (status, body) = node_b
        .netns()
        .http_get_from(readiness, "/healthz/ready")
        .unwrap();
    assert_ne!(
        status, 200,
        "a ztunnel started with istiod away reports ready: {body}"
    );
    println!(
        "a ztunnel started with istiod away: /healthz/ready {status} {}",
        body.trim()
    );

    scale("1");
    let back = Instant::now();
    let available = wait::until(POD_WITHIN, || istiod_pods().iter().any(|pod| pod.ready));
    assert!(
        available,
        "istiod did not come back:\n{}",
        pods_summary(cluster)
    );
    let istiod_ready = back.elapsed();
    let ready = wait::until(POD_WITHIN, || {
        node_b
            .netns()
            .http_get_from(readiness, "/healthz/ready")
            .is_ok_and(|(status, _)| status == 200)
    });
    assert!(ready, "node-b's ztunnel was not ready once istiod was back");
    println!(
        "figure: istiod scaled back to Ready: {:.1} s; to the ztunnel started meanwhile ready: {:.1} s",
        istiod_ready.as_secs_f64(),
        back.elapsed().as_secs_f64()
    );

    // node-a's ztunnel, which ran through the outage, gets policy from the
    // new istiod: a DENY on the echo pod of node-a, enforced there.
    let (echo_a_name, echo_a) = app.echo_on("node-a");
    apply(cluster, &echo_policy("deny-after-outage", "DENY", "client"));
    let (took, _) =
        until_clients(cluster, Source::client("node-b"), echo_a, false).unwrap_or_else(|last| {
            panic!("node-a's ztunnel did not enforce a policy from the new istiod: {last}")
        });
    println!(
        "figure: policy from the new istiod enforced by the ztunnel that ran through the outage: {:.1} s",
        took.as_secs_f64()
    );
    delete_policy(cluster, "deny-after-outage");
    let (_, pod) = until_clients(cluster, Source::client("node-b"), echo_a, true)
        .unwrap_or_else(|last| panic!("after the outage, node-b to node-a: {last}"));
    let delivered = delivered_as_client(cluster, "node-a", echo_a_name, &pod);
    assert_eq!(
        delivered,
        5,
        "after the outage: {delivered} of 5 connections through ztunnel\n{}",
        traces_of(cluster, &pod)
    );
}

/// istiod's CA refuses our ztunnels' impersonation (its chart's
/// `trustedZtunnelName` set to another account, as when the two charts
/// disagree): the ztunnel on node-a logs the refusal of a new pod's
/// identity with the identity and istiod's answer, while pods whose
/// certificates it already holds go on being served; once istiod trusts
/// it again, the refused identity is issued and served.
pub(crate) fn a_refused_identity_is_logged_and_other_pods_keep_working(
    cluster: &RealCluster,
    helm: &Helm,
    app: &App,
) {
    let (_, echo_b) = app.echo_on("node-b");
    let soak = HeldOpen::start_with_rate(cluster, "through-refusal", "node-a", echo_b, 5);
    create_service_account(cluster, REFUSED_SA);
    let rolled = |trusted: &str| {
        let first_line = cluster
            .istio_upgrade(
                helm,
                IstioChart::Istiod,
                &[format!("trustedZtunnelName={trusted}")],
            )
            .unwrap();
        println!("helm upgrade istiod trustedZtunnelName={trusted}: {first_line}");
        let done = wait::until(ROLLOUT_WITHIN, || {
            workload_rolled(cluster, "deployment", ISTIOD)
        });
        assert!(done, "istiod did not roll:\n{}", pods_summary(cluster));
    };
    rolled("ztunnel-elsewhere");
    let before = soak_counts(cluster, soak.name).unwrap();

    let identity = format!("spiffe://{TRUST_DOMAIN}/ns/{APP_NAMESPACE}/sa/{REFUSED_SA}");
    let (pod, report) = run_client_as(
        cluster,
        "refused-1",
        "node-a",
        REFUSED_SA,
        &as_str(&connect_args(echo_b, 5)),
    );
    assert_eq!(
        report["connections_made"].as_u64(),
        Some(0),
        "a pod whose identity istiod refuses was served: {report}"
    );
    let mut line = None;
    let logged = wait::until(POD_WITHIN, || {
        line = ztunnel_log(cluster, "node-a").into_iter().find(|line| {
            line.contains("certificate fetch failed")
                && line.contains(&identity)
                && line.contains("impersonation")
        });
        line.is_some()
    });
    assert!(
        logged,
        "node-a's ztunnel logged no refusal naming {identity} and istiod's answer:\n{}",
        traces_of(cluster, &pod)
    );
    println!("node-a's ztunnel: {}", line.unwrap_or_default());
    std::thread::sleep(Duration::from_secs(2));
    let after = soak_counts(cluster, soak.name).unwrap();
    let SoakChange {
        new_ok,
        new_failed,
        breaks,
    } = SoakChange::between(&before, &after);
    assert!(
        new_ok > 0 && new_failed == 0 && breaks == 0,
        "while istiod refused node-a's ztunnel, a pod it already served: {new_ok} new connections served, {new_failed} failed, {breaks} long-lived broken\n{after}"
    );
    println!(
        "figure: istiod refusing node-a's ztunnel: {new_ok} new connections of a pod already served, 0 failed, 0 long-lived broken"
    );
    soak.stop(cluster);

    rolled("ztunnel");
    let refused = Source {
        service_account: REFUSED_SA,
        ..Source::client("node-a")
    };
    let (took, _) = until_clients(cluster, refused, echo_b, true)
        .unwrap_or_else(|last| panic!("once istiod trusted node-a's ztunnel again: {last}"));
    println!(
        "figure: istiod trusting our ztunnel again to the refused identity served: {:.1} s",
        took.as_secs_f64()
    );
}

/// The service account whose identity istiod refuses to node-a's ztunnel.
const REFUSED_SA: &str = "refused";
