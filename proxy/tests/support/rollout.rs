//! A ztunnel rollout on one node of the in-pod cluster, as a DaemonSet's
//! update makes it: a second ztunnel, with the first one's environment,
//! binds beside it in every pod (SO_REUSEPORT) before the first is sent
//! SIGTERM. Used by the shutdown tests (what the listeners carry) and the
//! DNS tests (what the DNS listeners hand over).

// Each test file uses its own part of this.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;
use ztunnel_test_support::cluster::Node;

/// The second ztunnel's admin address: it shares the node's namespace
/// with the first, which holds the usual ports.
pub const SECOND_ADMIN: &str = "127.0.0.1:15100";
/// The second ztunnel's stats address, for the same reason.
pub const SECOND_STATS: &str = "[::]:15120";
/// The second ztunnel's readiness port, for the same reason.
pub const SECOND_READINESS_PORT: u16 = 15121;

/// The second ztunnel; killed on drop, by its own handle.
pub struct Beside {
    child: Child,
    log: PathBuf,
}

impl Beside {
    /// Starts a second ztunnel on `node` with the environment of the one
    /// running there, as a DaemonSet's new pod has the old one's spec; only
    /// its own ports differ, and it logs to `log`.
    pub fn start(node: &Node, log: &Path) -> Beside {
        let running = node.ztunnel_pid().unwrap();
        let environ = std::fs::read(format!("/proc/{running}/environ")).unwrap();
        let env = environ
            .split(|byte| *byte == 0)
            .filter_map(|pair| std::str::from_utf8(pair).ok()?.split_once('='));
        let file = std::fs::File::create(log).unwrap();
        let child = node
            .ns
            .command(env!("CARGO_BIN_EXE_ztunnel"))
            .env_clear()
            .envs(env)
            .env("ZTUNNEL_ADMIN_ADDR", SECOND_ADMIN)
            .env("ZTUNNEL_STATS_ADDR", SECOND_STATS)
            .env(
                "ZTUNNEL_READINESS_ADDR",
                format!("[::]:{SECOND_READINESS_PORT}"),
            )
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Beside {
            child,
            log: log.to_owned(),
        }
    }

    /// Its process id.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether it reports ready.
    pub fn ready(&self, node: &Node) -> bool {
        matches!(
            node.http_get(SECOND_READINESS_PORT, "/healthz/ready"),
            Ok((200, _))
        )
    }
}

impl Drop for Beside {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How the child `pid` exited, without reaping it (its owner does), or
/// `None` while it runs.
pub fn exit_code(pid: i32) -> Option<i32> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::Pid(Pid::from_raw(pid)), flags).unwrap() {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, signal, _) => Some(128 + signal as i32),
        _ => None,
    }
}
