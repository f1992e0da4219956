//! The `pause` binary as a container runtime runs it: a stop signal ends it
//! with status 0, and as PID 1 of its own PID namespace it still stops on
//! SIGTERM and reaps the orphans the namespace hands it. The namespace test
//! needs root and unshare(1); it skips with the reason otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, geteuid};
use ztunnel_test_support::skip::skip;

/// How long anything here may take; every step takes milliseconds.
const LIMIT: Duration = Duration::from_secs(10);

/// How often conditions are polled.
const POLL: Duration = Duration::from_millis(10);

/// A child process killed when the test ends, pass or fail.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.0.id()).unwrap())
    }

    /// Waits for the exit, within [`LIMIT`].
    fn exit_status(&mut self) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < LIMIT, "the process did not exit");
            thread::sleep(POLL);
        }
    }
}

/// Polls `condition` until it holds, within [`LIMIT`].
fn wait_for<T>(what: &str, mut condition: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = condition() {
            return value;
        }
        assert!(start.elapsed() < LIMIT, "{what} did not happen");
        thread::sleep(POLL);
    }
}

/// Whether `pid` is ready for SIGINT, SIGTERM and SIGCHLD (before that, a
/// stop signal kills it): asleep in sigwait(2), which is where pause waits
/// for them. While it sleeps there the kernel shows the waited signals as
/// unblocked, so the blocked mask alone cannot tell.
fn waits_for_signals(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/wchan"))
        .is_ok_and(|wchan| wchan.contains("sigtimedwait"))
}

/// The PIDs of `pid`'s children, as the host sees them.
fn children(pid: Pid) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .map(|child| child.parse().unwrap())
        .collect()
}

fn pause() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pause"))
}

#[test]
fn a_stop_signal_ends_it_with_status_zero() {
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        let mut running = Running(pause().stderr(Stdio::null()).spawn().unwrap());
        let pid = running.pid();
        wait_for("waiting for signals", || {
            waits_for_signals(pid).then_some(())
        });
        // Still running: it sleeps until told to stop.
        thread::sleep(Duration::from_millis(50));
        assert!(running.0.try_wait().unwrap().is_none());
        kill(pid, signal).unwrap();
        let status = running.exit_status();
        assert_eq!(status.code(), Some(0), "{signal}: {status}");
    }
}

#[test]
fn version_prints_and_exits() {
    let output = pause().arg("-v").output().unwrap();
    assert!(output.status.success());
    assert!(
        String::from_utf8(output.stdout)
            .unwrap()
            .starts_with("pause ")
    );
}

#[test]
fn as_pid_1_it_reaps_orphans_and_stops_on_sigterm() {
    if !geteuid().is_root() {
        skip("a PID namespace needs root");
        return;
    }
    // unshare forks pause as PID 1 of a new PID namespace and exits with
    // its status.
    let mut unshare = Running(
        Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child", "--"])
            .arg(env!("CARGO_BIN_EXE_pause"))
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let unshare_pid = unshare.pid();
    let pause_pid = wait_for("pause starting", || {
        children(unshare_pid).first().map(|pid| Pid::from_raw(*pid))
    });
    wait_for("waiting for signals", || {
        waits_for_signals(pause_pid).then_some(())
    });

    // A shell in the namespace starts a sleep and exits: the sleep is
    // orphaned to pause, and exits soon after.
    let status = Command::new("nsenter")
        .args(["--target", &pause_pid.to_string(), "--pid", "--"])
        .args(["sh", "-c", "sleep 0.3 & exit 0"])
        .status()
        .unwrap();
    assert!(status.success(), "nsenter: {status}");
    let orphan = wait_for("the orphan reaching pause", || {
        children(pause_pid).first().copied()
    });
    wait_for("the orphan being reaped", || {
        (!children(pause_pid).contains(&orphan)).then_some(())
    });

    kill(pause_pid, Signal::SIGTERM).unwrap();
    let status = unshare.exit_status();
    assert_eq!(status.code(), Some(0), "{status}");
}
