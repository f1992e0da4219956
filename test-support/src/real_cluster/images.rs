//! The images a real cluster runs, as OCI archives (no registry is
//! reachable here): the project's three and the test pause and application
//! images from `scripts/build-images.sh --test-images`, and CoreDNS packed
//! here with umoci from the binary `scripts/k8s-test-env.sh` built.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The project's images, by name: each archive is `<name>.oci.tar`.
pub const PROJECT: [&str; 3] = ["ztunnel", "ztunnel-agent", "ztunnel-ca"];
/// The CRI sandbox ("pause") image.
pub const PAUSE: &str = "ztunnel-test-pause";
/// The application image: `ztunnel-loadgen` (echo server and load
/// generator).
pub const APP: &str = "ztunnel-test-app";
/// The cluster DNS image, packed here.
pub const COREDNS: &str = "ztunnel-test-coredns";

/// Where the archives are, and the tag they carry.
#[derive(Debug, Clone)]
pub struct Images {
    /// The directory of `<name>.oci.tar` files.
    pub dir: PathBuf,
    /// The tag every image carries (the workspace version).
    pub tag: String,
}

impl Images {
    /// The archives `scripts/build-images.sh --test-images` wrote into
    /// `target/images` (or the directory `ZTUNNEL_IMAGES` names, where
    /// `--out` put them), or the reason they cannot be used.
    pub fn built() -> Result<Images, String> {
        let dir = std::env::var_os("ZTUNNEL_IMAGES").map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/images"),
            PathBuf::from,
        );
        let images = Images {
            dir,
            tag: env!("CARGO_PKG_VERSION").to_owned(),
        };
        for name in PROJECT.iter().chain(&[PAUSE, APP]) {
            let archive = images.archive(name);
            if !archive.is_file() {
                return Err(format!(
                    "{} missing: run scripts/build-images.sh --test-images (scripts/test.sh does)",
                    archive.display()
                ));
            }
        }
        Ok(images)
    }

    /// The archive of image `name`.
    pub fn archive(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.oci.tar"))
    }

    /// `<name>:<tag>`, as a pod spec names it.
    pub fn reference(&self, name: &str) -> String {
        format!("{name}:{}", self.tag)
    }
}

/// Packs `coredns` (a static binary) into an OCI archive at
/// `<dir>/<COREDNS>.oci.tar`, tagged `tag`, with umoci.
pub fn pack_coredns(bin: &Path, dir: &Path, tag: &str) -> anyhow::Result<PathBuf> {
    let umoci = bin.join("umoci");
    let layout = dir.join("coredns-layout");
    let stage = dir.join("coredns-stage");
    std::fs::create_dir_all(stage.join("usr/local/bin"))?;
    std::fs::copy(bin.join("coredns"), stage.join("usr/local/bin/coredns"))
        .context("copying coredns")?;
    let image = format!("{}:{tag}", layout.display());
    let layout_arg = layout.display().to_string();
    let stage_arg = stage.display().to_string();
    for args in [
        vec!["init", "--layout", &layout_arg],
        vec!["new", "--image", &image],
        vec![
            "config",
            "--image",
            &image,
            "--os",
            "linux",
            "--architecture",
            "amd64",
            "--config.entrypoint",
            "/usr/local/bin/coredns",
            "--config.workingdir",
            "/",
        ],
        vec!["insert", "--image", &image, &stage_arg, "/"],
    ] {
        let output = Command::new(&umoci).args(&args).output()?;
        if !output.status.success() {
            bail!(
                "umoci {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    let archive = dir.join(format!("{COREDNS}.oci.tar"));
    let status = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()?;
    if !status.success() {
        bail!("tar of the CoreDNS layout failed");
    }
    Ok(archive)
}
