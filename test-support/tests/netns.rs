//! The topology helpers build what they claim: two namespaces joined by a
//! veth pair can reach each other, code run "inside" one binds there, and
//! dropping a namespace removes it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

use ztunnel_test_support::netns::{self, NetNs};
use ztunnel_test_support::skip::skip;

#[test]
fn veth_pair_joins_two_namespaces() {
    if let Some(reason) = netns::unavailable() {
        skip(reason);
        return;
    }
    let a = NetNs::create("a").unwrap();
    let b = NetNs::create("b").unwrap();
    netns::veth_pair(&a, "198.18.0.1/24", &b, "198.18.0.2/24").unwrap();

    let listener = b
        .run(|| TcpListener::bind("198.18.0.2:7000"))
        .unwrap()
        .unwrap();
    let client = a
        .run(|| TcpStream::connect("198.18.0.2:7000"))
        .unwrap()
        .unwrap();
    let (mut server, peer) = listener.accept().unwrap();
    assert_eq!(peer.ip().to_string(), "198.18.0.1");
    (&client).write_all(b"ping").unwrap();
    let mut buf = [0; 4];
    server.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");

    let name = a.name().to_owned();
    drop(a);
    let list = netns::run("ip", &["netns", "list"]).unwrap();
    assert!(!String::from_utf8_lossy(&list.stdout).contains(&name));
}
