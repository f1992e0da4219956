//! The proxy's own ports in each pod (WIRE.md §1), fixed by the capture
//! rules the node agent (ours or istio-cni) installs. The HBONE port, which
//! other crates name too, is `ztunnel_proto::ports::HBONE_PORT`. Which
//! address each listener binds is the configuration's business.

use ztunnel_proto::ports::HBONE_PORT;

/// Outbound capture: the pod's own connections are redirected here.
pub const OUTBOUND_PORT: u16 = 15001;

/// Inbound plaintext capture: connections to the pod that arrive without
/// HBONE are redirected here.
pub const INBOUND_PLAINTEXT_PORT: u16 = 15006;

/// The DNS proxy: the pod's queries to its resolver are redirected here.
pub const DNS_PORT: u16 = 15053;

/// SOCKS5, on the pod's 127.0.0.1 when `UNSTABLE_ENABLE_SOCKS5` is on:
/// nothing is redirected here; applications dial it.
pub const SOCKS5_PORT: u16 = 15080;

/// Ports a connection must never be sent back to: the proxy's own TCP
/// listeners, which would loop it into the proxy again.
pub const PROXY_PORTS: [u16; 3] = [OUTBOUND_PORT, INBOUND_PLAINTEXT_PORT, HBONE_PORT];
