//! ZDS over real sockets: a test "agent" on the other end of a
//! SOCK_SEQPACKET socketpair (or of a listening socket under a tempdir)
//! sends datagrams with real fds, a real network namespace handle
//! (`/proc/self/ns/net`) among them, and reads the answers ztunnel sends.
//! The per-pod proxies are a fake that records what it is asked to do and,
//! like the real ones, refuses a handle that is not a network namespace.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::socket::{self, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType};
use prometheus_client::registry::Registry;
use prost::Message;
use socket2::{Domain, SockAddr, Socket, Type};
use tokio::task::JoinHandle;
use ztunnel_proto::istio::workload::zds;
use ztunnel_proto::istio::workload::zds::workload_request::Payload;
use ztunnel_proxy::drain::{self, DrainTrigger, DrainWatcher};
use ztunnel_proxy::inpod::netns::is_network_namespace;
use ztunnel_proxy::inpod::zds::{
    Client, Error, ProtocolError, ReadError, Settings, Timing, ZdsSocket,
};
use ztunnel_proxy::inpod::{PodInfo, PodProxies, StartError};
use ztunnel_proxy::metrics::Metrics;
use ztunnel_proxy::readiness::Ready;

/// Long enough for a loaded CI machine, short enough to fail a hung test.
const AGENT_TIMEOUT: Duration = Duration::from_secs(10);

const NOT_NETNS: &str = "failure to start proxy : the handle is not a network namespace";

// ---------------------------------------------------------------------------
// The fake per-pod proxies.

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    /// uid, namespace/name/service account, and the netns inode.
    Add(String, String, u64),
    Del(String),
    Retain(BTreeSet<String>),
}

#[derive(Default)]
struct FakeProxies {
    calls: Mutex<Vec<Call>>,
    served: Mutex<BTreeMap<String, u64>>,
    /// How many more times `add` of a uid fails.
    failures: Mutex<HashMap<String, usize>>,
    /// The pending counts reported, in order.
    pending: Mutex<Vec<usize>>,
}

impl FakeProxies {
    fn serving(uids: &[&str]) -> Arc<Self> {
        let fake = FakeProxies::default();
        fake.served
            .lock()
            .unwrap()
            .extend(uids.iter().map(|uid| ((*uid).to_owned(), 0)));
        Arc::new(fake)
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn served_uids(&self) -> Vec<String> {
        self.served.lock().unwrap().keys().cloned().collect()
    }
}

impl PodProxies for FakeProxies {
    fn add(&self, pod: &PodInfo, netns: &OwnedFd) -> Result<(), StartError> {
        // What the real proxies would find out from setns.
        if !is_network_namespace(netns.as_fd()) {
            return Err(StartError::Netns(std::io::Error::from_raw_os_error(22)));
        }
        let inode = File::from(netns.try_clone().unwrap())
            .metadata()
            .unwrap()
            .ino();
        let workload = &pod.workload;
        let names = format!(
            "{}/{}/{}",
            workload.namespace, workload.name, workload.service_account
        );
        self.calls
            .lock()
            .unwrap()
            .push(Call::Add(pod.uid.to_string(), names, inode));
        if let Some(left) = self.failures.lock().unwrap().get_mut(&*pod.uid)
            && *left > 0
        {
            *left -= 1;
            return Err(StartError::Bind {
                what: "outbound",
                source: std::io::Error::from_raw_os_error(98),
            });
        }
        self.served
            .lock()
            .unwrap()
            .insert(pod.uid.to_string(), inode);
        Ok(())
    }

    fn del(&self, uid: &str) {
        self.calls.lock().unwrap().push(Call::Del(uid.to_owned()));
        self.served.lock().unwrap().remove(uid);
    }

    fn pending(&self, count: usize) {
        self.pending.lock().unwrap().push(count);
    }

    fn retain(&self, keep: &HashSet<Arc<str>>) {
        let keep: BTreeSet<String> = keep.iter().map(|uid| uid.to_string()).collect();
        self.served
            .lock()
            .unwrap()
            .retain(|uid, _| keep.contains(uid));
        self.calls.lock().unwrap().push(Call::Retain(keep));
    }

    fn served(&self) -> Vec<Arc<str>> {
        self.served_uids().into_iter().map(Arc::from).collect()
    }
}

// ---------------------------------------------------------------------------
// The test agent: blocking calls on its end of the socket.

struct Agent {
    socket: Socket,
}

impl Agent {
    fn new(fd: OwnedFd) -> Self {
        let socket = Socket::from(fd);
        socket.set_read_timeout(Some(AGENT_TIMEOUT)).unwrap();
        Agent { socket }
    }

    fn send_raw(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
        let raw: Vec<i32> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        let rights = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
        socket::sendmsg::<()>(
            self.socket.as_raw_fd(),
            &[IoSlice::new(bytes)],
            cmsgs,
            MsgFlags::empty(),
            None,
        )
        .unwrap();
    }

    fn send(&self, payload: Payload, fds: &[BorrowedFd<'_>]) {
        let bytes = zds::WorkloadRequest {
            payload: Some(payload),
        }
        .encode_to_vec();
        self.send_raw(&bytes, fds);
    }

    /// One datagram from ztunnel; empty once ztunnel has closed.
    fn recv(&self) -> Vec<u8> {
        let mut buffer = vec![0; 1024];
        // A signal to the test process (a child exiting) cuts a wait short
        // with nothing read: wait again.
        let length = loop {
            match socket::recv(self.socket.as_raw_fd(), &mut buffer, MsgFlags::empty()) {
                Err(nix::errno::Errno::EINTR) => continue,
                received => break received.expect("ztunnel did not answer in time"),
            }
        };
        buffer.truncate(length);
        buffer
    }

    fn hello(&self) {
        let hello = zds::ZdsHello::decode(self.recv().as_slice()).unwrap();
        assert_eq!(hello.version, i32::from(zds::Version::V1));
    }

    /// The next answer's `Ack.error`: empty for an ACK.
    fn ack(&self) -> String {
        let response = zds::WorkloadResponse::decode(self.recv().as_slice()).unwrap();
        match response.payload {
            Some(zds::workload_response::Payload::Ack(ack)) => ack.error,
            None => panic!("a response without an ack"),
        }
    }

    fn assert_closed(&self) {
        assert_eq!(self.recv(), Vec::<u8>::new(), "ztunnel kept the connection");
    }

    fn add(&self, uid: &str, netns: BorrowedFd<'_>) -> String {
        self.send(add(uid, &format!("pod-{uid}")), &[netns]);
        self.ack()
    }

    fn snapshot_sent(&self) -> String {
        self.send(Payload::SnapshotSent(zds::SnapshotSent {}), &[]);
        self.ack()
    }
}

fn add(uid: &str, name: &str) -> Payload {
    Payload::Add(zds::AddWorkload {
        uid: uid.to_owned(),
        workload_info: Some(zds::WorkloadInfo {
            name: name.to_owned(),
            namespace: "shop".to_owned(),
            service_account: "cart".to_owned(),
        }),
    })
}

fn keep(uid: &str) -> Payload {
    Payload::Keep(zds::KeepWorkload {
        uid: uid.to_owned(),
    })
}

fn del(uid: &str) -> Payload {
    Payload::Del(zds::DelWorkload {
        uid: uid.to_owned(),
    })
}

/// A real network namespace handle: the test process's own.
fn netns() -> File {
    File::open("/proc/self/ns/net").unwrap()
}

fn netns_inode() -> u64 {
    netns().metadata().unwrap().ino()
}

fn added(uid: &str) -> Call {
    Call::Add(
        uid.to_owned(),
        format!("shop/pod-{uid}/cart"),
        netns_inode(),
    )
}

fn retained(uids: &[&str]) -> Call {
    Call::Retain(uids.iter().map(|uid| (*uid).to_owned()).collect())
}

fn timing() -> Timing {
    Timing {
        connect_first: Duration::from_millis(5),
        connect_max: Duration::from_millis(50),
        reconnect_first: Duration::from_millis(1),
        reconnect_max: Duration::from_millis(20),
        retry_interval: Duration::from_millis(50),
    }
}

// ---------------------------------------------------------------------------
// One session over a socketpair.

/// A session task, which hands its client back with how it ended.
type Session = JoinHandle<(Client, Result<(), Error>)>;

struct Harness {
    agent: Agent,
    /// The client's metrics, as `/metrics` shows them.
    registry: Registry,
    proxies: Arc<FakeProxies>,
    ready: Ready,
    session: Session,
    _drain: DrainTrigger,
}

impl Harness {
    fn start(proxies: Arc<FakeProxies>) -> Self {
        let (trigger, watcher) = drain::channel();
        let ready = Ready::new();
        let (settings, registry) = settings(Path::new("/nonexistent"));
        let client = Client::new(settings, proxies.clone(), ready.clone(), watcher);
        let (agent, session) = connect(client);
        Harness {
            agent,
            registry,
            proxies,
            ready,
            session,
            _drain: trigger,
        }
    }

    /// Waits for the session to end and serves a new connection with the
    /// same client; returns how the first one ended.
    async fn reconnect(&mut self) -> Error {
        let session = std::mem::replace(&mut self.session, tokio::spawn(std::future::pending()));
        let (client, ended) = session.await.unwrap();
        let (agent, session) = connect(client);
        self.agent = agent;
        self.session = session;
        ended.unwrap_err()
    }

    /// The value of the line of `/metrics` that starts with `series`, 0
    /// when it is absent.
    fn metric(&self, series: &str) -> f64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    async fn ended(self) -> Error {
        let (_client, ended) = self.session.await.unwrap();
        ended.unwrap_err()
    }
}

fn connect(mut client: Client) -> (Agent, Session) {
    let (ours, theirs) = socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    let session = tokio::spawn(async move {
        let socket = ZdsSocket::from_fd(theirs).unwrap();
        let ended = client.serve(socket).await;
        (client, ended)
    });
    let agent = Agent::new(ours);
    agent.hello();
    (agent, session)
}

fn read_error(detail: &str) -> String {
    format!("failure to read message : {detail}")
}

// ---------------------------------------------------------------------------
// The tests. Multi-threaded: the agent blocks the test's own thread while
// the session runs on the workers.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_with_a_real_netns_starts_the_pod_and_the_snapshot_makes_ready() {
    let harness = Harness::start(FakeProxies::serving(&[]));
    assert!(!harness.ready.is_ready());
    assert_eq!(harness.agent.add("uid-1", netns().as_fd()), "");
    assert!(!harness.ready.is_ready(), "ready before the snapshot");
    assert_eq!(harness.agent.snapshot_sent(), "");
    assert!(harness.ready.is_ready());
    assert_eq!(
        harness.proxies.calls(),
        [added("uid-1"), retained(&["uid-1"])]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_drops_unnamed_pods_and_a_later_del_stops_a_pod() {
    let harness = Harness::start(FakeProxies::serving(&["gone", "kept", "readded"]));
    let agent = &harness.agent;
    assert_eq!(agent.add("readded", netns().as_fd()), "");
    agent.send(keep("kept"), &[]);
    assert_eq!(agent.ack(), "");
    // A del inside the snapshot only unnames the pod.
    assert_eq!(agent.add("fleeting", netns().as_fd()), "");
    agent.send(del("fleeting"), &[]);
    assert_eq!(agent.ack(), "");
    assert_eq!(agent.snapshot_sent(), "");
    assert_eq!(harness.proxies.served_uids(), ["kept", "readded"]);
    agent.send(del("readded"), &[]);
    assert_eq!(agent.ack(), "");
    agent.send(del("never-heard-of"), &[]);
    assert_eq!(agent.ack(), "");
    assert_eq!(harness.proxies.served_uids(), ["kept"]);
    assert_eq!(
        harness.proxies.calls(),
        [
            added("readded"),
            added("fleeting"),
            retained(&["kept", "readded"]),
            Call::Del("readded".into()),
            Call::Del("never-heard-of".into()),
        ]
    );
    assert!(harness.ready.is_ready());
}

/// Each fd-count error is NACKed, the connection is closed, and the next
/// connection is served with the pods of the first still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fd_count_errors_end_the_connection_but_not_the_pods() {
    let netns = netns();
    let other = netns.try_clone().unwrap();
    let cases: [(Payload, Vec<BorrowedFd<'_>>, &str, ReadError); 3] = [
        (
            add("no-fd", "pod-no-fd"),
            vec![],
            "No control message",
            ReadError::MissingFd,
        ),
        (
            del("first"),
            vec![netns.as_fd()],
            "Unexpected control message",
            ReadError::UnexpectedFd,
        ),
        (
            add("two-fds", "pod-two-fds"),
            vec![netns.as_fd(), other.as_fd()],
            "Expected 1 FD, got 2",
            ReadError::TooManyFds(2),
        ),
    ];
    let mut harness = Harness::start(FakeProxies::serving(&[]));
    assert_eq!(harness.agent.add("first", netns.as_fd()), "");
    assert_eq!(harness.agent.snapshot_sent(), "");
    assert!(harness.ready.is_ready());
    for (payload, fds, detail, error) in cases {
        harness.agent.send(payload, &fds);
        assert_eq!(harness.agent.ack(), read_error(detail));
        harness.agent.assert_closed();
        let ended = harness.reconnect().await;
        assert!(
            matches!(ended, Error::Read(ref e) if *e == error),
            "{ended}"
        );
        assert!(!harness.ready.is_ready(), "ready after a disconnect");
        // The new connection is served, and nothing was dropped meanwhile.
        assert_eq!(harness.agent.add("second", netns.as_fd()), "");
        assert_eq!(harness.proxies.served_uids(), ["first", "second"]);
        harness.agent.send(keep("first"), &[]);
        assert_eq!(harness.agent.ack(), "");
        assert_eq!(harness.agent.snapshot_sent(), "");
        assert!(harness.ready.is_ready());
    }
    assert!(
        !harness
            .proxies
            .calls()
            .iter()
            .any(|call| matches!(call, Call::Add(uid, ..) if uid != "first" && uid != "second"))
    );
}

/// The fds of a refused datagram are closed: the pipe they are the write
/// end of reads as ended once the agent drops its own copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fds_of_a_refused_datagram_are_closed() {
    let long = zds::WorkloadRequest {
        payload: Some(add("long", &"x".repeat(1100))),
    }
    .encode_to_vec();
    let short = |payload| {
        zds::WorkloadRequest {
            payload: Some(payload),
        }
        .encode_to_vec()
    };
    let cases = [
        (short(add("two", "pod-two")), 2, true),
        (short(del("one")), 1, true),
        (long, 1, true),
        (short(add("file", "pod-file")), 1, false),
    ];
    let mut harness = Harness::start(FakeProxies::serving(&[]));
    for (bytes, count, ends_connection) in cases {
        let (reader, writer) = std::io::pipe().unwrap();
        let writers: Vec<OwnedFd> = (0..count)
            .map(|_| OwnedFd::from(writer.try_clone().unwrap()))
            .collect();
        let fds: Vec<BorrowedFd<'_>> = writers.iter().map(AsFd::as_fd).collect();
        harness.agent.send_raw(&bytes, &fds);
        assert_ne!(harness.agent.ack(), "");
        drop((writers, writer));
        assert_pipe_ends(reader);
        if ends_connection {
            harness.reconnect().await;
        }
    }
}

fn assert_pipe_ends(mut reader: std::io::PipeReader) {
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut byte = [0; 1];
        let _ = done.send(std::io::Read::read(&mut reader, &mut byte).unwrap());
    });
    let read = ended
        .recv_timeout(AGENT_TIMEOUT)
        .expect("ztunnel still holds an fd of the pipe");
    assert_eq!(read, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bytes_are_read_errors() {
    let long_name = "x".repeat(1100);
    let truncated = zds::WorkloadRequest {
        payload: Some(add("long", &long_name)),
    }
    .encode_to_vec();
    assert!(truncated.len() > 1024);
    let netns = netns();
    let cases: [(Vec<u8>, Vec<BorrowedFd<'_>>, &str); 3] = [
        (truncated, vec![netns.as_fd()], "received truncated message"),
        // Field 9, an unknown one: decodes, but names no payload.
        (vec![0x48, 0x01], vec![], "no payload"),
        (
            vec![0xff, 0xff, 0xff],
            vec![],
            "failed to decode Protobuf message: ",
        ),
    ];
    let mut harness = Harness::start(FakeProxies::serving(&[]));
    for (bytes, fds, detail) in cases {
        assert_eq!(harness.agent.add("ok", netns.as_fd()), "");
        harness.agent.send_raw(&bytes, &fds);
        let nack = harness.agent.ack();
        assert!(nack.starts_with(&read_error(detail)), "{nack}");
        harness.agent.assert_closed();
        assert!(matches!(harness.reconnect().await, Error::Read(_)));
        assert_eq!(harness.proxies.served_uids(), ["ok"]);
    }
    assert_eq!(harness.agent.add("after", netns.as_fd()), "");
    // Counted, not only logged.
    assert_eq!(
        harness.metric("ztunnel_zds_nacks_total{reason=\"read\"}"),
        3.0
    );
    assert_eq!(
        harness.metric("ztunnel_zds_connection_errors_total{reason=\"read\"}"),
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_that_is_not_a_netns_is_refused_and_the_connection_kept() {
    let harness = Harness::start(FakeProxies::serving(&[]));
    let file = tempfile::tempfile().unwrap();
    harness.agent.send(add("file", "pod-file"), &[file.as_fd()]);
    assert_eq!(harness.agent.ack(), NOT_NETNS);
    assert_eq!(harness.agent.add("good", netns().as_fd()), "");
    assert_eq!(harness.agent.snapshot_sent(), "");
    // Never retried: nothing is pending, so the proxy is ready.
    assert!(harness.ready.is_ready());
    assert_eq!(
        harness.proxies.calls(),
        [added("good"), retained(&["file", "good"])]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_may_send_before_reading_the_hello() {
    let (trigger, watcher) = drain::channel();
    let proxies = FakeProxies::serving(&[]);
    let (ours, theirs) = socket::socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    let agent = Agent::new(ours);
    agent.send(add("early", "pod-early"), &[netns().as_fd()]);
    let mut client = client(proxies.clone(), Ready::new(), watcher);
    let session = tokio::spawn(async move { client.serve(ZdsSocket::from_fd(theirs)?).await });
    agent.hello();
    assert_eq!(agent.ack(), "");
    assert_eq!(proxies.calls(), [added("early")]);
    trigger.drain(Duration::from_secs(5)).await;
    session.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_length_datagram_ends_the_connection_without_an_answer() {
    let harness = Harness::start(FakeProxies::serving(&[]));
    harness.agent.send_raw(&[], &[]);
    harness.agent.assert_closed();
    assert!(matches!(harness.ended().await, Error::Closed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_is_retried_and_holds_readiness_until_it_succeeds() {
    let proxies = FakeProxies::serving(&[]);
    proxies.failures.lock().unwrap().insert("slow".into(), 2);
    let harness = Harness::start(proxies.clone());
    let nack = harness.agent.add("slow", netns().as_fd());
    assert!(nack.starts_with("failure to start proxy : "), "{nack}");
    let last_pending = || proxies.pending.lock().unwrap().last().copied();
    assert_eq!(last_pending(), Some(1), "the pending pod is counted");
    assert_eq!(harness.agent.snapshot_sent(), "");
    assert!(!harness.ready.is_ready(), "ready with a pod pending");
    wait_until(|| harness.ready.is_ready()).await;
    assert_eq!(last_pending(), Some(0), "and no longer once started");
    assert_eq!(
        proxies
            .calls()
            .iter()
            .filter(|c| **c == added("slow"))
            .count(),
        3
    );
    assert_eq!(proxies.served_uids(), ["slow"]);
    // The connection was kept all along.
    harness.agent.send(del("slow"), &[]);
    assert_eq!(harness.agent.ack(), "");
}

/// The protocol errors: NACKed, then the session ends with the fatal
/// error, which `run` hands to its caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_errors_are_nacked_then_fatal() {
    let missing_info = Payload::Add(zds::AddWorkload {
        uid: "bare".into(),
        workload_info: None,
    });
    let cases = [
        (
            vec![Payload::SnapshotSent(zds::SnapshotSent {})],
            Payload::SnapshotSent(zds::SnapshotSent {}),
            ProtocolError::DuplicateSnapshot,
            "duplicate snapshot message",
        ),
        (
            vec![Payload::SnapshotSent(zds::SnapshotSent {})],
            keep("late"),
            ProtocolError::KeepAfterSnapshot,
            "keep received after snapshot",
        ),
        (
            vec![],
            missing_info,
            ProtocolError::MissingWorkloadInfo,
            "add without workload info",
        ),
    ];
    for (before, offending, error, text) in cases {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("ztunnel.sock");
        let listener = listen(&path);
        let (_trigger, watcher) = drain::channel();
        let proxies = FakeProxies::serving(&[]);
        let run = tokio::spawn(ztunnel_proxy::inpod::zds::run(
            settings(&path).0,
            proxies.clone(),
            Ready::new(),
            watcher,
        ));
        let agent = accept(&listener);
        agent.hello();
        for payload in before {
            agent.send(payload, &[]);
            assert_eq!(agent.ack(), "");
        }
        let fds = match offending {
            Payload::Add(_) => vec![netns()],
            _ => vec![],
        };
        let fds: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
        agent.send(offending, &fds);
        assert_eq!(
            agent.ack(),
            format!("failure to process message : ProtocolError(\"{text}\")")
        );
        assert_eq!(run.await.unwrap(), Err(error));
        agent.assert_closed();
    }
}

/// `run`: waits for a socket that is not there yet, reconnects after a
/// read error with a new hello, keeps the pods across it, and stops at
/// the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_waits_for_the_agent_and_reconnects_after_a_read_error() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("ztunnel.sock");
    let (trigger, watcher) = drain::channel();
    let proxies = FakeProxies::serving(&[]);
    let ready = Ready::new();
    let run = tokio::spawn(ztunnel_proxy::inpod::zds::run(
        settings(&path).0,
        proxies.clone(),
        ready.clone(),
        watcher,
    ));
    // A few failed connects to a missing path first.
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(!ready.is_ready());
    let listener = listen(&path);

    let agent = accept(&listener);
    agent.hello();
    assert_eq!(agent.add("a", netns().as_fd()), "");
    assert_eq!(agent.snapshot_sent(), "");
    assert!(ready.is_ready());
    agent.send(add("no-fd", "pod-no-fd"), &[]);
    assert_eq!(agent.ack(), read_error("No control message"));
    agent.assert_closed();

    let agent = accept(&listener);
    agent.hello();
    assert!(!ready.is_ready(), "ready after a disconnect");
    assert_eq!(proxies.served_uids(), ["a"]);
    assert_eq!(agent.add("b", netns().as_fd()), "");
    agent.send(keep("a"), &[]);
    assert_eq!(agent.ack(), "");
    assert_eq!(agent.snapshot_sent(), "");
    assert!(ready.is_ready());
    assert_eq!(
        proxies.calls(),
        [
            added("a"),
            retained(&["a"]),
            added("b"),
            retained(&["a", "b"])
        ]
    );

    trigger.drain(Duration::from_secs(5)).await;
    assert_eq!(run.await.unwrap(), Ok(()));
}

// ---------------------------------------------------------------------------
// Plumbing.

/// Settings with the tests' timing, and the registry of their metrics.
fn settings(path: &Path) -> (Settings, Registry) {
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry, "test"));
    let settings = Settings {
        path: path.to_owned(),
        timing: timing(),
        metrics,
    };
    (settings, registry)
}

fn client(proxies: Arc<FakeProxies>, ready: Ready, drain: DrainWatcher) -> Client {
    Client::new(settings(Path::new("/nonexistent")).0, proxies, ready, drain)
}

fn listen(path: &Path) -> Socket {
    let listener = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
    listener.bind(&SockAddr::unix(path).unwrap()).unwrap();
    listener.listen(8).unwrap();
    // SO_RCVTIMEO bounds accept too.
    listener.set_read_timeout(Some(AGENT_TIMEOUT)).unwrap();
    listener
}

fn accept(listener: &Socket) -> Agent {
    let (connection, _) = listener.accept().expect("ztunnel did not connect in time");
    Agent::new(OwnedFd::from(connection))
}

async fn wait_until(condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + AGENT_TIMEOUT;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition never met"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
