#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! TCP keepalive on the sockets ztunnel makes inside a pod's network
//! namespace (shared mode), as the kernel reports them (`ss -o`): the
//! tunnel dialled to 15008 and accepted there, and the dials to the
//! application (after 15008 and after 15006), each with the configured
//! `KEEPALIVE_TIME`. The
//! socket options themselves are tested in `socket.rs`; this checks that
//! every in-pod path goes through them. Needs root, `ip`, `iptables`,
//! `ss` and containernetworking-plugins; skips with the reason otherwise.

use std::net::SocketAddr;

use ztunnel_test_support::cluster::Cluster;
use ztunnel_test_support::skip::skip;

use support::{APP_PORT, HBONE_PORT, eventually, hold, logs, one_node};

#[path = "support/cluster.rs"]
mod support;

/// The idle time the test's ztunnel runs with: distinct from Istio's 180 s
/// and from the kernel's 7200 s, so the timers in `ss` can only be ours.
const KEEPALIVE_SECS: u64 = 47;

/// The established connections in `pod` whose local port is `port`, as
/// `ss -t -n -o` prints them.
fn sockets_on(cluster: &Cluster, pod: &str, filter: &str) -> Vec<String> {
    let output = cluster
        .pod(pod)
        .unwrap()
        .ns
        .exec(&["ss", "-H", "-t", "-n", "-o", "state", "established", filter])
        .unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The seconds left on a line's keepalive timer, if it has one:
/// `timer:(keepalive,46sec,0)`.
fn keepalive_left(line: &str) -> Option<u64> {
    let rest = line.split("timer:(keepalive,").nth(1)?;
    let (left, _) = rest.split_once(',')?;
    let seconds = left.strip_suffix("sec")?;
    // `1min2sec` for longer timers: never ours, so not parsed.
    seconds.parse().ok()
}

/// Whether every line has a keepalive timer of at most [`KEEPALIVE_SECS`].
fn all_ours(lines: &[String]) -> bool {
    !lines.is_empty()
        && lines
            .iter()
            .all(|line| keepalive_left(line).is_some_and(|left| left <= KEEPALIVE_SECS))
}

#[test]
fn in_pod_connections_accepted_and_dialled_carry_the_configured_keepalive() {
    if std::process::Command::new("ss").arg("-V").output().is_err() {
        skip("no `ss` (apt-get install iproute2)");
        return;
    }
    let secs = format!("{KEEPALIVE_SECS}s");
    let Some(cluster) = one_node(
        "the in-pod keepalive test",
        &[
            ("KEEPALIVE_TIME", secs.as_str()),
            // Over HBONE between the node's two meshed pods, as between
            // two nodes, so that 15008 carries the connection.
            ("SAME_NODE_SHORTCUT", "false"),
        ],
    ) else {
        return;
    };
    let server = SocketAddr::from((cluster.pod("server").unwrap().ip, APP_PORT));
    let _through_hbone = hold(&cluster, "client", server);
    let _plaintext = hold(&cluster, "outsider", server);

    // In the server's pod: ztunnel's end of the tunnel on 15008, and its
    // two dials to the application (their peer port is 8080). A captured
    // connection accepted on 15006 keeps the application's port as its
    // local one, beside the application's own accepted sockets, so `ss`
    // cannot tell it apart; its listener is made by the same function as
    // 15008's.
    let accepted_hbone = format!("( sport = :{HBONE_PORT} )");
    let dials = format!("( dport = :{APP_PORT} )");
    let checks = [
        ("the tunnel accepted on 15008", accepted_hbone.as_str(), 1),
        ("the dials to the application", dials.as_str(), 2),
    ];
    for (what, filter, count) in checks {
        let mut lines = Vec::new();
        let found = eventually(|| {
            lines = sockets_on(&cluster, "server", filter);
            lines.len() >= count && all_ours(&lines)
        });
        assert!(found, "{what}: {lines:#?}\n{}", logs(&cluster));
    }
    // The client's own pod: ztunnel's dial of the tunnel to 15008.
    let tunnel = format!("( dport = :{HBONE_PORT} )");
    let lines = sockets_on(&cluster, "client", &tunnel);
    assert!(all_ours(&lines), "the tunnel dialled to 15008: {lines:#?}");
}
