//! containerd on a node: its configuration (the CRI plugin with runc
//! through the v2 shim, cgroupfs, the node's CNI directories, the sandbox
//! image loaded from an archive since no registry is reachable), starting
//! it, and loading images into its `k8s.io` namespace with `ctr`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;

use super::node::Node;
use crate::wait;

/// containerd's socket inside the node's mount namespace (its /run is the
/// node's own tmpfs), where kubelet and ctr find it by default.
pub const SOCKET: &str = "/run/containerd/containerd.sock";

/// Writes the node's containerd configuration and starts containerd;
/// returns once its socket answers.
pub fn start(node: &mut Node, bin: &Path, sandbox_image: &str) -> anyhow::Result<()> {
    let config = node.dir.join("containerd.toml");
    std::fs::write(&config, config_toml(bin, sandbox_image))?;
    node.spawn(
        "containerd",
        &bin.join("containerd"),
        &[format!("--config={}", config.display())],
    )?;
    let ctr = bin.join("ctr");
    let up = wait::until(Duration::from_secs(30), || {
        node.run(&ctr, &["--address", SOCKET, "version"]).is_ok()
    });
    if !up {
        node.check_running()?;
        bail!(
            "containerd on {} did not answer in 30 s: {}",
            node.name,
            node.log("containerd")
        );
    }
    Ok(())
}

/// Imports an OCI image archive into the node's `k8s.io` namespace as
/// `docker.io/library/<name>:<tag>` (the name a pod's `image: <name>:<tag>`
/// is normalised to), and tags the same image with `extra_tags`.
pub fn import(
    node: &Node,
    bin: &Path,
    archive: &Path,
    name: &str,
    tag: &str,
    extra_tags: &[&str],
) -> anyhow::Result<()> {
    let ctr = bin.join("ctr");
    let base = format!("docker.io/library/{name}");
    let archive = archive.display().to_string();
    node.run(
        &ctr,
        &[
            "--address",
            SOCKET,
            "-n",
            "k8s.io",
            "images",
            "import",
            "--base-name",
            &base,
            &archive,
        ],
    )?;
    let reference = format!("{base}:{tag}");
    for extra in extra_tags {
        let target = format!("{base}:{extra}");
        node.run(
            &ctr,
            &[
                "--address",
                SOCKET,
                "-n",
                "k8s.io",
                "images",
                "tag",
                "--force",
                &reference,
                &target,
            ],
        )?;
    }
    Ok(())
}

/// containerd 2's configuration (version 3) for a node of this machine
/// kind: no systemd as PID 1, so cgroupfs (runc's `SystemdCgroup = false`);
/// no CAP_SYS_RESOURCE in the sandbox, so the CRI runtime must not raise
/// containers' OOM score adjustment above its own
/// (`restrict_oom_score_adj`).
fn config_toml(bin: &Path, sandbox_image: &str) -> String {
    let runc: PathBuf = bin.join("runc");
    format!(
        r#"version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "{SOCKET}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{sandbox_image}"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
"#,
        runc = runc.display()
    )
}
