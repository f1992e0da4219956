#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! Shutdown as kubelet drives it (AMBIENT.md §7): SIGTERM starts a drain
//! in which the listeners close at once and open connections carry on,
//! until they end or the drain deadline forces them closed; then the
//! process exits.
//!
//! The dedicated-mode tests run two `ztunnel` processes on the two-node
//! mesh of `support/mesh.rs`, each connection a real tunnel: client →
//! outbound 15001 → HBONE → inbound 15008 → echo. The shared-mode tests run
//! on one node of the in-pod cluster of `support/cluster.rs`: what the pod
//! listeners carry, and a rollout, in which a second ztunnel binds beside
//! the first in every pod (SO_REUSEPORT) before the first is stopped.
//! Needs root, `ip`, `ss`, `iptables` and containernetworking-plugins;
//! skips with the reason otherwise.

use std::collections::BTreeSet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::libc;
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{getsockopt, sockopt};
use nix::unistd::Pid;
use ztunnel_test_support::cluster::{Cluster, closed_by_peer, still_echoes, tail};

use mesh::{Mesh, SERVER_IP};
use rollout::{Beside, exit_code};
use support::{app, eventually, one_node};

#[path = "support/mesh.rs"]
mod mesh;
#[path = "support/rollout.rs"]
mod rollout;
#[path = "support/cluster.rs"]
mod support;

/// The bound on "it did exit": generous, for a loaded machine; a passing
/// test waits for the drain deadline at most.
const EXIT_WITHIN: Duration = Duration::from_secs(30);
/// A drain deadline no passing test reaches: a drain that ends ended
/// because its connections did.
const LONG_DEADLINE: &str = "120s";
/// A drain deadline a test waits out.
const SHORT_DEADLINE: &str = "2s";
/// The in-pod capture listeners: outbound, inbound plaintext, inbound HBONE.
const POD_PORTS: [u16; 3] = [15001, 15006, 15008];
/// The shared mode's default packet mark (WIRE.md §1).
const PACKET_MARK: u32 = 1337;
/// The mesh's two proxies: the client's, then the server's.
const PROXIES: [&str; 2] = ["client", "server"];

/// The echo application's address on node b, through the tunnel.
fn echo_target() -> String {
    format!("{SERVER_IP}:8080")
}

/// The outcome a proxy's log gives for its drain (`Graceful`, `Forced`).
fn drain_outcome(log: &str) -> Option<String> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|entry| entry["message"] == "drain finished")
        .and_then(|entry| entry["outcome"].as_str().map(str::to_owned))
}

/// Whether a proxy's log says it took SIGTERM and started draining.
fn draining(log: &str) -> bool {
    log.contains("SIGTERM: draining")
}

/// SIGTERM to the proxies of `workloads`; waits until each has started
/// draining.
fn terminate(mesh: &mut Mesh, workloads: &[&str]) {
    for workload in workloads {
        mesh.ztunnel(workload).terminate();
    }
    for workload in workloads {
        assert!(
            eventually(|| draining(&mesh.log(workload))),
            "{workload}'s proxy took SIGTERM:\n{}",
            tail(&mesh.log(workload), 20)
        );
    }
}

/// Asserts that the proxies of `workloads` exit with success within
/// [`EXIT_WITHIN`] and that their drains ended as `outcome`.
fn assert_exit(mesh: &mut Mesh, workloads: &[&str], outcome: &str) {
    for workload in workloads {
        let status = mesh.ztunnel(workload).exit_within(EXIT_WITHIN);
        let log = mesh.log(workload);
        assert!(
            status.is_some_and(|status| status.success()),
            "{workload}'s proxy exits with success, not {status:?}:\n{}",
            tail(&log, 20)
        );
        assert_eq!(
            drain_outcome(&log).as_deref(),
            Some(outcome),
            "{workload}'s drain:\n{}",
            tail(&log, 20)
        );
    }
}

#[test]
fn sigterm_without_connections_stops_both_proxies_with_success() {
    let Some(mut mesh) = Mesh::start("shutdown_lifecycle", "") else {
        return;
    };
    terminate(&mut mesh, &PROXIES);
    assert_exit(&mut mesh, &PROXIES, "Graceful");
}

#[test]
fn an_open_connection_carries_on_through_the_drain_and_the_proxies_exit_once_it_closes() {
    let env = [("CONNECTION_TERMINATION_DEADLINE", LONG_DEADLINE)];
    let Some(mut mesh) = Mesh::start_with_env("shutdown_drain", "", &env) else {
        return;
    };
    let _peers = mesh.echo_server(&echo_target());
    let mut open = mesh.client_connect(&echo_target()).unwrap();
    assert!(still_echoes(&mut open));

    terminate(&mut mesh, &PROXIES);
    for workload in PROXIES {
        assert!(
            mesh.ztunnel(workload).0.try_wait().unwrap().is_none(),
            "{workload}'s proxy waits for the open connection"
        );
    }
    assert!(
        still_echoes(&mut open),
        "the open connection carries bytes both ways during the drain"
    );
    assert!(
        mesh.client_connect(&echo_target()).is_err(),
        "a new connection is refused: the client's listeners closed at once"
    );
    assert!(still_echoes(&mut open), "and carries on after the refusal");

    drop(open);
    assert_exit(&mut mesh, &PROXIES, "Graceful");
}

/// With a connection held open through both proxies, SIGTERM to the proxy
/// of `workload` alone: it closes the connection at the deadline and exits;
/// the other proxy runs on. One proxy at a time, since either one's forced
/// close ends the tunnel for the other, whose drain would then end
/// gracefully just before its own deadline.
fn held_connection_is_closed_at_the_deadline(test: &str, workload: &str) {
    let env = [("CONNECTION_TERMINATION_DEADLINE", SHORT_DEADLINE)];
    let Some(mut mesh) = Mesh::start_with_env(test, "", &env) else {
        return;
    };
    let _peers = mesh.echo_server(&echo_target());
    let mut open = mesh.client_connect(&echo_target()).unwrap();
    assert!(still_echoes(&mut open));

    terminate(&mut mesh, &[workload]);
    assert_exit(&mut mesh, &[workload], "Forced");
    assert!(
        closed_by_peer(&mut open, EXIT_WITHIN),
        "the held connection is closed"
    );
    let other = PROXIES.iter().find(|other| **other != workload).unwrap();
    assert!(
        mesh.ztunnel(other).0.try_wait().unwrap().is_none(),
        "{other}'s proxy, not terminated, runs on"
    );
}

#[test]
fn at_the_termination_deadline_the_client_side_proxy_closes_the_held_connection_and_exits() {
    held_connection_is_closed_at_the_deadline("shutdown_forced_drain_client", "client");
}

#[test]
fn at_the_termination_deadline_the_server_side_proxy_closes_the_held_connection_and_exits() {
    held_connection_is_closed_at_the_deadline("shutdown_forced_drain_server", "server");
}

/// One listening socket inside a pod, and the process and descriptor that
/// hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct PodListener {
    port: u16,
    pid: i32,
    fd: RawFd,
}

/// The TCP listeners on [`POD_PORTS`] inside `pod`, with their holders, as
/// `ss` finds them.
fn pod_listeners(cluster: &Cluster, pod: &str) -> Vec<PodListener> {
    let pod = cluster.pod(pod).unwrap();
    let output = pod.ns.exec(&["ss", "-H", "-t", "-l", "-n", "-p"]).unwrap();
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        // State, Recv-Q, Send-Q, local address, peer address, users.
        let Some(local) = line.split_whitespace().nth(3) else {
            continue;
        };
        let Some(port) = local.rsplit(':').next().and_then(|port| port.parse().ok()) else {
            continue;
        };
        if !POD_PORTS.contains(&port) {
            continue;
        }
        // `users:(("ztunnel",pid=12,fd=34),...)`
        for holder in line.split("pid=").skip(1) {
            let mut numbers = holder
                .split(|c: char| !c.is_ascii_digit())
                .filter(|number| !number.is_empty());
            let pid = numbers.next().unwrap().parse().unwrap();
            let fd = numbers.next().unwrap().parse().unwrap();
            found.push(PodListener { port, pid, fd });
        }
    }
    found.sort_unstable();
    found
}

/// The processes holding each of [`POD_PORTS`] in `pod`, one set a port.
fn holders(cluster: &Cluster, pod: &str) -> Vec<BTreeSet<i32>> {
    let listeners = pod_listeners(cluster, pod);
    POD_PORTS
        .iter()
        .map(|port| {
            listeners
                .iter()
                .filter(|listener| listener.port == *port)
                .map(|listener| listener.pid)
                .collect()
        })
        .collect()
}

/// A duplicate of another process's descriptor (pidfd_getfd(2); root
/// only), to read the options of a socket that process made.
fn duplicate(pid: i32, fd: RawFd) -> OwnedFd {
    let own = |raw: libc::c_long, call: &str| {
        assert!(raw >= 0, "{call}: {}", std::io::Error::last_os_error());
        // SAFETY: a descriptor the kernel just returned to this process;
        // nothing else owns it.
        unsafe { OwnedFd::from_raw_fd(RawFd::try_from(raw).unwrap()) }
    };
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // or -1; no memory is passed.
    let pidfd = own(
        unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) },
        "pidfd_open",
    );
    // SAFETY: pidfd_getfd takes a pidfd, a descriptor number in that
    // process and flags, and returns a new descriptor or -1; no memory is
    // passed, and `pidfd` stays open for the call.
    own(
        unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) },
        "pidfd_getfd",
    )
}

/// Asserts SO_REUSEPORT is `reuse_port` and SO_MARK is the shared mode's
/// on every in-pod listener of the client and server pods, read from the
/// sockets themselves.
fn assert_pod_listener_options(cluster: &Cluster, reuse_port: bool) {
    let ztunnel = cluster.node("node-a").unwrap().ztunnel_pid().unwrap();
    let ztunnel = i32::try_from(ztunnel).unwrap();
    for pod in ["client", "server"] {
        assert!(
            eventually(|| holders(cluster, pod) == vec![BTreeSet::from([ztunnel]); 3]),
            "ztunnel holds the three listeners of {pod}: {:?}",
            pod_listeners(cluster, pod)
        );
        for listener in pod_listeners(cluster, pod) {
            let socket = duplicate(listener.pid, listener.fd);
            assert_eq!(
                getsockopt(&socket, sockopt::ReusePort).unwrap(),
                reuse_port,
                "SO_REUSEPORT of {pod}'s {}",
                listener.port
            );
            assert_eq!(
                getsockopt(&socket, sockopt::Mark).unwrap(),
                PACKET_MARK,
                "SO_MARK of {pod}'s {}",
                listener.port
            );
        }
    }
}

#[test]
fn in_pod_listeners_carry_so_reuseport_unless_turned_off_and_always_the_mark() {
    let Some(mut cluster) = one_node("pod_listener_options", &[]) else {
        return;
    };
    assert_pod_listener_options(&cluster, true);

    cluster.set_ztunnel_env("INPOD_PORT_REUSE", "false");
    cluster.start_ztunnel("node-a").unwrap();
    cluster.node("node-a").unwrap().wait_ready().unwrap();
    assert_pod_listener_options(&cluster, false);
}

/// How many connections a ztunnel's JSON log reports as completed
/// outbound to `workload` without error.
fn completed_outbound_to(log: &str, workload: &str) -> usize {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| {
            entry["message"] == "connection complete"
                && entry["direction"] == "outbound"
                && entry["dst.workload"] == workload
                && entry.get("error").is_none()
        })
        .count()
}

#[test]
fn in_a_rollout_the_old_ztunnel_drains_its_connection_while_the_new_one_takes_every_new_one() {
    // Over HBONE to the server pod's 15008, so that both of its in-pod
    // sides are crossed; the deadline is one no passing test reaches.
    let env = [
        ("SAME_NODE_SHORTCUT", "false"),
        ("CONNECTION_TERMINATION_DEADLINE", LONG_DEADLINE),
    ];
    let Some(cluster) = one_node("rollout_handoff", &env) else {
        return;
    };
    let node = cluster.node("node-a").unwrap();
    let old = i32::try_from(node.ztunnel_pid().unwrap()).unwrap();
    let target = app(&cluster, "server");
    let client = cluster.pod("client").unwrap();
    let mut open = client.connect(target).unwrap();
    assert!(still_echoes(&mut open));

    let new_log_path = node.dir.join("ztunnel-new.log");
    let new = Beside::start(node, &new_log_path);
    let new_pid = new.pid();
    let new_log = || new.log();
    assert!(
        eventually(|| new.ready(node)),
        "the new ztunnel is ready:\n{}",
        tail(&new_log(), 20)
    );
    let both = vec![BTreeSet::from([old, new_pid]); 3];
    for pod in ["client", "server"] {
        assert!(
            eventually(|| holders(&cluster, pod) == both),
            "both ztunnels hold {pod}'s ports: {:?}",
            pod_listeners(&cluster, pod)
        );
    }

    kill(Pid::from_raw(old), Signal::SIGTERM).unwrap();
    let only_new = vec![BTreeSet::from([new_pid]); 3];
    for pod in ["client", "server"] {
        assert!(
            eventually(|| holders(&cluster, pod) == only_new),
            "the old ztunnel closes every listener in {pod} at once: {:?}",
            pod_listeners(&cluster, pod)
        );
    }
    assert_eq!(
        exit_code(old),
        None,
        "the old ztunnel waits for its connection"
    );
    assert!(
        still_echoes(&mut open),
        "the old ztunnel's connection carries bytes both ways during its drain"
    );

    const NEW_CONNECTIONS: usize = 20;
    for attempt in 0..NEW_CONNECTIONS {
        assert!(
            client.echoes(target),
            "new connection {attempt} is accepted:\n{}",
            tail(&new_log(), 20)
        );
    }
    assert!(
        eventually(|| completed_outbound_to(&new_log(), "server") >= NEW_CONNECTIONS),
        "the new ztunnel carried every new connection:\n{}",
        tail(&new_log(), 20)
    );
    assert!(still_echoes(&mut open));
    assert_eq!(exit_code(old), None);

    drop(open);
    assert!(
        eventually(|| exit_code(old).is_some()),
        "the old ztunnel exits once its connection closes:\n{}",
        tail(&node.ztunnel_log(), 20)
    );
    assert_eq!(exit_code(old), Some(0));
    assert_eq!(
        drain_outcome(&node.ztunnel_log()).as_deref(),
        Some("Graceful")
    );
    assert!(client.echoes(target), "the new ztunnel serves on");
}
