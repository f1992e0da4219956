#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! The connection bound (`MAX_CONNECTIONS`, `capacity.rs`) and each pod's
//! share of it on a running ztunnel: a pod outside the mesh floods a
//! meshed pod (`server`) with plaintext connections (15006) up to its
//! share; the next are closed at once, counted by listener, reason and
//! pod, and warned of once; the neighbours' connections and HBONE streams
//! go on meanwhile; silent connections to 15008 hold no slot at all; and
//! once the held connections close the pod is served again. Needs root,
//! `ip`, `iptables` and containernetworking-plugins; skips with the reason
//! otherwise.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ztunnel_test_support::cluster::Cluster;

use support::{
    APP_PORT, HBONE_PORT, PATIENCE, echoes, eventually, hold, logs, metric, one_node,
    one_node_with, open_silent,
};

#[path = "support/cluster.rs"]
mod support;

/// The bound the test's ztunnel runs with.
const LIMIT: usize = 24;
/// What each pod keeps of it.
const FLOOR: usize = 4;
/// Connections tried over a share.
const OVER: usize = 5;
/// Silent connections to 15008: more than the bound.
const SILENT: usize = 40;

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

/// What `pod` (namespace `default`) carries now.
fn carried_by(cluster: &Cluster, pod: &str) -> f64 {
    metric(
        cluster,
        "node-a",
        "ztunnel_pod_connections_carried",
        &[&format!("pod=\"{pod}\"")],
    )
}

/// The node's refusals on `listener` for `reason`.
fn refused(cluster: &Cluster, listener: &str, reason: &str) -> f64 {
    metric(
        cluster,
        "node-a",
        "ztunnel_connections_refused_total",
        &[
            &format!("listener=\"{listener}\""),
            &format!("reason=\"{reason}\""),
        ],
    )
}

/// `pod`'s refusals, for any reason.
fn refused_for(cluster: &Cluster, pod: &str) -> f64 {
    metric(
        cluster,
        "node-a",
        "ztunnel_pod_connections_refused_total",
        &[&format!("pod=\"{pod}\"")],
    )
}

#[test]
fn a_pod_at_its_share_leaves_its_neighbours_their_connections_and_streams() {
    let (limit, floor) = (LIMIT.to_string(), FLOOR.to_string());
    // Three meshed pods: the flooded server, and two neighbours talking
    // over HBONE (the shortcut off), so that their traffic takes slots on
    // every listener: client's on 15001, other's TLS connection on 15008
    // and its stream.
    let Some(cluster) = one_node_with(
        "the per-pod share test",
        &[
            ("MAX_CONNECTIONS", limit.as_str()),
            ("MIN_CONNECTIONS_PER_POD", floor.as_str()),
            ("SAME_NODE_SHORTCUT", "false"),
        ],
        &["other"],
    ) else {
        return;
    };
    let server = SocketAddr::from((cluster.pod("server").unwrap().ip, APP_PORT));
    let server_hbone = SocketAddr::from((cluster.pod("server").unwrap().ip, HBONE_PORT));

    // More silent connections on the server's 15008 than the node has
    // slots: a handshake not yet done holds none.
    let silent = open_silent(&cluster, "outsider", server_hbone, SILENT);
    let pending = || metric(&cluster, "node-a", "ztunnel_pending_handshakes", &[]);
    assert!(
        eventually(|| pending() == SILENT as f64),
        "pending: {}",
        pending()
    );
    assert_eq!(carried(&cluster), 0.0, "{}", logs(&cluster));
    assert!(echoes(&cluster, "client", "other"), "{}", logs(&cluster));
    drop(silent);
    // The neighbours' finished connection is given back; the client's
    // pooled TLS connection under it stays open on other's 15008, and
    // holds a slot there.
    let idle_but_pooled =
        || carried_by(&cluster, "client") == 0.0 && carried_by(&cluster, "other") == 1.0;
    assert!(eventually(idle_but_pooled), "{}", logs(&cluster));

    // Busy beside other, the server may hold half.
    let share = LIMIT / 2;
    let mut held = (0..share)
        .map(|_| hold(&cluster, "outsider", server))
        .collect::<Vec<_>>();
    assert!(
        eventually(|| carried_by(&cluster, "server") == share as f64),
        "server carries {}",
        carried_by(&cluster, "server")
    );
    for _ in 0..OVER {
        assert!(
            closed_unanswered(&cluster, "outsider", server),
            "a connection over the share was carried"
        );
    }
    assert_eq!(
        refused(&cluster, "inbound_plaintext", "pod_share"),
        OVER as f64,
        "{}",
        logs(&cluster)
    );
    assert_eq!(refused_for(&cluster, "server"), OVER as f64);
    let log = cluster.node("node-a").unwrap().ztunnel_log();
    assert_eq!(
        log.matches("the pod carries its share of the connection limit")
            .count(),
        1,
        "one warning for the episode:\n{}",
        logs(&cluster)
    );

    // The neighbours' connections and streams, both ways, and a plaintext
    // connection to one of them, go on.
    for (from, to) in [
        ("client", "other"),
        ("other", "client"),
        ("outsider", "client"),
    ] {
        assert!(
            echoes(&cluster, from, to),
            "{from} to {to}: {}",
            logs(&cluster)
        );
    }
    assert_eq!(
        refused_for(&cluster, "client") + refused_for(&cluster, "other"),
        0.0,
        "{}",
        logs(&cluster)
    );
    // What is refused is the server's: a tunnel to it finds its TLS
    // connection closed.
    assert!(!echoes(&cluster, "client", "server"), "{}", logs(&cluster));
    assert_eq!(
        refused(&cluster, "hbone", "pod_share"),
        1.0,
        "{}",
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
        eventually(|| carried_by(&cluster, "server") == 0.0),
        "server carries {}",
        carried_by(&cluster, "server")
    );
    for from in ["outsider", "client"] {
        assert!(
            eventually(|| echoes(&cluster, from, "server")),
            "{from}: {}",
            logs(&cluster)
        );
    }
    let log = cluster.node("node-a").unwrap().ztunnel_log();
    assert!(
        log.contains("admitting the pod's connections again"),
        "the end of the episode is logged:\n{}",
        logs(&cluster)
    );
}

#[test]
fn an_hbone_stream_beyond_the_pods_share_is_refused_with_its_own_count() {
    let (limit, floor) = (LIMIT.to_string(), FLOOR.to_string());
    let Some(cluster) = one_node(
        "the per-pod share test over HBONE",
        &[
            ("MAX_CONNECTIONS", limit.as_str()),
            ("MIN_CONNECTIONS_PER_POD", floor.as_str()),
            ("SAME_NODE_SHORTCUT", "false"),
        ],
    ) else {
        return;
    };
    let server = SocketAddr::from((cluster.pod("server").unwrap().ip, APP_PORT));
    // Once the client is busy too, each of the two gets half: the
    // server's TLS connection from the client takes the last of its half,
    // and the stream on it finds none.
    let half = LIMIT / 2;
    let mut held = (0..half - 1)
        .map(|_| hold(&cluster, "outsider", server))
        .collect::<Vec<_>>();
    assert!(!echoes(&cluster, "client", "server"), "{}", logs(&cluster));
    assert_eq!(
        refused(&cluster, "hbone_stream", "pod_share"),
        1.0,
        "{}",
        logs(&cluster)
    );
    assert_eq!(
        refused(&cluster, "outbound", "pod_share") + refused(&cluster, "hbone", "pod_share"),
        0.0
    );
    assert_eq!(refused_for(&cluster, "server"), 1.0);

    held.clear();
    assert!(
        eventually(|| echoes(&cluster, "client", "server")),
        "{}",
        logs(&cluster)
    );
}
