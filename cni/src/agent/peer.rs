//! Who may talk to the agent over its two unix sockets (plugin events and
//! ZDS), judged by the uid the kernel records for the connecting process
//! (`SO_PEERCRED`), beside the sockets' owner-only mode (`socket_file.rs`).
//!
//! In Istio's charts and ours, the agent, ztunnel and the plugin (run by
//! the container runtime) are all root, so by default only uid 0 is
//! admitted, and the agent's own uid, so that an agent and its peers run
//! by one unprivileged user (a developer's machine, a test) still work.
//! A ZDS peer hands the agent nothing, but the agent hands it a handle on
//! every pod's network namespace; a plugin-event peer can put any pod of
//! the node in the mesh. The mode alone keeps other users out only while
//! the file keeps its mode and its directory keeps other users from
//! replacing it; this check holds whatever the filesystem says.

use std::collections::BTreeSet;
use std::os::fd::AsFd;

use nix::sys::socket::{getsockopt, sockopt};

/// Which peers a socket serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerPolicy {
    /// Peers running as one of these uids.
    Uids(BTreeSet<u32>),
    /// Any peer the socket file's mode lets connect.
    Any,
}

impl PeerPolicy {
    /// Root, the agent's own effective uid, and `more`.
    pub fn root_and_own_uid(more: impl IntoIterator<Item = u32>) -> PeerPolicy {
        let mut uids: BTreeSet<u32> = more.into_iter().collect();
        uids.insert(0);
        uids.insert(nix::unistd::geteuid().as_raw());
        PeerPolicy::Uids(uids)
    }

    /// Whether a peer running as `uid` is served.
    pub fn admits(&self, uid: u32) -> bool {
        match self {
            PeerPolicy::Uids(uids) => uids.contains(&uid),
            PeerPolicy::Any => true,
        }
    }

    /// Checks the peer of a connected unix socket; returns its uid.
    pub fn check(&self, socket: &impl AsFd) -> Result<u32, PeerRefused> {
        let credentials = getsockopt(socket, sockopt::PeerCredentials)
            .map_err(|errno| PeerRefused::Credentials(errno.into()))?;
        let uid = credentials.uid();
        if self.admits(uid) {
            Ok(uid)
        } else {
            Err(PeerRefused::Uid(uid))
        }
    }
}

impl Default for PeerPolicy {
    /// Root and the agent's own uid.
    fn default() -> Self {
        PeerPolicy::root_and_own_uid([])
    }
}

/// Why a connection was closed before it was served.
#[derive(Debug, thiserror::Error)]
pub enum PeerRefused {
    /// The peer runs as a uid the policy does not admit.
    #[error("peer uid {0} is not admitted (--peer-uid admits more)")]
    Uid(u32),
    /// The kernel did not say who the peer is.
    #[error("reading the peer's credentials")]
    Credentials(#[source] std::io::Error),
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use super::*;

    #[test]
    fn only_the_admitted_uids_are_served() {
        let own = nix::unistd::geteuid().as_raw();
        let default = PeerPolicy::default();
        let widened = PeerPolicy::root_and_own_uid([1337]);
        // (reason, policy, uid, admitted)
        #[rustfmt::skip]
        let cases = [
            ("root, as the charts run every peer", &default, 0, true),
            ("the agent's own user", &default, own, true),
            ("any other user", &default, 65534, own == 65534),
            ("a uid given with --peer-uid", &widened, 1337, true),
            ("root stays admitted when uids are added", &widened, 0, true),
            ("--any-peer", &PeerPolicy::Any, 65534, true),
        ];
        for (reason, policy, uid, admitted) in cases {
            assert_eq!(policy.admits(uid), admitted, "{reason}");
        }
    }

    #[test]
    fn the_peer_is_the_process_at_the_other_end() {
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let own = nix::unistd::geteuid().as_raw();
        assert_eq!(PeerPolicy::default().check(&ours).unwrap(), own);
        let others = PeerPolicy::Uids(BTreeSet::from([own.wrapping_add(1)]));
        assert!(matches!(others.check(&ours), Err(PeerRefused::Uid(uid)) if uid == own));
    }
}
