//! The node agent's local files as another local user meets them: both
//! sockets and `pods.json` are owner-only (0600) even under umask 0, a
//! process of another uid cannot connect, and when an operator opens a
//! socket's mode it is still closed unanswered unless `--peer-uid` admits
//! it. The other user is a child forked from this test that drops to
//! [`OTHER_UID`] (needs root; skipped with a reason otherwise).
//!
//! Every test in this binary sets the umask to 0 first: the umask is
//! process-wide, so the tests that want it share a binary of their own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::socket::{
    AddressFamily, MsgFlags, SockFlag, SockType, UnixAddr, connect, recv, send, setsockopt, socket,
    sockopt,
};
use nix::sys::stat::{Mode, umask};
use nix::sys::time::{TimeVal, TimeValLike};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Gid, Uid, fork, setgid, setgroups, setuid};
use ztunnel_cni::agent::AgentConfig;
use ztunnel_cni::agent::peer::PeerPolicy;
use ztunnel_cni::agent::pods::{PodRecord, PodSet, PodStore};
use ztunnel_test_support::skip::skip;

#[path = "support/running_agent.rs"]
mod running_agent;

use running_agent::Agent;

/// The other local user: `nobody` on most systems.
const OTHER_UID: u32 = 65534;
/// ZDS hello, `ZdsHello{version: V1}`: the agent answers it with
/// `snapshot_sent` when its pod set is empty.
const ZDS_HELLO: &[u8] = &[0x08, 0x01];
/// A request the plugin-event server answers (404: no such pod).
const HTTP_REQUEST: &[u8] = b"GET /pods/shop/web-0 HTTP/1.1\r\nHost: unix\r\n\r\n";

/// What the other user's client met, as its exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Met {
    /// `connect` was refused for lack of permission.
    PermissionDenied = 10,
    /// Connected, then closed by the agent without a byte.
    ClosedUnanswered = 11,
    /// Connected and answered.
    Answered = 12,
    /// Connected, and nothing came within the timeout.
    Silence = 13,
    /// Dropping to the other uid, or a socket call, failed.
    ClientFailed = 14,
}

macro_rules! skip_unless_root {
    () => {
        if !Uid::effective().is_root() {
            skip(format_args!(
                "needs root to run a client as uid {OTHER_UID}"
            ));
            return;
        }
    };
}

fn permissive_umask() {
    umask(Mode::empty());
}

/// An agent with an empty pod registry, its sockets and state under `dir`.
fn start_agent(dir: &Path, peers: PeerPolicy) -> Agent {
    std::fs::write(dir.join("pods.yaml"), "[]\n").unwrap();
    let mut config = AgentConfig::with_registry(dir.join("pods.yaml"));
    config.plugin_socket = plugin_socket(dir);
    config.zds_socket = zds_socket(dir);
    config.state_dir = dir.join("state");
    config.peers = peers;
    Agent::start(config)
}

fn plugin_socket(dir: &Path) -> PathBuf {
    dir.join("run/pluginevent.sock")
}

fn zds_socket(dir: &Path) -> PathBuf {
    dir.join("ztunnel/ztunnel.sock")
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// Lets every local user reach a socket, as an operator might by mistake.
fn open_mode(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
}

/// Lets every local user through the test's directory (tempfile makes it
/// 0700), so that what stops the other user is the socket itself.
fn traversable(dir: &Path) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Connects to `path` as this process's user, sends `request` and says
/// what came back.
fn client(path: &Path, kind: SockType, request: &[u8]) -> Met {
    let address = UnixAddr::new(path).unwrap();
    exchange(&address, kind, request)
}

/// The same from a forked child running as [`OTHER_UID`].
fn client_as_other_user(path: &Path, kind: SockType, request: &[u8]) -> Met {
    // Everything the child needs is made before the fork: after it, the
    // child of a multi-threaded process must not allocate.
    let address = UnixAddr::new(path).unwrap();
    let groups = [Gid::from_raw(OTHER_UID)];
    // SAFETY: the child only makes system calls (setgroups, setgid, setuid,
    // socket, connect, send, recv) on data prepared above, and leaves with
    // `_exit`, so nothing another thread held at the fork is touched.
    match unsafe { fork() }.unwrap() {
        ForkResult::Child => {
            let met = if setgroups(&groups).is_ok()
                && setgid(Gid::from_raw(OTHER_UID)).is_ok()
                && setuid(Uid::from_raw(OTHER_UID)).is_ok()
            {
                exchange(&address, kind, request)
            } else {
                Met::ClientFailed
            };
            // SAFETY: ends the child without running the parent's exit
            // handlers or destructors.
            unsafe { nix::libc::_exit(met as i32) }
        }
        ForkResult::Parent { child } => match waitpid(child, None).unwrap() {
            WaitStatus::Exited(_, code) => [
                Met::PermissionDenied,
                Met::ClosedUnanswered,
                Met::Answered,
                Met::Silence,
                Met::ClientFailed,
            ]
            .into_iter()
            .find(|met| *met as i32 == code)
            .unwrap_or_else(|| panic!("client exited {code}")),
            other => panic!("client ended {other:?}"),
        },
    }
}

/// One connection: connect, send, read the first answer. Only system
/// calls, so that a forked child may run it.
fn exchange(address: &UnixAddr, kind: SockType, request: &[u8]) -> Met {
    let Ok(fd) = socket(AddressFamily::Unix, kind, SockFlag::SOCK_CLOEXEC, None) else {
        return Met::ClientFailed;
    };
    match connect(fd.as_raw_fd(), address) {
        Ok(()) => {}
        Err(Errno::EACCES) => return Met::PermissionDenied,
        Err(_) => return Met::ClientFailed,
    }
    if setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::seconds(5)).is_err() {
        return Met::ClientFailed;
    }
    // A send to a connection the agent has already closed fails; the read
    // below tells what happened either way.
    let _ = send(fd.as_raw_fd(), request, MsgFlags::MSG_NOSIGNAL);
    let mut buf = [0u8; 64];
    match recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()) {
        Ok(0) | Err(Errno::ECONNRESET) => Met::ClosedUnanswered,
        Ok(_) => Met::Answered,
        Err(Errno::EAGAIN) => Met::Silence,
        Err(_) => Met::ClientFailed,
    }
}

#[test]
fn under_umask_0_both_sockets_are_owner_only_and_serve_the_agents_user() {
    permissive_umask();
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(dir.path(), PeerPolicy::default());
    for socket in [plugin_socket(dir.path()), zds_socket(dir.path())] {
        assert_eq!(mode(&socket), 0o600, "{}", socket.display());
    }
    assert_eq!(
        client(&plugin_socket(dir.path()), SockType::Stream, HTTP_REQUEST),
        Met::Answered
    );
    assert_eq!(
        client(&zds_socket(dir.path()), SockType::SeqPacket, ZDS_HELLO),
        Met::Answered
    );
    agent.stop();
}

#[test]
fn under_umask_0_the_pod_set_is_written_owner_only() {
    permissive_umask();
    let dir = tempfile::tempdir().unwrap();
    let store = PodStore::open(dir.path()).unwrap();
    // A file an earlier agent left readable is replaced, not kept.
    std::fs::write(store.path(), b"[]").unwrap();
    std::fs::set_permissions(store.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut pods = PodSet::default();
    pods.insert(PodRecord {
        uid: "uid-web-0".into(),
        name: "web-0".into(),
        namespace: "shop".into(),
        service_account: "web".into(),
        netns: "/var/run/netns/web-0".into(),
        netns_inode: None,
        ips: vec!["10.0.0.5".parse().unwrap()],
        dns_capture: None,
    });
    store.save(&pods).unwrap();
    assert_eq!(mode(store.path()), 0o600);
    assert_eq!(store.load().unwrap(), pods);
}

#[test]
fn another_user_cannot_connect_to_either_socket() {
    permissive_umask();
    skip_unless_root!();
    let dir = tempfile::tempdir().unwrap();
    let agent = start_agent(dir.path(), PeerPolicy::default());
    traversable(dir.path());
    let plugin = client_as_other_user(&plugin_socket(dir.path()), SockType::Stream, HTTP_REQUEST);
    let zds = client_as_other_user(&zds_socket(dir.path()), SockType::SeqPacket, ZDS_HELLO);
    assert_eq!(
        (plugin, zds),
        (Met::PermissionDenied, Met::PermissionDenied)
    );
    agent.stop();
}

#[test]
fn another_user_let_in_by_the_mode_is_closed_unanswered_unless_admitted() {
    permissive_umask();
    skip_unless_root!();
    // (peers, what the other user meets on each socket)
    let cases = [
        (PeerPolicy::default(), Met::ClosedUnanswered),
        (PeerPolicy::root_and_own_uid([OTHER_UID]), Met::Answered),
        (PeerPolicy::Any, Met::Answered),
    ];
    for (peers, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let agent = start_agent(dir.path(), peers.clone());
        traversable(dir.path());
        for socket in [plugin_socket(dir.path()), zds_socket(dir.path())] {
            open_mode(&socket);
        }
        let plugin =
            client_as_other_user(&plugin_socket(dir.path()), SockType::Stream, HTTP_REQUEST);
        let zds = client_as_other_user(&zds_socket(dir.path()), SockType::SeqPacket, ZDS_HELLO);
        assert_eq!((plugin, zds), (want, want), "{peers:?}");
        // The agent's own user is served all along.
        assert_eq!(
            client(&plugin_socket(dir.path()), SockType::Stream, HTTP_REQUEST),
            Met::Answered
        );
        agent.stop();
    }
}
