#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! The DNS proxy in a meshed pod (AMBIENT.md §5), on the one-node in-pod
//! cluster: the node agent's DNS capture rules send the pod's port-53
//! traffic to ztunnel's 15053 in the pod, and ztunnel forwards what it
//! does not answer to a nameserver of the test's own in the node's
//! namespace (`DNS_UPSTREAMS`). The pod resolves through the system
//! resolver (`getent`, glibc's getaddrinfo, with the pod's resolv.conf
//! naming that nameserver, as kubelet writes it) and through `dig`.
//!
//! Needs root, `ip`, `iptables`, containernetworking-plugins and `dig`
//! (bind9-dnsutils); skips with the reason otherwise.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ztunnel_test_support::cluster::{self, Binaries, Cluster, PodSpec};
use ztunnel_test_support::netns::ResolvConf;
use ztunnel_test_support::skip::skip;

use nameserver::{BIG, BIG_COUNT, Nameserver, OUTSIDE};
use support::{APP_PORT, delivered_over_mtls, eventually, logs, metric, metric_at};

#[path = "support/cluster.rs"]
mod support;

#[path = "support/nameserver.rs"]
mod nameserver;

#[path = "support/rollout.rs"]
mod rollout;

/// The echo service's VIP and port.
const VIP: &str = "198.19.0.10";
const SERVICE_PORT: u16 = 80;
/// A service only the mesh knows: a ServiceEntry-style hostname.
const MESH_ONLY: (&str, &str) = ("only.mesh.internal", "198.19.0.11");
/// A service with more VIPs than one UDP response carries.
const MANY: &str = "many.default.svc.cluster.local";
const MANY_COUNT: u8 = 100;
/// Bounds of the flood one pod sends.
const FLOOD_COUNT: usize = 200_000;
const FLOOD_TIME: Duration = Duration::from_secs(20);

/// The cluster, its nameserver, and the client pod's resolv.conf.
struct Setup {
    cluster: Cluster,
    nameserver: Nameserver,
    _resolv_conf: ResolvConf,
}

/// One node, a client and a server pod in the ambient namespace, the
/// echo services, the nameserver on the node's address; the node agent
/// capturing DNS unless `capture` is false; `env` set on the ztunnel.
/// `None`, skipped with the reason, where it cannot run.
fn start(tag: &str, capture: bool, env: &[(&str, &str)]) -> Option<Setup> {
    if let Some(reason) = cluster::unavailable() {
        skip(format_args!("{tag}: {reason}"));
        return None;
    }
    if std::process::Command::new("dig")
        .arg("-v")
        .output()
        .is_err()
    {
        skip(format_args!(
            "{tag}: dig is not installed (apt-get install bind9-dnsutils)"
        ));
        return None;
    }
    let specs = [
        PodSpec::new("client", "default", "client", "node-a"),
        PodSpec::new("server", "default", "server", "node-a"),
    ];
    let binaries = Binaries::from_target_dir().unwrap();
    let mut cluster = Cluster::start(&["node-a"], &specs, &["default"], binaries).unwrap();
    let node = cluster.node("node-a").unwrap();
    let nameserver = Nameserver::start(&node.ns, node.ip).unwrap();
    cluster.set_ztunnel_env("DNS_UPSTREAMS", &nameserver.addr.to_string());
    for (key, value) in env {
        cluster.set_ztunnel_env(key, value);
    }
    cluster.start_ztunnel("node-a").unwrap();
    if !capture {
        cluster.set_agent_env("AMBIENT_DNS_CAPTURE", "false");
        cluster.start_agent("node-a").unwrap();
    }
    for spec in &specs {
        cluster.add_pod(spec).unwrap().serve_echo(APP_PORT).unwrap();
    }
    let server = cluster.pod("server").unwrap();
    let endpoint = |name: &str, hostname: &str, vips: &str| {
        format!(
            "- name: {name}\n  namespace: default\n  hostname: {hostname}\n  vips: [{vips}]\n  ports: {{{SERVICE_PORT}: {APP_PORT}}}\n  endpoints: [{uid}]\n  subjectAltNames: [\"{identity}\"]\n",
            uid = server.spec.uid(),
            identity = server.spec.identity(),
        )
    };
    let many: Vec<String> = (0..MANY_COUNT)
        .map(|last| format!("198.19.1.{last}"))
        .collect();
    let services = [
        endpoint("echo", "echo.default.svc.cluster.local", VIP),
        endpoint("only", MESH_ONLY.0, MESH_ONLY.1),
        endpoint("many", MANY, &many.join(", ")),
    ]
    .concat();
    cluster.mesh().set_services(&services).unwrap();
    cluster.wait_synced().unwrap();
    let client_ns = cluster.pod("client").unwrap().ns.name().to_owned();
    let resolv_conf = ResolvConf::write(
        &client_ns,
        &format!(
            "nameserver {}\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5 timeout:2 attempts:2\n",
            nameserver.addr.ip()
        ),
    )
    .unwrap();
    Some(Setup {
        cluster,
        nameserver,
        _resolv_conf: resolv_conf,
    })
}

impl Setup {
    /// `getent ahostsv4 name` in the client pod: the addresses the
    /// system resolver gives, sorted and deduplicated.
    fn getaddrinfo(&self, name: &str) -> Vec<String> {
        let pod = self.cluster.pod("client").unwrap();
        let Ok(output) = pod.ns.exec(&["getent", "ahostsv4", name]) else {
            return Vec::new();
        };
        let mut addresses: Vec<String> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
            .collect();
        addresses.sort();
        addresses.dedup();
        addresses
    }

    /// `dig` in the client pod, asking the pod's nameserver (captured to
    /// ztunnel when capture is on); its whole output.
    fn dig(&self, args: &[&str]) -> String {
        let pod = self.cluster.pod("client").unwrap();
        let server = format!("@{}", self.nameserver.addr.ip());
        let mut command = vec!["dig", "+time=3", "+tries=2", server.as_str()];
        command.extend_from_slice(args);
        let output = pod.ns.exec(&command).unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The A records of `dig +short name`, sorted.
    fn dig_short(&self, name: &str) -> Vec<String> {
        let mut lines: Vec<String> = self
            .dig(&["+short", name, "A"])
            .lines()
            .filter(|line| line.parse::<IpAddr>().is_ok())
            .map(str::to_owned)
            .collect();
        lines.sort();
        lines
    }
}

/// The `status:` of a dig answer.
fn status(output: &str) -> &str {
    output
        .split("status: ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or("none")
}

/// How many records the ANSWER section of a dig output has.
fn answer_count(output: &str) -> usize {
    output
        .split("ANSWER: ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|count| count.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_meshed_pod_resolves_services_by_every_name_form_and_forwards_the_rest() {
    let Some(setup) = start("dns", true, &[]) else {
        return;
    };
    let vip = vec![VIP.to_owned()];
    for name in [
        "echo",
        "echo.default",
        "echo.default.svc",
        "echo.default.svc.cluster.local",
    ] {
        assert_eq!(
            setup.getaddrinfo(name),
            vip,
            "getaddrinfo {name}\n{}",
            logs(&setup.cluster)
        );
        assert_eq!(setup.dig_short(name), vip, "dig {name}");
    }
    let mesh_only = vec![MESH_ONLY.1.to_owned()];
    assert_eq!(setup.getaddrinfo(MESH_ONLY.0), mesh_only);
    assert_eq!(setup.dig_short(MESH_ONLY.0), mesh_only);
    // The mesh's names never reach the upstream.
    assert!(
        !setup
            .nameserver
            .asked()
            .iter()
            .any(|asked| asked.contains("echo")),
        "{:?}",
        setup.nameserver.asked()
    );

    // A name outside the mesh is the upstream's answer, forwarded.
    let outside = vec![OUTSIDE.1.to_string()];
    assert_eq!(setup.getaddrinfo(OUTSIDE.0), outside);
    assert_eq!(setup.dig_short(OUTSIDE.0), outside);
    assert!(
        setup
            .nameserver
            .asked()
            .contains(&format!("udp {}", OUTSIDE.0))
    );

    // A name nobody knows.
    let missing = setup.dig(&["nothing-here.example", "A"]);
    assert_eq!(status(&missing), "NXDOMAIN", "{missing}");
    assert!(setup.getaddrinfo("nothing-here.example").is_empty());

    let udp = metric(
        &setup.cluster,
        "node-a",
        "istio_dns_requests_total",
        &["request_protocol=\"udp\"", "request_query_type=\"a\""],
    );
    assert!(udp > 0.0, "istio_dns_requests_total counts the queries");
    let forwarded = metric(
        &setup.cluster,
        "node-a",
        "istio_dns_upstream_requests_total",
        &[],
    );
    assert!(
        forwarded > 0.0,
        "istio_dns_upstream_requests_total counts the forwarded ones"
    );
}

#[test]
fn with_dns_debug_logging_each_query_has_a_line_saying_who_asked_what_and_its_fate() {
    let Some(setup) = start("dns query log", true, &[("RUST_LOG", "info,dns=debug")]) else {
        return;
    };
    assert_eq!(
        setup.dig_short("echo.default.svc.cluster.local"),
        vec![VIP.to_owned()]
    );
    assert_eq!(setup.dig_short(OUTSIDE.0), vec![OUTSIDE.1.to_string()]);
    let client = setup.cluster.pod("client").unwrap().ip.to_string();
    let node = setup.cluster.node("node-a").unwrap();
    let line_for = |name: &str, fate: &str| {
        node.ztunnel_log()
            .lines()
            .any(|line| line.contains(fate) && line.contains(name) && line.contains(&client))
    };
    assert!(
        eventually(|| line_for("echo.default.svc.cluster.local", "DNS query answered")),
        "{}",
        logs(&setup.cluster)
    );
    assert!(
        eventually(|| line_for(OUTSIDE.0, "DNS query forwarded")),
        "{}",
        logs(&setup.cluster)
    );
}

#[test]
fn an_answer_too_large_for_udp_is_truncated_and_the_tcp_retry_carries_it_all() {
    let Some(setup) = start("dns-truncation", true, &[]) else {
        return;
    };
    for (name, count) in [(MANY, MANY_COUNT), (BIG, BIG_COUNT)] {
        let udp = setup.dig(&["+ignore", "+bufsize=512", name, "A"]);
        assert!(udp.contains(" tc"), "{name} over UDP is truncated:\n{udp}");
        assert!(answer_count(&udp) < usize::from(count), "{udp}");
        // dig retries over TCP on TC, as resolvers do.
        let retried = setup.dig(&["+bufsize=512", name, "A"]);
        assert_eq!(
            answer_count(&retried),
            usize::from(count),
            "{name}:\n{retried}"
        );
    }
    assert!(setup.nameserver.asked().contains(&format!("tcp {BIG}")));
}

#[test]
fn a_connection_to_a_name_the_proxy_answered_reaches_the_service_through_ztunnel() {
    // Over HBONE, not the same-node shortcut: the tunnel's mTLS is what
    // proves the identity.
    let Some(setup) = start("dns-connect", true, &[("SAME_NODE_SHORTCUT", "false")]) else {
        return;
    };
    let addresses = setup.getaddrinfo("echo");
    let vip: IpAddr = addresses.first().expect("echo resolves").parse().unwrap();
    let client = setup.cluster.pod("client").unwrap();
    assert!(
        eventually(|| client.echoes(SocketAddr::new(vip, SERVICE_PORT))),
        "{}",
        logs(&setup.cluster)
    );
    assert!(
        delivered_over_mtls(&setup.cluster, "node-a", "server", "client") > 0,
        "delivered with the client's identity:\n{}",
        logs(&setup.cluster)
    );
}

#[test]
fn a_pod_flooding_its_resolver_does_not_starve_another_pods_queries() {
    let Some(setup) = start("dns-flood", true, &[]) else {
        return;
    };
    // The server pod sends queries as fast as it can, without waiting for
    // answers, half of them forwarded, for at most FLOOD_TIME or
    // FLOOD_COUNT queries.
    let flooder = setup.cluster.pod("server").unwrap();
    let socket = flooder
        .ns
        .run(|| std::net::UdpSocket::bind("0.0.0.0:0"))
        .unwrap()
        .unwrap();
    let target = setup.nameserver.addr;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = std::sync::Arc::clone(&stop);
    let flood = std::thread::spawn(move || {
        let queries = [query("echo.default.svc.cluster.local."), query(OUTSIDE.0)];
        let started = Instant::now();
        let mut sent = 0usize;
        while sent < FLOOD_COUNT
            && started.elapsed() < FLOOD_TIME
            && !stopped.load(Ordering::Relaxed)
        {
            let _ = socket.send_to(&queries[sent % 2], target);
            sent += 1;
        }
        sent
    });
    // Meanwhile the client's queries are answered.
    let vip = vec![VIP.to_owned()];
    for round in 0..5 {
        assert_eq!(
            setup.dig_short("echo"),
            vip,
            "round {round}\n{}",
            logs(&setup.cluster)
        );
        assert_eq!(
            setup.dig_short(OUTSIDE.0),
            vec![OUTSIDE.1.to_string()],
            "round {round}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let sent = flood.join().unwrap();
    assert!(sent > 0);
}

/// A recursive A query for `name`, as bytes.
fn query(name: &str) -> Vec<u8> {
    query_with_id(name, 0)
}

/// A recursive A query for `name` with the message id `id`, as bytes.
fn query_with_id(name: &str, id: u16) -> Vec<u8> {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RecordType};
    let mut message = Message::query();
    message.metadata.id = id;
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    message.to_vec().unwrap()
}

#[test]
fn with_capture_off_the_pods_queries_go_to_the_upstream_itself() {
    let Some(setup) = start("dns-off", false, &[]) else {
        return;
    };
    // The upstream does not know the mesh's names, and now it is the one
    // that answers.
    let answer = setup.dig(&["echo.default.svc.cluster.local", "A"]);
    assert_eq!(status(&answer), "NXDOMAIN", "{answer}");
    assert!(
        setup
            .nameserver
            .asked()
            .contains(&"udp echo.default.svc.cluster.local.".to_owned())
    );
    assert_eq!(setup.dig_short(OUTSIDE.0), vec![OUTSIDE.1.to_string()]);
    assert_eq!(
        metric(&setup.cluster, "node-a", "istio_dns_requests_total", &[]),
        0.0
    );
}

/// Client sockets of the hand-off test: each one its own source port, so
/// the SO_REUSEPORT group's hash spreads them over both ztunnels' sockets.
const HAND_OFF_CLIENTS: usize = 32;
/// Bounds of each client's queries in the hand-off test.
const HAND_OFF_QUERIES: u16 = 2_000;
const HAND_OFF_TIME: Duration = Duration::from_secs(40);
/// How long a client waits for an answer before it counts its query
/// lost: ztunnel answers in a millisecond, the nameserver behind it in
/// about as much.
const HAND_OFF_ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// What one hand-off client saw.
#[derive(Debug, Default)]
struct Asked {
    answered: u64,
    /// Answered with another code than NOERROR.
    failed: u64,
    /// No answer within [`HAND_OFF_ANSWER_WITHIN`], by query id.
    lost: Vec<u16>,
}

/// Asks `target` one query at a time from `socket` (every tenth for a
/// name the proxy forwards) until `stop` or the bounds, counting answers
/// in `progress`.
fn ask_until(
    socket: &std::net::UdpSocket,
    target: SocketAddr,
    stop: &std::sync::atomic::AtomicBool,
    progress: &std::sync::atomic::AtomicU64,
) -> Asked {
    socket
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let started = Instant::now();
    let mut asked = Asked::default();
    let mut buffer = [0u8; 512];
    for id in 0..HAND_OFF_QUERIES {
        if stop.load(Ordering::Relaxed) || started.elapsed() > HAND_OFF_TIME {
            break;
        }
        let name = if id % 10 == 0 {
            OUTSIDE.0
        } else {
            "echo.default.svc.cluster.local."
        };
        socket.send_to(&query_with_id(name, id), target).unwrap();
        let sent = Instant::now();
        let answer = loop {
            if sent.elapsed() > HAND_OFF_ANSWER_WITHIN {
                break None;
            }
            // Late answers to earlier queries are skipped by their id.
            match socket.recv_from(&mut buffer) {
                Ok((length, _)) if length >= 4 && buffer[..2] == id.to_be_bytes() => {
                    break Some(buffer[3] & 0x0f);
                }
                _ => {}
            }
        };
        match answer {
            Some(0) => asked.answered += 1,
            Some(_) => asked.failed += 1,
            None => asked.lost.push(id),
        }
        progress.fetch_add(1, Ordering::Relaxed);
    }
    asked
}

#[test]
fn in_a_rollout_no_dns_query_is_lost_between_the_old_ztunnel_and_the_new() {
    let Some(setup) = start("dns-handoff", true, &[]) else {
        return;
    };
    let cluster = &setup.cluster;
    let node = cluster.node("node-a").unwrap();
    let old = i32::try_from(node.ztunnel_pid().unwrap()).unwrap();
    let new = rollout::Beside::start(node, &node.dir.join("ztunnel-new.log"));
    assert!(
        eventually(|| new.ready(node)),
        "the new ztunnel is ready:\n{}",
        cluster::tail(&new.log(), 20)
    );
    // Both ztunnels' UDP sockets on 15053 in the client pod.
    let client = cluster.pod("client").unwrap();
    let udp_holders = || {
        let output = client
            .ns
            .exec(&["ss", "-H", "-u", "-l", "-n", "-p", "sport = :15053"])
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        [old, new.pid()].map(|pid| text.contains(&format!("pid={pid},")))
    };
    assert!(
        eventually(|| udp_holders() == [true, true]),
        "both ztunnels listen on the pod's 15053"
    );

    // Queries from the client pod to its nameserver, captured to 15053.
    let sockets: Vec<std::net::UdpSocket> = (0..HAND_OFF_CLIENTS)
        .map(|_| {
            client
                .ns
                .run(|| std::net::UdpSocket::bind("0.0.0.0:0"))
                .unwrap()
                .unwrap()
        })
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let target = setup.nameserver.addr;
    let clients: Vec<_> = sockets
        .into_iter()
        .map(|socket| {
            let (stop, progress) = (
                std::sync::Arc::clone(&stop),
                std::sync::Arc::clone(&progress),
            );
            std::thread::spawn(move || ask_until(&socket, target, &stop, &progress))
        })
        .collect();
    let warm = 20 * HAND_OFF_CLIENTS as u64;
    assert!(
        eventually(|| progress.load(Ordering::Relaxed) >= warm),
        "the clients' queries are answered before the hand-off"
    );

    // The old ztunnel is stopped as kubelet stops it, in the middle of
    // the load, and exits once its drain is done.
    let at_stop = progress.load(Ordering::Relaxed);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(
        eventually(|| rollout::exit_code(old).is_some()),
        "the old ztunnel exits:\n{}",
        cluster::tail(&node.ztunnel_log(), 20)
    );
    // The load goes on against the new ztunnel alone for a while.
    let at_exit = progress.load(Ordering::Relaxed);
    assert!(eventually(
        || progress.load(Ordering::Relaxed) >= at_exit + warm
    ));
    stop.store(true, Ordering::Relaxed);
    let asked: Vec<Asked> = clients
        .into_iter()
        .map(|client| client.join().unwrap())
        .collect();

    let answered: u64 = asked.iter().map(|asked| asked.answered).sum();
    let failed: u64 = asked.iter().map(|asked| asked.failed).sum();
    let lost: Vec<&Vec<u16>> = asked
        .iter()
        .map(|asked| &asked.lost)
        .filter(|lost| !lost.is_empty())
        .collect();
    println!(
        "hand-off under load: {answered} answered, {failed} failed, {} lost; {} asked before SIGTERM, {} by the old one's exit",
        lost.iter().map(|lost| lost.len()).sum::<usize>(),
        at_stop,
        at_exit
    );
    assert!(
        lost.is_empty(),
        "queries lost in the hand-off (ids per client): {lost:?}\nold:\n{}\nnew:\n{}",
        cluster::tail(&node.ztunnel_log(), 20),
        cluster::tail(&new.log(), 20)
    );
    assert_eq!(failed, 0, "every query answered NOERROR");
    assert!(
        answered > at_exit,
        "queries were answered after the old one exited"
    );
    let new_stats = rollout::SECOND_STATS
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        metric_at(
            cluster,
            "node-a",
            new_stats,
            "istio_dns_requests_total",
            &[]
        ) > 0.0,
        "the new ztunnel counts the queries it took"
    );
}

/// `query` with its TCP length prefix.
fn framed(query: &[u8]) -> Vec<u8> {
    let length = u16::try_from(query.len()).unwrap();
    [&length.to_be_bytes()[..], query].concat()
}

/// One TCP query for the echo service from `pod` to `target` (captured to
/// ztunnel's 15053): the answer's bytes, or `None` when the connection
/// closed or nothing came within 3 s.
fn tcp_answer(pod: &cluster::Pod, target: SocketAddr) -> Option<Vec<u8>> {
    use std::io::{Read, Write};
    let mut stream = pod
        .ns
        .run(move || std::net::TcpStream::connect_timeout(&target, Duration::from_secs(3)))
        .ok()?
        .ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    stream
        .write_all(&framed(&query("echo.default.svc.cluster.local.")))
        .ok()?;
    let mut length = [0u8; 2];
    stream.read_exact(&mut length).ok()?;
    let mut answer = vec![0u8; usize::from(u16::from_be_bytes(length))];
    stream.read_exact(&mut answer).ok()?;
    Some(answer)
}

/// A TCP connection from `pod` to `target` that asks for the many-address
/// name over and over and never reads: small buffers on its side, so that
/// ztunnel is soon stuck writing to it. Returned once a write would block
/// (or after a bounded number of queries).
fn stuck_reader(pod: &cluster::Pod, target: SocketAddr) -> std::net::TcpStream {
    use std::io::Write;
    let stream = pod
        .ns
        .run(move || -> std::io::Result<std::net::TcpStream> {
            let socket = socket2::Socket::new(
                socket2::Domain::IPV4,
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )?;
            // The kernel's least buffers: a few answers fill them.
            socket.set_recv_buffer_size(1)?;
            socket.set_send_buffer_size(1)?;
            socket.connect_timeout(&target.into(), Duration::from_secs(3))?;
            Ok(socket.into())
        })
        .unwrap()
        .unwrap();
    stream.set_nonblocking(true).unwrap();
    let query = framed(&query(&format!("{MANY}.")));
    let mut writer = &stream;
    for _ in 0..100_000 {
        match writer.write(&query) {
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(error) => panic!("writing to the DNS proxy: {error}"),
        }
    }
    stream
}

#[test]
fn tcp_clients_that_stop_reading_give_their_slots_back_after_the_timeout() {
    let Some(setup) = start("dns-tcp-stuck", true, &[]) else {
        return;
    };
    let pod = setup.cluster.pod("client").unwrap();
    let target = setup.nameserver.addr;
    assert!(
        tcp_answer(pod, target).is_some(),
        "TCP queries are answered:\n{}",
        logs(&setup.cluster)
    );
    // Every TCP slot of the pod held by a client that never reads.
    let stuck: Vec<std::net::TcpStream> = (0..ztunnel_proxy::dns::server::TCP_CONNECTIONS)
        .map(|_| stuck_reader(pod, target))
        .collect();
    assert!(
        tcp_answer(pod, target).is_none(),
        "with every slot held, a further connection is closed unanswered"
    );
    // ztunnel gives up writing to each after the forwarder's timeout
    // (5 s), and the slots are free again while the stuck clients still
    // hold their ends open.
    let started = Instant::now();
    assert!(
        eventually(|| tcp_answer(pod, target).is_some()),
        "the pod's TCP queries are answered again:\n{}",
        logs(&setup.cluster)
    );
    println!(
        "TCP slots given back {:.1} s after the 16 stuck clients",
        started.elapsed().as_secs_f64()
    );
    drop(stuck);
}
