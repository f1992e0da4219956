//! The shared (in-pod) mode's settings: the node agent's ZDS socket, the
//! options of the listeners opened in each pod, whether IPv6 is on (which
//! dedicated mode reads too), and whether connections between two pods of
//! this node take the in-process shortcut and the kernel splice. Talking
//! ZDS and opening the pods' sockets is `inpod/`'s business.

use std::path::PathBuf;

use clap::ArgAction;

/// How the shared (in-pod) mode reaches the node agent and opens pod sockets
/// (WIRE.md §5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InpodSettings {
    /// The node agent's ZDS socket (SOCK_SEQPACKET) to connect to.
    pub uds: PathBuf,
    /// SO_REUSEPORT on in-pod listeners, so that an old and a new ztunnel can
    /// hold the same pod ports during a rollout.
    pub port_reuse: bool,
    /// IP_TRANSPARENT on in-pod listeners: `None` tries and carries on
    /// without it, `Some(true)` makes a failure fatal, `Some(false)` skips it.
    pub original_source: Option<bool>,
    /// Whether the wildcard address is the dual-stack `[::]` rather than
    /// `0.0.0.0`; in both modes, whether a hostname endpoint's AAAA
    /// records are looked up besides its A records.
    pub ipv6_enabled: bool,
    /// Whether a connection between two pods this proxy serves is handed
    /// from the client's outbound side to the server's inbound side in the
    /// process (policy, logs and metrics as over HBONE) instead of going
    /// through a TLS and HTTP/2 tunnel to the proxy's own 15008.
    pub same_node_shortcut: bool,
    /// Whether such a connection, once it has exchanged a few messages, is
    /// joined in the kernel (a BPF socket map) so that its bytes no longer
    /// pass through the proxy; where the kernel refuses, the proxy copies.
    pub same_node_splice: bool,
}

/// The flags and variables, flattened into the command line.
#[derive(Debug, clap::Args)]
pub(super) struct InpodArgs {
    /// Shared mode: the node agent's ZDS socket.
    #[arg(
        long,
        env = "INPOD_UDS",
        default_value = "/var/run/ztunnel/ztunnel.sock"
    )]
    inpod_uds: PathBuf,
    /// Shared mode: SO_REUSEPORT on the in-pod listeners.
    #[arg(long, env = "INPOD_PORT_REUSE", default_value_t = true, action = ArgAction::Set)]
    inpod_port_reuse: bool,
    /// Shared mode: IP_TRANSPARENT on the in-pod listeners, so the app sees
    /// the client's IP [default: best effort; true: required; false: off].
    #[arg(long, env = "ENABLE_ORIG_SRC", action = ArgAction::Set)]
    enable_orig_src: Option<bool>,
    /// Listen on the dual-stack `[::]` (true) or on `0.0.0.0` (false) in
    /// pods; look up AAAA records of hostname endpoints besides A (true) or
    /// A only (false).
    #[arg(long, env = "IPV6_ENABLED", default_value_t = true, action = ArgAction::Set)]
    ipv6_enabled: bool,
    /// Shared mode: connections between two pods of this node skip the
    /// HBONE tunnel and are handed to the destination's inbound side in the
    /// process (false: every meshed connection goes over HBONE).
    #[arg(long, env = "SAME_NODE_SHORTCUT", default_value_t = true, action = ArgAction::Set)]
    same_node_shortcut: bool,
    /// Same-node connections that keep exchanging messages are joined in
    /// the kernel with a BPF socket map, so that their bytes skip the
    /// proxy (false: the proxy copies every byte).
    #[arg(long, env = "SAME_NODE_SPLICE", default_value_t = true, action = ArgAction::Set)]
    same_node_splice: bool,
}

impl InpodArgs {
    /// The settings, as given.
    pub(super) fn parse(self) -> InpodSettings {
        InpodSettings {
            uds: self.inpod_uds,
            port_reuse: self.inpod_port_reuse,
            original_source: self.enable_orig_src,
            ipv6_enabled: self.ipv6_enabled,
            same_node_shortcut: self.same_node_shortcut,
            same_node_splice: self.same_node_splice,
        }
    }
}
