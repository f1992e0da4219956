//! Tables for one identity's state machine: each row an entry, an event, and
//! the entry and actions that must follow; then what waiters get, and one
//! identity's life from first request to refresh.

use std::time::Duration;

use super::*;

use FetchState::{InFlight, Queued};
use Priority::{Prefetch, Refresh, Waiting};

/// A certificate as the state machine sees it.
#[derive(Debug, Clone, PartialEq)]
struct Cert {
    not_before: SystemTime,
    not_after: SystemTime,
}

impl Validity for Cert {
    fn not_before(&self) -> SystemTime {
        self.not_before
    }

    fn not_after(&self) -> SystemTime {
        self.not_after
    }
}

/// A failed CA call.
#[derive(Debug, Clone, PartialEq)]
struct CaDown;

type TestEntry = Entry<Cert, CaDown>;

type TestEvent = Event<Cert, CaDown>;

/// (why, entry, event, random, expected entry, expected actions)
type Row = (
    &'static str,
    TestEntry,
    TestEvent,
    f64,
    TestEntry,
    Vec<Action>,
);

/// The time of every step in the tables, in seconds.
const NOW: u64 = 1_000;

/// The timer id every finished fetch in the tables arms.
const TIMER: TimerId = 7;

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

fn at_ms(millis: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(millis)
}

/// Valid from `not_before` to `not_after`, in seconds.
fn cert(not_before: u64, not_after: u64) -> Cert {
    Cert {
        not_before: at(not_before),
        not_after: at(not_after),
    }
}

fn new() -> TestEntry {
    Entry::new()
}

/// Holding `certificate`, with no error.
fn served(certificate: Cert) -> TestEntry {
    Entry {
        certificate: Some(Arc::new(certificate)),
        ..new()
    }
}

/// The certificate served in most rows: valid from 500 s to 1500 s.
fn valid() -> TestEntry {
    served(cert(500, 1_500))
}

/// `entry` after `failures` failed fetches in a row.
fn failed(entry: TestEntry, failures: u32) -> TestEntry {
    Entry {
        last_error: Some(Arc::new(CaDown)),
        failures,
        ..entry
    }
}

fn fetching(fetch: FetchState, entry: TestEntry) -> TestEntry {
    Entry { fetch, ..entry }
}

/// `entry` with its next fetch due at `at` and no timer armed.
fn due(entry: TestEntry, at: SystemTime) -> TestEntry {
    Entry {
        next_fetch: Some(at),
        timer: None,
        ..entry
    }
}

/// `entry` with [`TIMER`] armed for `at`, to queue at `priority`.
fn armed(entry: TestEntry, priority: Priority, at: SystemTime) -> TestEntry {
    Entry {
        timer: Some(Timer {
            id: TIMER,
            priority,
        }),
        ..due(entry, at)
    }
}

fn fetched(priority: Priority, result: Result<Cert, CaDown>) -> TestEvent {
    Event::Fetched {
        priority,
        result,
        timer: TIMER,
    }
}

/// What every finished fetch asks: wake the waiters, arm [`TIMER`].
fn woken_and_armed(at: SystemTime) -> Vec<Action> {
    vec![Action::Wake, Action::Arm { at, id: TIMER }]
}

#[test]
fn step_table() {
    let queued = |priority| fetching(Queued(priority), new());
    let in_flight = || fetching(InFlight, new());
    let retry_at = at_ms(1_000_500);
    let cases: Vec<Row> = vec![
        // Asking for a fetch.
        (
            "a waiting connection queues the first fetch",
            new(),
            Event::Wanted(Waiting),
            0.5,
            queued(Waiting),
            vec![Action::Queue(Waiting)],
        ),
        (
            "a prefetch queues the first fetch",
            new(),
            Event::Wanted(Prefetch),
            0.5,
            queued(Prefetch),
            vec![Action::Queue(Prefetch)],
        ),
        (
            "a waiting connection lifts a queued prefetch",
            queued(Prefetch),
            Event::Wanted(Waiting),
            0.5,
            queued(Waiting),
            vec![Action::Queue(Waiting)],
        ),
        (
            "a prefetch lifts a queued refresh",
            queued(Refresh),
            Event::Wanted(Prefetch),
            0.5,
            queued(Prefetch),
            vec![Action::Queue(Prefetch)],
        ),
        (
            "a second waiting connection shares the queued fetch",
            queued(Waiting),
            Event::Wanted(Waiting),
            0.5,
            queued(Waiting),
            vec![],
        ),
        (
            "a lower priority leaves a queued fetch alone",
            queued(Waiting),
            Event::Wanted(Prefetch),
            0.5,
            queued(Waiting),
            vec![],
        ),
        (
            "a waiting connection shares the fetch in flight",
            in_flight(),
            Event::Wanted(Waiting),
            0.5,
            in_flight(),
            vec![],
        ),
        // Taking a fetch off the queue.
        (
            "the current request starts the CA call",
            queued(Waiting),
            Event::Dequeued(Waiting),
            0.5,
            in_flight(),
            vec![Action::Fetch(Waiting)],
        ),
        (
            "a request overtaken by a higher one is stale",
            queued(Waiting),
            Event::Dequeued(Prefetch),
            0.5,
            queued(Waiting),
            vec![],
        ),
        (
            "a request for an entry already fetching is stale",
            in_flight(),
            Event::Dequeued(Waiting),
            0.5,
            in_flight(),
            vec![],
        ),
        (
            "a request for an idle entry is stale",
            new(),
            Event::Dequeued(Refresh),
            0.5,
            new(),
            vec![],
        ),
        // A fetch that succeeded: issued at 1000 s for 2000 s, unless said.
        (
            "a certificate is stored and refreshed at half-life",
            in_flight(),
            fetched(Waiting, Ok(cert(1_000, 3_000))),
            0.0,
            armed(served(cert(1_000, 3_000)), Refresh, at(2_000)),
            woken_and_armed(at(2_000)),
        ),
        (
            "jitter brings the refresh forward by up to a tenth",
            in_flight(),
            fetched(Prefetch, Ok(cert(1_000, 3_000))),
            1.0,
            armed(served(cert(1_000, 3_000)), Refresh, at(1_900)),
            woken_and_armed(at(1_900)),
        ),
        (
            "a success clears the failures and the error",
            fetching(InFlight, failed(new(), 4)),
            fetched(Prefetch, Ok(cert(1_000, 3_000))),
            0.0,
            armed(served(cert(1_000, 3_000)), Refresh, at(2_000)),
            woken_and_armed(at(2_000)),
        ),
        (
            "a refreshed certificate replaces the served one",
            fetching(InFlight, due(valid(), at(NOW))),
            fetched(Refresh, Ok(cert(900, 2_900))),
            0.0,
            armed(served(cert(900, 2_900)), Refresh, at(1_900)),
            woken_and_armed(at(1_900)),
        ),
        (
            "a certificate past its half-life is refreshed in a second, not at once",
            in_flight(),
            fetched(Waiting, Ok(cert(0, 1_200))),
            0.0,
            armed(served(cert(0, 1_200)), Refresh, at(1_001)),
            woken_and_armed(at(1_001)),
        ),
        (
            "an old fetch finishing on a re-created entry leaves its queued fetch",
            queued(Waiting),
            fetched(Refresh, Ok(cert(1_000, 3_000))),
            0.0,
            fetching(
                Queued(Waiting),
                armed(served(cert(1_000, 3_000)), Refresh, at(2_000)),
            ),
            woken_and_armed(at(2_000)),
        ),
        // A fetch that failed.
        (
            "a first failure retries after 0.5 s, below waiting connections",
            in_flight(),
            fetched(Waiting, Err(CaDown)),
            0.5,
            armed(failed(new(), 1), Prefetch, retry_at),
            woken_and_armed(retry_at),
        ),
        (
            "a failed refresh keeps the certificate and retries as a refresh",
            fetching(InFlight, due(valid(), at(NOW))),
            fetched(Refresh, Err(CaDown)),
            0.5,
            armed(failed(valid(), 1), Refresh, retry_at),
            woken_and_armed(retry_at),
        ),
        (
            "the third failure in a row waits 2 s, shortened by jitter",
            fetching(InFlight, failed(new(), 2)),
            fetched(Prefetch, Err(CaDown)),
            0.0,
            armed(failed(new(), 3), Prefetch, at_ms(1_001_600)),
            woken_and_armed(at_ms(1_001_600)),
        ),
        (
            "many failures wait at most 150 s",
            fetching(InFlight, failed(new(), 20)),
            fetched(Prefetch, Err(CaDown)),
            1.0,
            armed(failed(new(), 21), Prefetch, at(1_150)),
            woken_and_armed(at(1_150)),
        ),
        // Timers.
        (
            "the current timer queues its fetch",
            armed(valid(), Refresh, at(NOW)),
            Event::TimerFired(TIMER),
            0.5,
            fetching(Queued(Refresh), due(valid(), at(NOW))),
            vec![Action::Queue(Refresh)],
        ),
        (
            "a retry timer queues at the priority it was armed with",
            armed(failed(new(), 1), Prefetch, at(NOW)),
            Event::TimerFired(TIMER),
            0.5,
            fetching(Queued(Prefetch), due(failed(new(), 1), at(NOW))),
            vec![Action::Queue(Prefetch)],
        ),
        (
            "a stale timer does nothing",
            armed(valid(), Refresh, at(NOW)),
            Event::TimerFired(TIMER - 1),
            0.5,
            armed(valid(), Refresh, at(NOW)),
            vec![],
        ),
        (
            "a timer with none armed does nothing",
            due(valid(), at(NOW)),
            Event::TimerFired(TIMER),
            0.5,
            due(valid(), at(NOW)),
            vec![],
        ),
        (
            "a timer that fires during a fetch is used up without a second fetch",
            armed(in_flight(), Refresh, at(NOW)),
            Event::TimerFired(TIMER),
            0.5,
            due(in_flight(), at(NOW)),
            vec![],
        ),
        (
            "a refresh timer does not lower a queued waiting fetch",
            armed(queued(Waiting), Refresh, at(NOW)),
            Event::TimerFired(TIMER),
            0.5,
            due(queued(Waiting), at(NOW)),
            vec![],
        ),
        // The end of an entry, and of the manager.
        (
            "a forgotten identity is removed",
            armed(valid(), Refresh, at(NOW)),
            Event::Forgotten,
            0.5,
            armed(valid(), Refresh, at(NOW)),
            vec![Action::Remove],
        ),
        (
            "a forgotten identity is removed while it fetches",
            in_flight(),
            Event::Forgotten,
            0.5,
            in_flight(),
            vec![Action::Remove],
        ),
        (
            "a stop wakes the waiters and changes nothing else",
            queued(Waiting),
            Event::Stopped,
            0.5,
            queued(Waiting),
            vec![Action::Wake],
        ),
    ];
    for (why, entry, event, random, expected_entry, expected_actions) in cases {
        let (entry, actions) = step(entry, event, at(NOW), random);
        assert_eq!(entry, expected_entry, "{why}");
        assert_eq!(actions, expected_actions, "{why}");
    }
}

#[test]
fn answer_table() {
    let expired = served(cert(0, NOW));
    let certificate = |not_before, not_after| {
        let certificate = Arc::new(cert(not_before, not_after));
        Some(Answer::Certificate(certificate))
    };
    let error = || Some(Answer::Failed(Arc::new(CaDown)));
    // (why, entry, stopped, expected)
    let cases = [
        (
            "a valid certificate is served",
            valid(),
            false,
            certificate(500, 1_500),
        ),
        (
            "a valid certificate is served through a CA outage",
            failed(valid(), 2),
            false,
            certificate(500, 1_500),
        ),
        (
            "a valid certificate is served after the manager stopped",
            valid(),
            true,
            certificate(500, 1_500),
        ),
        ("nothing fetched yet: keep waiting", new(), false, None),
        (
            "a certificate expiring now is not served: keep waiting for the fetch",
            expired.clone(),
            false,
            None,
        ),
        (
            "the latest error comes back at once",
            failed(new(), 1),
            false,
            error(),
        ),
        (
            "an expired certificate gives way to the error",
            failed(expired.clone(), 2),
            false,
            error(),
        ),
        (
            "the error wins over the stop",
            failed(new(), 1),
            true,
            error(),
        ),
        (
            "nothing fetched and stopped: stop waiting",
            new(),
            true,
            Some(Answer::Stopped),
        ),
        (
            "an expired certificate and stopped: stop waiting",
            expired,
            true,
            Some(Answer::Stopped),
        ),
    ];
    for (why, entry, stopped, expected) in cases {
        assert_eq!(entry.answer(at(NOW), stopped), expected, "{why}");
    }
}

#[test]
fn an_identity_fetches_fails_retries_and_then_refreshes() {
    let mut entry = new();
    let mut go = |event, now, random| {
        let (next, actions) = step(std::mem::take(&mut entry), event, now, random);
        entry = next;
        actions
    };
    let queue = |priority| vec![Action::Queue(priority)];
    let fetch = |priority| vec![Action::Fetch(priority)];
    let retry_at = at_ms(1_000_500);
    assert_eq!(go(Event::Wanted(Waiting), at(NOW), 0.5), queue(Waiting));
    assert_eq!(go(Event::Wanted(Waiting), at(NOW), 0.5), [], "shared");
    assert_eq!(go(Event::Dequeued(Waiting), at(NOW), 0.5), fetch(Waiting));
    let failure = fetched(Waiting, Err(CaDown));
    assert_eq!(go(failure, at(NOW), 0.5), woken_and_armed(retry_at));
    assert_eq!(go(Event::TimerFired(TIMER), retry_at, 0.5), queue(Prefetch));
    assert_eq!(
        go(Event::Dequeued(Prefetch), retry_at, 0.5),
        fetch(Prefetch)
    );
    // Issued at 1000 s for 2000 s: refreshed at 2000 s, with a new timer.
    let success = Event::Fetched {
        priority: Prefetch,
        result: Ok(cert(1_000, 3_000)),
        timer: TIMER + 1,
    };
    let refresh = vec![
        Action::Wake,
        Action::Arm {
            at: at(2_000),
            id: TIMER + 1,
        },
    ];
    assert_eq!(go(success, at(1_001), 0.0), refresh);
    let stale = go(Event::TimerFired(TIMER), at(2_000), 0.5);
    assert_eq!(stale, [], "the retry timer is stale");
    assert_eq!(
        go(Event::TimerFired(TIMER + 1), at(2_000), 0.5),
        queue(Refresh)
    );
    assert_eq!(go(Event::Forgotten, at(2_001), 0.5), [Action::Remove]);
    assert_eq!(entry.failures(), 0);
    assert_eq!(entry.next_fetch(), Some(at(2_000)));
    let answer = entry.answer(at(2_001), false);
    assert_eq!(
        answer,
        Some(Answer::Certificate(Arc::new(cert(1_000, 3_000))))
    );
}
