//! Fuzzes both ends of ZDS (WIRE.md §5). The input is a run of datagrams,
//! each `[flags][length][bytes]`: the flags say how many fds come with it
//! (`/dev/null`, 0 to 3), whether the kernel cut it short, whether its fd
//! reads as a network namespace, and whether the per-pod proxies fail to
//! start the pod.
//!
//! ztunnel's side: each datagram is read by `zds::parse` and fed to one
//! `zds::Session`, checked against a model of WIRE.md's rules. The agent's
//! side: the same bytes are read as ztunnel's hello and ack.
//!
//! Properties: no panic; an `add` is read only with exactly one fd, any
//! other request only with none, a cut-short datagram never; what the agent
//! encodes for a request, ztunnel reads back as the same request; the
//! session acks, NACKs, retains and reports readiness as the model says;
//! an ack's text survives ztunnel's encoding and the agent's decoding.

#![no_main]

use std::collections::{BTreeSet, HashSet};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use libfuzzer_sys::fuzz_target;
use ztunnel_cni::agent::zds::wire::{self as agent_wire, Ack};
use ztunnel_proxy::inpod::zds::{
    self, Datagram, Handle, ReadError, Request, RequestError, Session,
};
use ztunnel_proxy::inpod::{PodInfo, PodProxies, StartError};

const FDS: u8 = 0b0000_0011;
const TRUNCATED: u8 = 0b0000_0100;
const NOT_NETNS: u8 = 0b0000_1000;
const START_FAILS: u8 = 0b0001_0000;
const RETRY_AFTER: u8 = 0b0010_0000;

/// Per-pod proxies that record what the session asked of them. Whether
/// the next start fails is set by the input.
#[derive(Default)]
struct Proxies {
    state: Mutex<Served>,
}

#[derive(Default)]
struct Served {
    fail: bool,
    served: BTreeSet<Arc<str>>,
    /// The set of every `retain` call, in order.
    retained: Vec<HashSet<Arc<str>>>,
}

impl Proxies {
    fn state(&self) -> MutexGuard<'_, Served> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl PodProxies for Proxies {
    fn add(&self, pod: &PodInfo, _netns: &OwnedFd) -> Result<(), StartError> {
        let mut state = self.state();
        if state.fail {
            return Err(StartError::Draining);
        }
        state.served.insert(pod.uid.clone());
        Ok(())
    }

    fn del(&self, uid: &str) {
        self.state().served.remove(uid);
    }

    fn retain(&self, keep: &HashSet<Arc<str>>) {
        let mut state = self.state();
        state.served.retain(|uid| keep.contains(uid));
        state.retained.push(keep.clone());
    }

    fn served(&self) -> Vec<Arc<str>> {
        self.state().served.iter().cloned().collect()
    }

    fn pending(&self, _count: usize) {}
}

/// WIRE.md §5's session rules, written out plainly.
#[derive(Default)]
struct Model {
    /// `None` once `snapshot_sent` was acked.
    named: Option<HashSet<Arc<str>>>,
    pending: BTreeSet<Arc<str>>,
    ready: bool,
}

/// What the model expects of one request.
#[derive(Debug, PartialEq, Eq)]
enum Expected {
    Ack,
    NotNetns,
    StartFailed,
    KeepAfterSnapshot,
    DuplicateSnapshot,
    MissingWorkloadInfo,
}

impl Model {
    fn new() -> Self {
        Model {
            named: Some(HashSet::new()),
            ..Model::default()
        }
    }

    fn handle(&mut self, request: &Request, start_fails: bool) -> Expected {
        let expected = match request {
            Request::Add { workload: None, .. } => return Expected::MissingWorkloadInfo,
            Request::Add { uid, handle, .. } => {
                if let Some(named) = &mut self.named {
                    named.insert(uid.clone());
                }
                self.pending.remove(uid);
                match handle {
                    Handle::NotNetns => Expected::NotNetns,
                    Handle::Netns(_) if start_fails => {
                        self.pending.insert(uid.clone());
                        Expected::StartFailed
                    }
                    Handle::Netns(_) => Expected::Ack,
                }
            }
            Request::Keep { uid } => match &mut self.named {
                Some(named) => {
                    named.insert(uid.clone());
                    Expected::Ack
                }
                None => Expected::KeepAfterSnapshot,
            },
            Request::Del { uid } => {
                self.pending.remove(uid);
                if let Some(named) = &mut self.named {
                    named.remove(uid);
                }
                Expected::Ack
            }
            Request::SnapshotSent => match self.named.take() {
                Some(_) => Expected::Ack,
                None => Expected::DuplicateSnapshot,
            },
        };
        if expected == Expected::Ack {
            self.ready = self.named.is_none() && self.pending.is_empty();
        }
        expected
    }
}

fn outcome(result: &Result<(), RequestError>) -> Expected {
    use ztunnel_proxy::inpod::zds::{ProtocolError, StartFailure};
    match result {
        Ok(()) => Expected::Ack,
        Err(RequestError::Start(StartFailure::NotNetns)) => Expected::NotNetns,
        Err(RequestError::Start(StartFailure::Proxy(_))) => Expected::StartFailed,
        Err(RequestError::Protocol(ProtocolError::KeepAfterSnapshot)) => {
            Expected::KeepAfterSnapshot
        }
        Err(RequestError::Protocol(ProtocolError::DuplicateSnapshot)) => {
            Expected::DuplicateSnapshot
        }
        Err(RequestError::Protocol(ProtocolError::MissingWorkloadInfo)) => {
            Expected::MissingWorkloadInfo
        }
        Err(RequestError::Read(error)) => panic!("a parsed request read as {error}"),
    }
}

fn dev_null(count: usize) -> Vec<OwnedFd> {
    (0..count)
        .filter_map(|_| std::fs::File::open("/dev/null").ok().map(OwnedFd::from))
        .collect()
}

/// What the agent would send for `request`, when it can send it at all
/// (the agent always names the workload of an add).
fn agent_request(request: &Request) -> Option<agent_wire::Request> {
    Some(match request {
        Request::Add {
            uid,
            workload: Some(workload),
            ..
        } => agent_wire::Request::Add {
            uid: uid.to_string(),
            name: workload.name.to_string(),
            namespace: workload.namespace.to_string(),
            service_account: workload.service_account.to_string(),
            netns: "/dev/null".into(),
        },
        Request::Add { workload: None, .. } => return None,
        Request::Keep { uid } => agent_wire::Request::Keep {
            uid: uid.to_string(),
        },
        Request::Del { uid } => agent_wire::Request::Del {
            uid: uid.to_string(),
        },
        Request::SnapshotSent => agent_wire::Request::SnapshotSent,
    })
}

/// The request's fields without its fd, for comparing two reads.
fn fields(request: &Request) -> String {
    match request {
        Request::Add {
            uid,
            workload,
            handle,
        } => {
            let netns = matches!(handle, Handle::Netns(_));
            format!("add {uid:?} {workload:?} netns={netns}")
        }
        Request::Keep { uid } => format!("keep {uid:?}"),
        Request::Del { uid } => format!("del {uid:?}"),
        Request::SnapshotSent => "snapshot_sent".to_owned(),
    }
}

fn check_agent_side(bytes: &[u8]) {
    let _ = agent_wire::decode_hello(bytes);
    if let Ok(ack) = agent_wire::decode_ack(bytes) {
        let text = match &ack {
            Ack::Ack => String::new(),
            Ack::Nack(text) => {
                assert!(!text.is_empty());
                text.clone()
            }
        };
        assert_eq!(agent_wire::decode_ack(&zds::ack(text)).ok(), Some(ack));
    }
}

fuzz_target!(|data: &[u8]| {
    let proxies = Proxies::default();
    let mut session = Session::new();
    let mut model = Model::new();
    let mut rest = data;
    while let [flags, len, tail @ ..] = rest {
        let len = usize::from(*len).min(tail.len());
        let (bytes, tail) = tail.split_at(len);
        rest = tail;
        check_agent_side(bytes);

        let fd_count = usize::from(flags & FDS);
        let truncated = flags & TRUNCATED != 0;
        let is_netns = flags & NOT_NETNS == 0;
        let datagram = Datagram {
            bytes: bytes.to_vec(),
            fds: dev_null(fd_count),
            truncated,
        };
        let request = match zds::parse(datagram, |_| is_netns) {
            Ok(request) => request,
            Err(error) => {
                if truncated {
                    assert_eq!(error, ReadError::Truncated);
                }
                continue;
            }
        };
        assert!(!truncated);
        match &request {
            Request::Add { handle, .. } => {
                assert_eq!(fd_count, 1);
                assert_eq!(matches!(handle, Handle::Netns(_)), is_netns);
            }
            _ => assert_eq!(fd_count, 0),
        }
        if let Some(sent) = agent_request(&request) {
            let again = Datagram {
                bytes: sent.encode(),
                fds: dev_null(fd_count),
                truncated: false,
            };
            let reread = zds::parse(again, |_| is_netns).expect("the agent's encoding reads back");
            assert_eq!(fields(&reread), fields(&request));
        }

        let start_fails = flags & START_FAILS != 0;
        proxies.state().fail = start_fails;
        let retained_before = proxies.state().retained.len();
        // What an acked `snapshot_sent` must keep: every uid named since
        // the connection began and not deleted since.
        let keep = matches!(request, Request::SnapshotSent)
            .then(|| model.named.clone())
            .flatten();
        let expected = model.handle(&request, start_fails);
        let result = session.handle(request, &proxies);
        assert_eq!(outcome(&result), expected);
        if let Err(error) = &result {
            assert!(error.to_string().starts_with("failure to "), "{error}");
        }
        let state = proxies.state();
        match keep {
            Some(keep) => {
                assert_eq!(state.retained.len(), retained_before + 1);
                assert_eq!(state.retained.last(), Some(&keep));
            }
            None => assert_eq!(state.retained.len(), retained_before),
        }
        drop(state);
        assert_eq!(session.snapshot_done(), model.named.is_none());
        assert_eq!(session.is_ready(), model.ready);

        if flags & RETRY_AFTER != 0 {
            // A retry with the proxies now starting: every pending pod
            // starts, and readiness follows once the snapshot is done.
            proxies.state().fail = false;
            let had_pending = !model.pending.is_empty();
            session.retry(&proxies);
            for uid in std::mem::take(&mut model.pending) {
                assert!(proxies.state().served.contains(&uid), "{uid} did not start");
            }
            if had_pending {
                model.ready = model.named.is_none();
            }
            assert_eq!(session.is_ready(), model.ready);
        }
    }
});
