//! Fixed ports of the wire contract (WIRE.md §1) that more than one crate
//! names. Which address each proxy binds is the proxy's configuration.

/// The HBONE port: a ztunnel's inbound mTLS + HTTP/2 CONNECT listener in
/// each pod's netns, the port peers dial at `podIP:15008`, and the HBONE
/// port of a gateway or waypoint that names none. It is never redirected.
pub const HBONE_PORT: u16 = 15008;
