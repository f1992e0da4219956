//! Istio's own control plane and node agent on a real cluster, installed
//! as Istio's documentation installs ambient mode with Helm: the charts
//! `base`, `istiod` (the `ambient` profile), `istio-cni` (the `ambient`
//! profile) and `ztunnel`, into [`MESH_NAMESPACE`], each as its own
//! release. istiod and istio-cni run the images
//! `scripts/build-images.sh --istio-images` built from the pinned
//! istio/istio module (`scripts/k8s-test-env.sh --istio`); the ztunnel
//! chart runs ours. The charts come from the same module, copied into the
//! cache: nothing of Istio's is kept in this repository.

use std::path::PathBuf;

use super::{Images, MESH_NAMESPACE, RealCluster, has_condition};
use crate::helm::Helm;
use crate::kube::KubeApi;

/// Istio's images, as its charts name them: istiod and the istio-cni node
/// agent (with its CNI plugin).
pub const ISTIO_IMAGES: [&str; 2] = ["pilot", "install-cni"];
/// The tag `scripts/build-images.sh --istio-images` gives them.
pub const ISTIO_TAG: &str = "1.31-dev";
/// The image variant Istio's `ambient` profile asks for
/// (`global.variant`): the images are loaded under `<tag>-<variant>` too.
pub const ISTIO_VARIANT: &str = "distroless";
/// Where the charts' `hub` points: the images are loaded under
/// `docker.io/library/<name>`, as for a pod's `image: <name>:<tag>`.
pub const HUB: &str = "docker.io/library";

/// Istio's charts, in the order they are installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IstioChart {
    /// `base`: the CRDs and the cluster-wide roles.
    Base,
    /// `istiod` (`istio-control/istio-discovery`): the CA and xDS server.
    Istiod,
    /// `istio-cni`: the node agent and its CNI plugin.
    Cni,
    /// `ztunnel`.
    Ztunnel,
}

impl IstioChart {
    /// Every chart, in install order.
    pub const ALL: [IstioChart; 4] = [Self::Base, Self::Istiod, Self::Cni, Self::Ztunnel];

    /// The chart's directory name in the cache.
    fn dir(self) -> &'static str {
        match self {
            Self::Base => "base",
            Self::Istiod => "istio-discovery",
            Self::Cni => "istio-cni",
            Self::Ztunnel => "ztunnel",
        }
    }

    /// The release name Istio's documentation gives it.
    pub fn release(self) -> &'static str {
        match self {
            Self::Base => "istio-base",
            Self::Istiod => "istiod",
            Self::Cni => "istio-cni",
            Self::Ztunnel => "ztunnel",
        }
    }

    /// What an operator sets to install it for ambient mode from images
    /// of their own registry: the profile, and where the images are.
    /// `ztunnel_tag` is the tag of our ztunnel image.
    fn values(self, ztunnel_tag: &str) -> Vec<String> {
        match self {
            Self::Base => vec![],
            Self::Istiod | Self::Cni => vec![
                "profile=ambient".to_owned(),
                format!("global.hub={HUB}"),
                format!("global.tag={ISTIO_TAG}"),
            ],
            Self::Ztunnel => vec![format!("hub={HUB}"), format!("tag={ztunnel_tag}")],
        }
    }
}

/// The directory of Istio's charts (`scripts/k8s-test-env.sh --istio`
/// copies them beside the binaries), or why it cannot be used.
pub fn charts() -> Result<PathBuf, String> {
    let dir = KubeApi::binaries()?.join("../istio-charts");
    for chart in IstioChart::ALL {
        let path = dir.join(chart.dir()).join("Chart.yaml");
        if !path.is_file() {
            return Err(format!(
                "{} missing: run scripts/k8s-test-env.sh --istio (scripts/test.sh does)",
                path.display()
            ));
        }
    }
    Ok(dir)
}

/// Why Istio's components cannot run on a real cluster here, if they
/// cannot: their charts or images are missing.
pub fn unavailable() -> Option<String> {
    if let Err(reason) = charts() {
        return Some(reason);
    }
    let images = match Images::built() {
        Ok(images) => images,
        Err(reason) => return Some(reason),
    };
    ISTIO_IMAGES.iter().find_map(|name| {
        let archive = images.archive(name);
        (!archive.is_file()).then(|| {
            format!(
                "{} missing: run scripts/build-images.sh --istio-images (scripts/test.sh does)",
                archive.display()
            )
        })
    })
}

impl RealCluster {
    /// `helm install` of Istio's `chart` as its documentation does it for
    /// ambient mode, with its images from this cluster, then `values`
    /// (`key=value`, as `--set` takes them). helm's first line.
    pub fn istio_install(
        &self,
        helm: &Helm,
        chart: IstioChart,
        values: &[String],
    ) -> anyhow::Result<String> {
        let mut sets = chart.values(&self.images().tag);
        sets.extend_from_slice(values);
        self.istio_helm(helm, "install", chart, &["--create-namespace"], &sets)
    }

    /// `helm upgrade --reuse-values` of Istio's `chart` with `values`.
    pub fn istio_upgrade(
        &self,
        helm: &Helm,
        chart: IstioChart,
        values: &[String],
    ) -> anyhow::Result<String> {
        self.istio_helm(helm, "upgrade", chart, &["--reuse-values"], values)
    }

    /// `helm uninstall --wait` of Istio's `chart`: its objects are gone
    /// when it returns.
    pub fn istio_uninstall(&self, helm: &Helm, chart: IstioChart) -> anyhow::Result<String> {
        let kubeconfig = self.api()?.admin_kubeconfig().display().to_string();
        let output = helm.run(&[
            "uninstall",
            chart.release(),
            "--kubeconfig",
            &kubeconfig,
            "--namespace",
            MESH_NAMESPACE,
            "--wait",
            "--timeout",
            "3m",
        ])?;
        Ok(output.lines().next().unwrap_or_default().to_owned())
    }

    fn istio_helm(
        &self,
        helm: &Helm,
        verb: &str,
        chart: IstioChart,
        flags: &[&str],
        values: &[String],
    ) -> anyhow::Result<String> {
        let dir = charts().map_err(|reason| anyhow::anyhow!(reason))?;
        self.helm_release(
            helm,
            verb,
            chart.release(),
            &dir.join(chart.dir()),
            flags,
            values,
        )
    }

    /// What is not yet as Istio's install should leave it; empty once
    /// istiod is available and the istio-cni and ztunnel DaemonSets are
    /// Ready on every node.
    pub fn istio_problems(&self) -> anyhow::Result<Vec<String>> {
        let mut problems = self.daemonset_problems(&["istio-cni-node", "ztunnel"])?;
        let deployment = self.get_json(&["get", "deployment", "-n", MESH_NAMESPACE, "istiod"])?;
        if !has_condition(&deployment, "Available") {
            problems.push("deployment istiod not available".to_owned());
        }
        Ok(problems)
    }
}
