//! Tables for the ZDS state machine: request sequences, the answer to each,
//! the readiness after each, and the calls the per-pod proxies saw. The
//! proxies are a recording fake: the unit under test is the session.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use crate::config::WorkloadInfo;
use crate::inpod::{PodInfo, PodProxies, StartError};

use super::message::{Handle, Request};
use super::session::Session;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Add(String),
    Del(String),
    Retain(BTreeSet<String>),
}

/// Records every call; fails `add` of a uid as many times as `failures`
/// says.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<Call>>,
    failures: Mutex<HashMap<String, usize>>,
}

impl PodProxies for Recorder {
    fn add(&self, pod: &PodInfo, _netns: &OwnedFd) -> Result<(), StartError> {
        self.calls
            .lock()
            .unwrap()
            .push(Call::Add(pod.uid.to_string()));
        let mut failures = self.failures.lock().unwrap();
        match failures.get_mut(&*pod.uid) {
            Some(left) if *left > 0 => {
                *left -= 1;
                Err(StartError::Draining)
            }
            _ => Ok(()),
        }
    }

    fn del(&self, uid: &str) {
        self.calls.lock().unwrap().push(Call::Del(uid.to_owned()));
    }

    fn retain(&self, keep: &HashSet<Arc<str>>) {
        let keep = keep.iter().map(|uid| uid.to_string()).collect();
        self.calls.lock().unwrap().push(Call::Retain(keep));
    }

    fn served(&self) -> Vec<Arc<str>> {
        Vec::new()
    }

    fn pending(&self, _count: usize) {}
}

/// One request of a table, built fresh for each run.
#[derive(Debug, Clone, Copy)]
enum Step {
    Add(&'static str),
    AddNotNetns(&'static str),
    AddWithoutInfo(&'static str),
    Keep(&'static str),
    Del(&'static str),
    Snapshot,
    /// Not a request: a retry round, answered with "".
    Retry,
}

fn netns() -> Handle {
    // Any open file stands in: the session never looks at it.
    Handle::Netns(OwnedFd::from(std::fs::File::open("/dev/null").unwrap()))
}

fn request(step: Step) -> Option<Request> {
    let workload = |uid: &str| {
        Some(WorkloadInfo {
            namespace: "ns".into(),
            name: format!("pod-{uid}").into(),
            service_account: "sa".into(),
        })
    };
    Some(match step {
        Step::Add(uid) => Request::Add {
            uid: uid.into(),
            workload: workload(uid),
            handle: netns(),
        },
        Step::AddNotNetns(uid) => Request::Add {
            uid: uid.into(),
            workload: workload(uid),
            handle: Handle::NotNetns,
        },
        Step::AddWithoutInfo(uid) => Request::Add {
            uid: uid.into(),
            workload: None,
            handle: netns(),
        },
        Step::Keep(uid) => Request::Keep { uid: uid.into() },
        Step::Del(uid) => Request::Del { uid: uid.into() },
        Step::Snapshot => Request::SnapshotSent,
        Step::Retry => return None,
    })
}

struct Case {
    name: &'static str,
    /// How many times `add` of a uid fails before it succeeds.
    failures: &'static [(&'static str, usize)],
    /// Each step, its answer ("" for an ACK), and the readiness after it.
    steps: &'static [(Step, &'static str, bool)],
    calls: &'static [&'static str],
}

const START_FAILED: &str = "failure to start proxy : ztunnel is draining";
const NOT_NETNS: &str = "failure to start proxy : the handle is not a network namespace";

const CASES: &[Case] = &[
    Case {
        name: "snapshot then live adds and dels",
        failures: &[],
        steps: &[
            (Step::Add("a"), "", false),
            (Step::Keep("b"), "", false),
            (Step::Snapshot, "", true),
            (Step::Add("c"), "", true),
            (Step::Del("a"), "", true),
            (Step::Del("unknown"), "", true),
        ],
        calls: &["add a", "retain a,b", "add c", "del a", "del unknown"],
    },
    Case {
        name: "empty snapshot drops everything",
        failures: &[],
        steps: &[(Step::Snapshot, "", true)],
        calls: &["retain "],
    },
    Case {
        name: "del before the snapshot only unnames the pod",
        failures: &[],
        steps: &[
            (Step::Add("a"), "", false),
            (Step::Add("b"), "", false),
            (Step::Del("a"), "", false),
            (Step::Snapshot, "", true),
        ],
        calls: &["add a", "add b", "retain b"],
    },
    Case {
        name: "protocol errors",
        failures: &[],
        steps: &[
            (
                Step::AddWithoutInfo("a"),
                "failure to process message : ProtocolError(\"add without workload info\")",
                false,
            ),
            (Step::Snapshot, "", true),
            (
                Step::Keep("a"),
                "failure to process message : ProtocolError(\"keep received after snapshot\")",
                true,
            ),
            (
                Step::Snapshot,
                "failure to process message : ProtocolError(\"duplicate snapshot message\")",
                true,
            ),
        ],
        calls: &["retain "],
    },
    Case {
        name: "a start failure holds readiness until a retry succeeds",
        failures: &[("a", 2)],
        steps: &[
            (Step::Add("a"), START_FAILED, false),
            (Step::Snapshot, "", false),
            (Step::Retry, "", false),
            (Step::Retry, "", true),
            (Step::Retry, "", true),
        ],
        calls: &["add a", "retain a", "add a", "add a"],
    },
    Case {
        name: "a start failure after ready shows at the next ack",
        failures: &[("b", 1)],
        steps: &[
            (Step::Snapshot, "", true),
            (Step::Add("b"), START_FAILED, true),
            (Step::Add("c"), "", false),
            (Step::Retry, "", true),
        ],
        calls: &["retain ", "add b", "add c", "add b"],
    },
    Case {
        name: "del clears a pending retry",
        failures: &[("a", 5)],
        steps: &[
            (Step::Add("a"), START_FAILED, false),
            (Step::Del("a"), "", false),
            (Step::Retry, "", false),
            (Step::Snapshot, "", true),
        ],
        calls: &["add a", "retain "],
    },
    Case {
        name: "a non-netns handle is answered at once and never retried",
        failures: &[],
        steps: &[
            (Step::AddNotNetns("a"), NOT_NETNS, false),
            (Step::Snapshot, "", true),
            (Step::Retry, "", true),
            (Step::Add("b"), "", true),
        ],
        calls: &["retain a", "add b"],
    },
    Case {
        name: "a later add supersedes a pending one",
        failures: &[("a", 1)],
        steps: &[
            (Step::Add("a"), START_FAILED, false),
            (Step::Add("a"), "", false),
            (Step::Snapshot, "", true),
        ],
        calls: &["add a", "add a", "retain a"],
    },
];

fn call_text(call: &Call) -> String {
    match call {
        Call::Add(uid) => format!("add {uid}"),
        Call::Del(uid) => format!("del {uid}"),
        Call::Retain(keep) => {
            let keep: Vec<&str> = keep.iter().map(String::as_str).collect();
            format!("retain {}", keep.join(","))
        }
    }
}

#[test]
fn session_tables() {
    for case in CASES {
        let proxies = Recorder::default();
        for (uid, count) in case.failures {
            proxies
                .failures
                .lock()
                .unwrap()
                .insert((*uid).to_owned(), *count);
        }
        let mut session = Session::new();
        for (index, (step, answer, ready)) in case.steps.iter().enumerate() {
            let text = match request(*step) {
                Some(request) => match session.handle(request, &proxies) {
                    Ok(()) => String::new(),
                    Err(nack) => nack.to_string(),
                },
                None => {
                    session.retry(&proxies);
                    String::new()
                }
            };
            let at = format!("{}: step {index} ({step:?})", case.name);
            assert_eq!(text, *answer, "{at}");
            assert_eq!(session.is_ready(), *ready, "{at}");
        }
        let calls: Vec<String> = proxies
            .calls
            .lock()
            .unwrap()
            .iter()
            .map(call_text)
            .collect();
        assert_eq!(calls, case.calls, "{}", case.name);
    }
}

#[test]
fn a_new_session_forgets_the_old_one() {
    let proxies = Recorder::default();
    proxies.failures.lock().unwrap().insert("a".into(), 1);
    let mut first = Session::new();
    first
        .handle(request(Step::Keep("b")).unwrap(), &proxies)
        .unwrap();
    assert!(
        first
            .handle(request(Step::Add("a")).unwrap(), &proxies)
            .is_err()
    );
    // The new connection has an empty retry list and an empty snapshot set.
    let mut second = Session::new();
    assert!(!second.snapshot_done() && !second.is_ready());
    second.retry(&proxies);
    second.handle(Request::SnapshotSent, &proxies).unwrap();
    let calls: Vec<String> = proxies
        .calls
        .lock()
        .unwrap()
        .iter()
        .map(call_text)
        .collect();
    assert_eq!(calls, ["add a", "retain "]);
    assert!(second.is_ready());
}
