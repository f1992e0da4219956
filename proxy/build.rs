//! Build facts `ztunnel --version`, `/config_dump` and `istio_build` report
//! (`src/version.rs`): the compiler's version and the cargo profile.

use std::process::Command;

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    // `rustc 1.90.0 (1159e78c4 2025-09-14)` → `1.90.0`.
    let rust_version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .and_then(|text| text.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned());
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".to_owned());
    println!("cargo:rustc-env=ZTUNNEL_RUST_VERSION={rust_version}");
    println!("cargo:rustc-env=ZTUNNEL_BUILD_PROFILE={profile}");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=ZTUNNEL_BUILD_GIT_REVISION");
    println!("cargo:rerun-if-env-changed=ZTUNNEL_BUILD_STATUS");
}
