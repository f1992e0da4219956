#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! ztunnel's side of the ZDS socket's trust: it connects only to a socket
//! that root or its own uid serves (issue 28). Kept apart from `zds.rs`,
//! whose tests play the agent's protocol.

use std::os::fd::AsRawFd;
use std::time::Duration;

use nix::sys::socket::{AddressFamily, SockFlag, SockType};
use ztunnel_proxy::inpod::zds::ZdsSocket;
use ztunnel_test_support::skip::skip;

/// How long the test waits for the other user's socket to listen.
const AGENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A socket at the agent's path that another user serves is never used:
/// ztunnel would take its word on which pods, identities and netns to
/// serve. The other user is a forked child dropped to uid 65534 that
/// binds and listens (needs root; skipped with a reason otherwise).
#[test]
fn a_socket_served_by_another_user_is_refused() {
    use nix::sys::signal::{Signal, kill};
    use nix::sys::socket::{UnixAddr, bind, listen, socket};
    use nix::unistd::{ForkResult, Gid, Uid, fork, pause, setgid, setgroups, setuid};
    use std::os::unix::fs::PermissionsExt;

    const OTHER_UID: u32 = 65534;
    if !Uid::effective().is_root() {
        skip(format_args!(
            "needs root to serve the socket as uid {OTHER_UID}"
        ));
        return;
    }
    let directory = tempfile::tempdir().unwrap();
    std::fs::set_permissions(directory.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let path = directory.path().join("ztunnel.sock");
    // Made before the fork: the child of a multi-threaded process must not
    // allocate.
    let address = UnixAddr::new(&path).unwrap();
    let groups = [Gid::from_raw(OTHER_UID)];
    let backlog = nix::sys::socket::Backlog::new(8).unwrap();
    // SAFETY: the child only makes system calls on data prepared above
    // and never returns: it pauses until killed, or leaves with `_exit`.
    let child = match unsafe { fork() }.unwrap() {
        ForkResult::Child => {
            let listening = setgroups(&groups).is_ok()
                && setgid(Gid::from_raw(OTHER_UID)).is_ok()
                && setuid(Uid::from_raw(OTHER_UID)).is_ok()
                && socket(
                    AddressFamily::Unix,
                    SockType::SeqPacket,
                    SockFlag::SOCK_CLOEXEC,
                    None,
                )
                .is_ok_and(|fd| {
                    let listens =
                        bind(fd.as_raw_fd(), &address).is_ok() && listen(&fd, backlog).is_ok();
                    // Keeps the socket open while paused.
                    std::mem::forget(fd);
                    listens
                });
            if listening {
                loop {
                    pause();
                }
            }
            // SAFETY: ends the child without running the parent's exit
            // handlers or destructors.
            unsafe { nix::libc::_exit(1) }
        }
        ForkResult::Parent { child } => child,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let deadline = std::time::Instant::now() + AGENT_TIMEOUT;
    let refused = loop {
        let connected = runtime.block_on(async { ZdsSocket::connect(&path) });
        match &connected {
            // Not bound yet, or bound and not listening yet.
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => break connected,
        }
    };
    kill(child, Signal::SIGKILL).unwrap();
    nix::sys::wait::waitpid(child, None).unwrap();
    let error = refused.expect_err("a socket served by uid 65534 is used");
    assert_eq!(
        error.kind(),
        std::io::ErrorKind::PermissionDenied,
        "{error}"
    );
}
