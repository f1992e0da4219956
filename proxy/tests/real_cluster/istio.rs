//! Istio's own components drive our ztunnel: istiod (CA and xDS),
//! istio-cni (node agent and CNI plugin, talking ZDS to ztunnel) and
//! Istio's Helm charts, installed as Istio's documentation installs
//! ambient mode, with only the images pointed at ours and at the ones
//! built from the pinned istio/istio module
//! (`ztunnel_test_support::real_cluster::istio`).

use ztunnel_test_support::real_cluster::istio::IstioChart;

use super::*;

/// `helm install` of Istio's four charts in the documented order, each
/// with no value beyond where its images are (and the ambient profile
/// where the documentation sets it): istiod available, the istio-cni and
/// ztunnel DaemonSets Ready on both nodes, and no component refused by the
/// API server's authorization.
pub(super) fn install(cluster: &RealCluster, helm: &Helm) {
    let started = Instant::now();
    for chart in IstioChart::ALL {
        let first_line = cluster.istio_install(helm, chart, &[]).unwrap();
        println!("helm install {}: {first_line}", chart.release());
    }
    let ready = wait::until(INSTALL_READY_WITHIN, || {
        cluster
            .istio_problems()
            .is_ok_and(|problems| problems.is_empty())
    });
    let problems = cluster.istio_problems();
    assert!(
        ready,
        "Istio's install was not Ready in {INSTALL_READY_WITHIN:?}: {problems:?}\n{}",
        pods_summary(cluster)
    );
    println!(
        "figure: helm install of Istio's base, istiod, istio-cni and ztunnel (ours) to all Ready: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for (pod, container) in cluster.mesh_containers().unwrap() {
        let log = cluster.pod_log(MESH_NAMESPACE, &pod, &container).unwrap();
        let refused = helm::permission_problems(&log);
        assert!(
            refused.is_empty(),
            "{pod}/{container} was refused: {refused:?}"
        );
    }
}
