//! Loopback ports for servers a test starts as separate processes
//! (etcd, kube-apiserver, ztunnel's admin listeners), which take a port
//! number rather than a bound socket.
//!
//! A port handed out by binding port 0 comes from the kernel's ephemeral
//! range, the same range every outgoing connection on the machine draws
//! its source port from. Between the probe and the server's own bind, a
//! connection made by another test can take it, and the server then fails
//! with "address already in use". The ports here come from below that
//! range, where only listeners bind, and a process never hands out the
//! same one twice.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// Lowest port handed out.
const FLOOR: u32 = 10_000;

/// Next candidate offset into the range; starts at a place that depends on
/// the process, so two test binaries run side by side rarely probe the
/// same ports.
static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);

/// A port on 127.0.0.1 that nobody listens on now, outside the kernel's
/// ephemeral range, and not handed out before by this process.
pub fn unused_loopback_port() -> io::Result<SocketAddr> {
    let ceiling = ephemeral_floor().unwrap_or(32_768);
    if ceiling <= FLOOR + 100 {
        // The ephemeral range covers nearly everything: fall back to the
        // kernel's choice.
        return TcpListener::bind("127.0.0.1:0")?.local_addr();
    }
    let span = ceiling - FLOOR;
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(2_654_435_761) % span,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::SeqCst) % span;
        let Ok(port) = u16::try_from(FLOOR + offset) else {
            continue;
        };
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        if TcpListener::bind(address).is_ok() {
            return Ok(address);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("every loopback port in {FLOOR}..{ceiling} is taken"),
    ))
}

/// The low end of `net.ipv4.ip_local_port_range`.
fn ephemeral_floor() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_listenable_and_below_the_ephemeral_range() {
        let ceiling = ephemeral_floor().unwrap_or(32_768);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..50 {
            let address = unused_loopback_port().unwrap();
            assert!(seen.insert(address.port()), "{address} handed out twice");
            if ceiling > FLOOR + 100 {
                assert!(u32::from(address.port()) < ceiling, "{address}");
            }
            TcpListener::bind(address).unwrap();
        }
    }
}
