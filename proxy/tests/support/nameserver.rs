//! A nameserver of the test's own, standing in for the cluster's DNS: UDP
//! and TCP port 53 inside a namespace the test made, answering a fixed
//! zone and the names a test adds, NXDOMAIN to every other name, and
//! logging the names it is asked.
//! Messages are hickory's protocol types; the answering is this file's.

// Each test file uses its own part of this.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use ztunnel_test_support::netns::NetNs;

/// The most queries each socket answers before it stops by itself.
const MOST_QUERIES: usize = 10_000;

/// How often the serving threads look at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// The largest response sent over UDP to a client without EDNS.
const UDP_LIMIT: usize = 512;

/// A name only this nameserver knows, and its address.
pub const OUTSIDE: (&str, Ipv4Addr) = ("outside.example.", Ipv4Addr::new(198, 18, 250, 1));

/// A name with [`BIG_COUNT`] addresses: too many for one UDP response.
pub const BIG: &str = "big.example.";

/// How many addresses [`BIG`] has.
pub const BIG_COUNT: u8 = 100;

/// The running nameserver; stops when dropped.
pub struct Nameserver {
    /// Where it listens, UDP and TCP.
    pub addr: SocketAddr,
    zone: Arc<Zone>,
    stop: Arc<AtomicBool>,
}

/// What the serving threads share: the names asked, and the names a test
/// added to the fixed zone.
#[derive(Default)]
struct Zone {
    asked: Mutex<Vec<String>>,
    added: Mutex<Vec<(String, Ipv4Addr)>>,
}

impl Nameserver {
    /// Listens on `ip:53` inside `ns`.
    pub fn start(ns: &NetNs, ip: Ipv4Addr) -> anyhow::Result<Nameserver> {
        let addr = SocketAddr::from((ip, 53));
        let (udp, tcp) = ns.run(move || -> std::io::Result<_> {
            Ok((UdpSocket::bind(addr)?, TcpListener::bind(addr)?))
        })??;
        udp.set_read_timeout(Some(POLL))?;
        tcp.set_nonblocking(true)?;
        let zone = Arc::new(Zone::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (shared, stopped) = (Arc::clone(&zone), Arc::clone(&stop));
        std::thread::spawn(move || serve_udp(&udp, &shared, &stopped));
        let (shared, stopped) = (Arc::clone(&zone), Arc::clone(&stop));
        std::thread::spawn(move || serve_tcp(&tcp, &shared, &stopped));
        Ok(Nameserver { addr, zone, stop })
    }

    /// Answers `name` (fully qualified, lower case: `db.example.`) with
    /// `address` from now on.
    pub fn add(&self, name: &str, address: Ipv4Addr) {
        self.zone
            .added
            .lock()
            .unwrap()
            .push((name.to_owned(), address));
    }

    /// The names asked so far, with the transport: `udp outside.example.`.
    pub fn asked(&self) -> Vec<String> {
        self.zone.asked.lock().unwrap().clone()
    }
}

impl Drop for Nameserver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve_udp(socket: &UdpSocket, zone: &Zone, stop: &AtomicBool) {
    let mut buffer = vec![0; 4096];
    for _ in 0..MOST_QUERIES {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok((length, client)) = socket.recv_from(&mut buffer) else {
            continue;
        };
        let Some(mut answer) = answer(&buffer[..length], "udp", zone) else {
            continue;
        };
        let mut bytes = answer.to_vec().unwrap();
        if bytes.len() > UDP_LIMIT {
            answer.answers.clear();
            answer.metadata.truncation = true;
            bytes = answer.to_vec().unwrap();
        }
        let _ = socket.send_to(&bytes, client);
    }
}

fn serve_tcp(listener: &TcpListener, zone: &Zone, stop: &AtomicBool) {
    for _ in 0..MOST_QUERIES {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok((mut stream, _)) = listener.accept() else {
            std::thread::sleep(POLL);
            continue;
        };
        let _ = answer_stream(&mut stream, zone);
    }
}

/// Answers the length-prefixed queries of one connection.
fn answer_stream(stream: &mut TcpStream, zone: &Zone) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    loop {
        let mut length = [0; 2];
        stream.read_exact(&mut length)?;
        let mut query = vec![0; usize::from(u16::from_be_bytes(length))];
        stream.read_exact(&mut query)?;
        let Some(answer) = answer(&query, "tcp", zone) else {
            return Ok(());
        };
        let bytes = answer.to_vec().unwrap();
        let length = u16::try_from(bytes.len()).unwrap().to_be_bytes();
        stream.write_all(&[&length[..], &bytes].concat())?;
    }
}

/// The answer to a query from the zone, logging its name.
fn answer(query: &[u8], transport: &str, zone: &Zone) -> Option<Message> {
    let query = Message::from_vec(query).ok()?;
    let question = query.queries.first()?.clone();
    let name = question.name().to_ascii().to_ascii_lowercase();
    zone.asked
        .lock()
        .unwrap()
        .push(format!("{transport} {name}"));
    let mut answer = Message::new(query.metadata.id, MessageType::Response, OpCode::Query);
    answer.metadata.recursion_desired = query.metadata.recursion_desired;
    answer.metadata.recursion_available = true;
    answer.add_query(question.clone());
    let added: Vec<Ipv4Addr> = zone
        .added
        .lock()
        .unwrap()
        .iter()
        .filter(|(added, _)| *added == name)
        .map(|(_, address)| *address)
        .collect();
    let addresses: Vec<Ipv4Addr> = match name.as_str() {
        name if name == OUTSIDE.0 => vec![OUTSIDE.1],
        BIG => (0..BIG_COUNT)
            .map(|last| Ipv4Addr::new(198, 18, 251, last))
            .collect(),
        _ if !added.is_empty() => added,
        _ => {
            answer.metadata.response_code = ResponseCode::NXDomain;
            return Some(answer);
        }
    };
    if question.query_type() == RecordType::A {
        for address in addresses {
            let record = Record::from_rdata(question.name().clone(), 60, RData::A(A(address)));
            answer.add_answer(record);
        }
    }
    Some(answer)
}
