//! Tables for the pool's pure rules: where a stream goes, when a connection
//! leaves, and what makes two callers share a key.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ztunnel_certs::identity::Identity;

use super::{Choice, PoolConfig, PoolKey, SlotView, choose, idle_since, should_release};

fn open(active: usize) -> SlotView {
    SlotView::Open {
        active,
        peer_limit: 200,
        ready: true,
    }
}

fn config(max_streams: usize, max_connections: usize, spread_threshold: usize) -> PoolConfig {
    PoolConfig {
        max_streams_per_connection: max_streams,
        max_connections_per_key: max_connections,
        spread_threshold,
        unused_release_timeout: Duration::from_secs(300),
    }
}

#[test]
fn choose_table() {
    // istio/ztunnel's behaviour: one connection per key, 100 streams each.
    let single = config(100, 1, 1);
    // Ours by default: spread over up to 4 connections.
    let spread = config(100, 4, 1);
    let not_ready = SlotView::Open {
        active: 0,
        peer_limit: 200,
        ready: false,
    };
    let peer_capped = SlotView::Open {
        active: 10,
        peer_limit: 10,
        ready: true,
    };
    let cases: Vec<(&str, Vec<SlotView>, PoolConfig, Choice)> = vec![
        ("empty key dials", vec![], single, Choice::Dial),
        (
            "one connection is reused",
            vec![open(3)],
            single,
            Choice::Use(0),
        ),
        (
            "a full connection is skipped",
            vec![open(100)],
            single,
            Choice::Dial,
        ),
        (
            "the peer's lower limit caps streams",
            vec![peer_capped],
            single,
            Choice::Dial,
        ),
        (
            "a connection after GOAWAY is skipped",
            vec![not_ready],
            single,
            Choice::Dial,
        ),
        (
            "racing callers wait for the one dial",
            vec![SlotView::Dialing { waiters: 5 }],
            single,
            Choice::Wait(0),
        ),
        (
            "a dial with a full set of waiters is not joined",
            vec![SlotView::Dialing { waiters: 99 }],
            single,
            Choice::Dial,
        ),
        (
            "spreading: a busy connection gets a sibling",
            vec![open(1)],
            spread,
            Choice::Dial,
        ),
        (
            "spreading: an idle connection is used",
            vec![open(1), open(0)],
            spread,
            Choice::Use(1),
        ),
        (
            "spreading: at the connection cap, the least loaded wins",
            vec![open(5), open(2), open(7), open(3)],
            spread,
            Choice::Use(1),
        ),
        (
            "spreading: at the cap a dial with fewer waiters is joined",
            vec![open(5), SlotView::Dialing { waiters: 0 }, open(7), open(3)],
            spread,
            Choice::Wait(1),
        ),
        (
            "spreading: ties go to an open connection over a dial",
            vec![SlotView::Dialing { waiters: 1 }, open(2), open(4), open(4)],
            spread,
            Choice::Use(1),
        ),
        (
            "a threshold of 3 packs streams before spreading",
            vec![open(2)],
            config(100, 4, 3),
            Choice::Use(0),
        ),
        (
            "a zero stream cap still allows one stream",
            vec![],
            config(0, 0, 0),
            Choice::Dial,
        ),
    ];
    for (name, slots, config, want) in cases {
        assert_eq!(choose(&slots, &config), want, "{name}");
    }
}

#[test]
fn release_table() {
    let start = Instant::now();
    let timeout = Duration::from_secs(300);
    let later = |secs| start + Duration::from_secs(secs);
    let cases = [
        ("not ready leaves at once", false, 3, None, later(0), true),
        ("busy connections stay", true, 2, None, later(10_000), false),
        (
            "idle below the timeout stays",
            true,
            0,
            Some(start),
            later(299),
            false,
        ),
        (
            "idle for the timeout leaves",
            true,
            0,
            Some(start),
            later(300),
            true,
        ),
        // A stream that opened since the sweep keeps it, whatever the clock.
        (
            "active but marked idle stays",
            true,
            1,
            Some(start),
            later(900),
            false,
        ),
    ];
    for (name, ready, active, since, now, want) in cases {
        assert_eq!(
            should_release(ready, active, since, now, timeout),
            want,
            "{name}"
        );
    }
}

#[test]
fn idle_since_keeps_the_first_idle_moment() {
    let start = Instant::now();
    let later = start + Duration::from_secs(5);
    assert_eq!(idle_since(0, None, start), Some(start));
    assert_eq!(idle_since(0, Some(start), later), Some(start));
    assert_eq!(idle_since(2, Some(start), later), None);
}

fn identity(service_account: &str) -> Identity {
    format!("spiffe://cluster.local/ns/default/sa/{service_account}")
        .parse()
        .unwrap()
}

#[test]
fn keys_ignore_the_order_of_expected_identities() {
    let address = SocketAddr::from(([198, 18, 0, 2], 15008));
    let source_ip = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
    let one = PoolKey::new(
        identity("client"),
        vec![identity("server"), identity("alt"), identity("server")],
        address,
        source_ip,
    );
    let two = PoolKey::new(
        identity("client"),
        vec![identity("alt"), identity("server")],
        address,
        source_ip,
    );
    assert_eq!(one, two);
    assert_eq!(one.destinations(), [identity("alt"), identity("server")]);
}

#[test]
fn keys_split_on_every_part() {
    let address = SocketAddr::from(([198, 18, 0, 2], 15008));
    let source_ip = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
    let base = PoolKey::new(
        identity("client"),
        vec![identity("server")],
        address,
        source_ip,
    );
    let others = [
        PoolKey::new(
            identity("other"),
            vec![identity("server")],
            address,
            source_ip,
        ),
        PoolKey::new(
            identity("client"),
            vec![identity("other")],
            address,
            source_ip,
        ),
        PoolKey::new(
            identity("client"),
            vec![identity("server")],
            SocketAddr::from(([198, 18, 0, 3], 15008)),
            source_ip,
        ),
        PoolKey::new(
            identity("client"),
            vec![identity("server")],
            address,
            IpAddr::V4(Ipv4Addr::new(198, 18, 0, 9)),
        ),
    ];
    for other in others {
        assert_ne!(base, other);
    }
}
