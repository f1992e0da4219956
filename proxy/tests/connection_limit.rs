#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! The process-wide connection bound (`MAX_CONNECTIONS`, `capacity.rs`) on
//! a running ztunnel: a pod outside the mesh holds every slot with
//! plaintext connections to a meshed pod (15006), the next connection is
//! closed at once and counted by listener, the log warns once for the
//! episode, and once the held connections close the proxy carries traffic
//! again. Needs root, `ip`, `iptables` and containernetworking-plugins;
//! skips with the reason otherwise.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ztunnel_test_support::cluster::Cluster;

use support::{APP_PORT, PATIENCE, echoes, eventually, hold, logs, metric, one_node};

#[path = "support/cluster.rs"]
mod support;

/// The bound the test's ztunnel runs with.
const LIMIT: usize = 24;
/// Connections tried over the bound.
const OVER: usize = 5;

/// Whether a new connection from `pod` to `target` is closed without an
/// answer to what it sends.
fn closed_unanswered(cluster: &Cluster, pod: &str, target: SocketAddr) -> bool {
    let pod = cluster.pod(pod).unwrap();
    pod.ns
        .run(move || {
            // The kernel completes the handshake before the proxy accepts:
            // the refusal is the close that follows.
            let Ok(mut stream) = TcpStream::connect_timeout(&target, Duration::from_secs(3)) else {
                return true;
            };
            stream.set_read_timeout(Some(PATIENCE)).unwrap();
            let _ = stream.write_all(b"over");
            let mut reply = [0u8; 4];
            matches!(stream.read(&mut reply), Ok(0) | Err(_))
        })
        .unwrap()
}

fn carried(cluster: &Cluster) -> f64 {
    metric(cluster, "node-a", "ztunnel_connections_carried", &[])
}

#[test]
fn beyond_max_connections_new_connections_are_closed_counted_and_served_again_once_some_close() {
    let limit = LIMIT.to_string();
    let Some(cluster) = one_node(
        "the connection limit test",
        &[("MAX_CONNECTIONS", limit.as_str())],
    ) else {
        return;
    };
    let server = SocketAddr::from((cluster.pod("server").unwrap().ip, APP_PORT));
    assert_eq!(
        metric(&cluster, "node-a", "ztunnel_connection_limit", &[]),
        LIMIT as f64
    );
    let mut held = (0..LIMIT)
        .map(|_| hold(&cluster, "outsider", server))
        .collect::<Vec<_>>();
    assert!(
        eventually(|| carried(&cluster) == LIMIT as f64),
        "carried: {}",
        carried(&cluster)
    );

    for _ in 0..OVER {
        assert!(
            closed_unanswered(&cluster, "outsider", server),
            "a connection over the bound was carried"
        );
    }
    let refused = metric(
        &cluster,
        "node-a",
        "ztunnel_connections_refused_total",
        &["listener=\"inbound_plaintext\""],
    );
    assert_eq!(refused, OVER as f64, "{}", logs(&cluster));
    let log = cluster.node("node-a").unwrap().ztunnel_log();
    assert_eq!(
        log.matches("the proxy carries its most connections")
            .count(),
        1,
        "one warning for the episode:\n{}",
        logs(&cluster)
    );
    // The held connections are still carried.
    for stream in &mut held {
        stream.write_all(b"more").unwrap();
        let mut reply = [0u8; 4];
        stream.read_exact(&mut reply).unwrap();
        assert_eq!(&reply, b"more");
    }

    held.clear();
    assert!(
        eventually(|| carried(&cluster) == 0.0),
        "carried: {}",
        carried(&cluster)
    );
    assert!(
        eventually(|| echoes(&cluster, "outsider", "server")),
        "{}",
        logs(&cluster)
    );
    assert!(
        eventually(|| echoes(&cluster, "client", "server")),
        "{}",
        logs(&cluster)
    );
    let log = cluster.node("node-a").unwrap().ztunnel_log();
    assert!(
        log.contains("admitting connections again"),
        "the end of the episode is logged:\n{}",
        logs(&cluster)
    );
}

#[test]
fn an_hbone_stream_beyond_max_connections_is_refused_with_its_own_count() {
    let limit = LIMIT.to_string();
    // Between two pods of the node over HBONE, as between two nodes: the
    // client's connection on 15001, the tunnel's TLS connection on 15008
    // and its CONNECT stream each hold a slot.
    let Some(cluster) = one_node(
        "the connection limit test over HBONE",
        &[
            ("MAX_CONNECTIONS", limit.as_str()),
            ("SAME_NODE_SHORTCUT", "false"),
        ],
    ) else {
        return;
    };
    let server = SocketAddr::from((cluster.pod("server").unwrap().ip, APP_PORT));
    // Two slots left: the client's connection and the tunnel's TLS
    // connection take them, and the stream finds none.
    let mut held = (0..LIMIT - 2)
        .map(|_| hold(&cluster, "outsider", server))
        .collect::<Vec<_>>();
    assert!(!echoes(&cluster, "client", "server"), "{}", logs(&cluster));
    let refused = |listener: &str| {
        metric(
            &cluster,
            "node-a",
            "ztunnel_connections_refused_total",
            &[&format!("listener=\"{listener}\"")],
        )
    };
    assert_eq!(refused("hbone_stream"), 1.0, "{}", logs(&cluster));
    assert_eq!(refused("outbound") + refused("hbone"), 0.0);

    held.clear();
    assert!(
        eventually(|| echoes(&cluster, "client", "server")),
        "{}",
        logs(&cluster)
    );
}
