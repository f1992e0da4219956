//! The listeners' binding and the UDP hand-off, on real sockets.

use super::*;

fn bound(listeners: &Listeners) -> (Vec<SocketAddr>, Vec<SocketAddr>) {
    let udp = listeners
        .udp
        .iter()
        .map(|s| s.local_addr().unwrap())
        .collect();
    let tcp = listeners
        .tcp
        .iter()
        .map(|s| s.local_addr().unwrap())
        .collect();
    (udp, tcp)
}

#[test]
fn localhost_binds_both_loopbacks_and_an_address_binds_only_itself() {
    let port = ztunnel_test_support::ports::unused_loopback_port()
        .unwrap()
        .port();
    let listeners = bind_listeners(DnsAddress::Localhost(port), true, None, false).unwrap();
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
    let (udp, tcp) = bound(&listeners);
    assert_eq!(udp.first(), Some(&v4));
    assert_eq!(udp, tcp);
    // ::1 when this host's loopback has it.
    assert!(udp.len() == 1 || udp.get(1) == Some(&v6), "{udp:?}");
    drop(listeners);

    let other = SocketAddr::from(([127, 0, 0, 53], port));
    let listeners = bind_listeners(DnsAddress::Socket(other), true, None, false).unwrap();
    assert_eq!(bound(&listeners), (vec![other], vec![other]));
}

/// Everything queued on `socket` now, without waiting.
fn queued(socket: &std::net::UdpSocket) -> Vec<Vec<u8>> {
    let mut buffer = [0u8; 64];
    std::iter::from_fn(|| {
        let (length, _) = socket.recv_from(&mut buffer).ok()?;
        Some(buffer[..length].to_vec())
    })
    .collect()
}

#[test]
fn a_listener_that_stopped_receiving_keeps_its_queue_while_its_group_takes_every_new_query() {
    // The old and the new ztunnel's sockets of a rollout, in one
    // SO_REUSEPORT group on one address.
    let bind = |port| {
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        socket::udp_listen(address, None, |socket| socket.set_reuse_port(true)).unwrap()
    };
    let old = bind(0);
    let address = old.local_addr().unwrap();
    let new = bind(address.port());
    // Clients on 64 source ports: the group's hash spreads them over
    // both sockets (all on one has odds of 2^-63).
    let clients: Vec<std::net::UdpSocket> = (0..64)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let send_all = |payload: &[u8]| {
        for client in &clients {
            client.send_to(payload, address).unwrap();
        }
    };
    send_all(b"before");
    stop_receiving(&old).unwrap();
    send_all(b"after");

    // Loopback delivers within the send, but a busy machine may defer
    // it: collect until all 128 are in, for 5 s at most.
    let (mut on_old, mut on_new) = (Vec::new(), Vec::new());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while on_old.len() + on_new.len() < 2 * clients.len() && std::time::Instant::now() < deadline {
        on_old.extend(queued(&old));
        on_new.extend(queued(&new));
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(!on_old.is_empty(), "the hash gave the old socket some");
    assert!(
        on_old.iter().all(|payload| payload == b"before"),
        "the old socket keeps what it had and takes nothing new: {on_old:?}"
    );
    let before_on_new = on_new.iter().filter(|p| p.as_slice() == b"before").count();
    let after_on_new = on_new.iter().filter(|p| p.as_slice() == b"after").count();
    assert_eq!(on_old.len() + before_on_new, clients.len(), "nothing lost");
    assert_eq!(
        after_on_new,
        clients.len(),
        "every new query to the new socket"
    );

    // The old socket still answers the clients it holds queries of.
    old.send_to(b"answer", clients[0].local_addr().unwrap())
        .unwrap();
    let mut buffer = [0u8; 16];
    clients[0]
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let (length, from) = clients[0].recv_from(&mut buffer).unwrap();
    assert_eq!((&buffer[..length], from), (&b"answer"[..], address));
}

#[test]
fn with_no_listener_beside_it_a_new_query_is_refused_rather_than_queued_unread() {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    let only = socket::udp_listen(address, None, |_| Ok(())).unwrap();
    stop_receiving(&only).unwrap();
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    client.connect(only.local_addr().unwrap()).unwrap();
    client
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    client.send(b"query").unwrap();
    let error = client.recv(&mut [0u8; 16]).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(queued(&only).is_empty());
}
