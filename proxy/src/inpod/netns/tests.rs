//! The one path that ends the process: a runtime thread that cannot
//! return from a pod's namespace aborts rather than carry on inside it.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use super::*;

/// Set in the child this test starts, which takes the abort path.
const CHILD: &str = "ZTUNNEL_NETNS_ABORT_CHILD";

/// What the child logs before it aborts.
const LOGGED: &str = "cannot return to ztunnel's own network namespace; aborting";

#[test]
fn a_thread_that_cannot_leave_a_pod_aborts_the_process() {
    if std::env::var_os(CHILD).is_some() {
        take_the_abort_path();
    }
    if !nix::unistd::geteuid().is_root() {
        ztunnel_test_support::skip::skip("entering a network namespace (setns) needs root");
        return;
    }
    let output = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "inpod::netns::tests::a_thread_that_cannot_leave_a_pod_aborts_the_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.signal(),
        Some(nix::libc::SIGABRT),
        "the child must abort: {:?}\n{stderr}",
        output.status
    );
    assert!(
        stderr.contains(LOGGED),
        "the abort is logged first:\n{stderr}"
    );
}

/// Enters a namespace (our own: the way in works) with a "home" that is
/// not a namespace, so that the way back fails; never returns.
fn take_the_abort_path() -> ! {
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let own = OwnedFd::from(File::open("/proc/thread-self/ns/net").unwrap());
    let pod = PodNetns::new(&own).unwrap();
    let not_a_namespace = HostNetns {
        fd: Arc::new(OwnedFd::from(File::open("/dev/null").unwrap())),
    };
    let _ = pod.run_here(&not_a_namespace, || ());
    unreachable!("run_here returned with its thread outside ztunnel's namespace");
}
