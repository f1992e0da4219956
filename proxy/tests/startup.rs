#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! What a person sees when ztunnel cannot start: one line on stderr that
//! names what failed and each of its causes once.

use std::process::{Command, Stdio};
use std::time::Duration;

use ztunnel_test_support::wait;

/// ztunnel stops on a missing root at once; the bound only keeps a
/// regression from hanging the test.
const STOP_WITHIN: Duration = Duration::from_secs(20);

#[test]
fn without_a_root_certificate_each_cause_is_printed_once() {
    // As Istio's chart starts it (`scripts/check-images.sh` does the same
    // in the image), in an empty directory: nothing is mounted, so the
    // root certificate at its default path is missing.
    let root = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ztunnel"))
        .args(["proxy", "ztunnel"])
        .env_clear()
        .env("CA_ADDRESS", "https://127.0.0.1:15012")
        .env("XDS_ADDRESS", "https://127.0.0.1:15012")
        .env("POD_NAME", "ztunnel-check")
        .env("POD_NAMESPACE", "istio-system")
        .env("NODE_NAME", "node-check")
        .env("INSTANCE_IP", "127.0.0.1")
        .env("SERVICE_ACCOUNT", "ztunnel")
        .current_dir(root.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stopped = wait::until(STOP_WITHIN, || child.try_wait().unwrap().is_some());
    if !stopped {
        child.kill().unwrap();
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stopped && !output.status.success(),
        "ztunnel did not stop with an error: {:?}\n{stderr}",
        output.status
    );
    assert_eq!(
        stderr.matches("reading root file").count(),
        1,
        "the failure is named once:\n{stderr}"
    );
    assert!(
        stderr.contains("./var/run/secrets/istio/root-cert.pem"),
        "the missing file is named:\n{stderr}"
    );
    assert_eq!(
        stderr
            .matches("No such file or directory (os error 2)")
            .count(),
        1,
        "the cause is named once:\n{stderr}"
    );
}
