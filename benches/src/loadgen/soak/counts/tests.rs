//! The counts' rules, step by step, and the JSON line they make.

use super::*;

/// What happens to a run's counts, one step at a time.
enum Step {
    New(Result<(), FailureKind>),
    Opened { replacing: bool },
    OpenFailed(FailureKind),
    Exchanged,
    Broke { at_ms: u64, kind: FailureKind },
}

fn play(steps: &[Step]) -> SoakReport {
    let mut counts = SoakReport::new(2, SystemTime::UNIX_EPOCH);
    for step in steps {
        match step {
            Step::New(outcome) => counts.new_connection(*outcome),
            Step::Opened { replacing } => counts.opened(*replacing),
            Step::OpenFailed(kind) => counts.open_failed(*kind),
            Step::Exchanged => counts.exchanged(),
            Step::Broke { at_ms, kind } => counts.broke(Duration::from_millis(*at_ms), *kind),
        }
    }
    counts
}

#[test]
fn a_quiet_run_counts_successes_only() {
    let counts = play(&[
        Step::Opened { replacing: false },
        Step::Opened { replacing: false },
        Step::Exchanged,
        Step::New(Ok(())),
        Step::Exchanged,
        Step::New(Ok(())),
    ]);
    assert_eq!(counts.new.ok, 2);
    assert_eq!(counts.new.failed, FailureCounts::default());
    assert_eq!(counts.long_lived.wanted, 2);
    assert_eq!(counts.long_lived.open, 2);
    // The two first messages and two more.
    assert_eq!(counts.long_lived.exchanges, 4);
    assert_eq!(counts.long_lived.replaced, 0);
    assert!(counts.long_lived.breaks.is_empty());
    assert!(counts.succeeded());
    assert_eq!(counts.failures(), 0);
}

#[test]
fn a_server_going_away_counts_breaks_refusals_and_replacements() {
    let counts = play(&[
        Step::Opened { replacing: false },
        Step::Opened { replacing: false },
        // The server stops: both connections break, new ones are refused.
        Step::Broke {
            at_ms: 1500,
            kind: FailureKind::Reset,
        },
        Step::Broke {
            at_ms: 1620,
            kind: FailureKind::Closed,
        },
        Step::New(Err(FailureKind::Refused)),
        Step::OpenFailed(FailureKind::Refused),
        // It is back: one replacement opens.
        Step::Opened { replacing: true },
        Step::New(Ok(())),
    ]);
    assert_eq!(counts.new.ok, 1);
    assert_eq!(counts.new.failed.refused, 1);
    assert_eq!(counts.new.failed.total(), 1);
    assert_eq!(counts.long_lived.open, 1);
    assert_eq!(counts.long_lived.replaced, 1);
    assert_eq!(counts.long_lived.broken.reset, 1);
    assert_eq!(counts.long_lived.broken.closed, 1);
    assert_eq!(counts.long_lived.open_failed.refused, 1);
    assert_eq!(
        counts.long_lived.breaks,
        [
            Break {
                at_s: 1.5,
                kind: FailureKind::Reset
            },
            Break {
                at_s: 1.62,
                kind: FailureKind::Closed
            },
        ]
    );
    assert_eq!(counts.failures(), 4);
}

#[test]
fn every_kind_has_its_own_count() {
    let kinds = [
        FailureKind::Refused,
        FailureKind::Reset,
        FailureKind::Timeout,
        FailureKind::Closed,
        FailureKind::Wrong,
        FailureKind::Unreachable,
        FailureKind::Resolve,
        FailureKind::Other,
    ];
    let mut counts = FailureCounts::default();
    for (index, kind) in kinds.iter().enumerate() {
        for _ in 0..=index {
            counts.add(*kind);
        }
    }
    // Field i holds i + 1: no two kinds share a count.
    let json = serde_json::to_value(&counts).unwrap();
    for (index, kind) in kinds.iter().enumerate() {
        let name = serde_json::to_value(kind).unwrap();
        assert_eq!(json[name.as_str().unwrap()], index as u64 + 1, "{kind:?}");
    }
    assert_eq!(counts.total(), 36);
}

#[test]
fn the_list_of_breaks_stops_growing_but_the_count_does_not() {
    let mut counts = SoakReport::new(1, SystemTime::UNIX_EPOCH);
    for at in 0..MAX_BREAKS_LISTED as u64 + 50 {
        counts.opened(at > 0);
        counts.broke(Duration::from_millis(at), FailureKind::Reset);
    }
    assert_eq!(counts.long_lived.breaks.len(), MAX_BREAKS_LISTED);
    assert_eq!(
        counts.long_lived.broken.reset,
        MAX_BREAKS_LISTED as u64 + 50
    );
    assert_eq!(counts.long_lived.open, 0);
}

#[test]
fn a_line_has_the_documented_fields() {
    let mut counts = SoakReport::new(4, SystemTime::UNIX_EPOCH + Duration::from_millis(1_500));
    counts.opened(false);
    counts.new_connection(Ok(()));
    counts.broke(Duration::from_millis(2250), FailureKind::Timeout);
    let line = serde_json::to_string(&counts.at(Duration::from_millis(3000))).unwrap();
    let kinds = |timeout| {
        format!(
            r#"{{"refused":0,"reset":0,"timeout":{timeout},"closed":0,"wrong":0,"unreachable":0,"resolve":0,"other":0}}"#
        )
    };
    assert_eq!(
        line,
        format!(
            r#"{{"started_unix_s":1.5,"elapsed_s":3.0,"new":{{"ok":1,"failed":{}}},"long_lived":{{"wanted":4,"open":0,"exchanges":1,"broken":{},"breaks":[{{"at_s":2.25,"kind":"timeout"}}],"replaced":0,"open_failed":{}}},"resolves":{{"ok":0,"late":0,"slowest_s":0.0}},"failures":[]}}"#,
            kinds(0),
            kinds(1),
            kinds(0)
        )
    );
}

#[test]
fn a_lookup_counts_late_from_one_second_and_keeps_the_slowest() {
    let mut counts = SoakReport::new(0, SystemTime::UNIX_EPOCH);
    for millis in [2, 999, 1000, 5012, 40] {
        counts.resolved(Duration::from_millis(millis));
    }
    assert_eq!(
        counts.resolves,
        Resolves {
            ok: 5,
            late: 2,
            slowest_s: 5.012
        }
    );
}

#[test]
fn failures_are_listed_with_their_step_until_the_list_is_full() {
    let mut counts = SoakReport::new(0, SystemTime::UNIX_EPOCH);
    let failure = |at: usize| ListedFailure {
        at_s: at as f64,
        attempt: Attempt::New,
        kind: FailureKind::Timeout,
        step: super::Step::Resolve,
        resolve_s: None,
        error: "nothing within 5s".to_owned(),
    };
    for at in 0..MAX_FAILURES_LISTED + 5 {
        counts.new_connection(Err(FailureKind::Timeout));
        counts.list(failure(at));
    }
    assert_eq!(counts.failures.len(), MAX_FAILURES_LISTED);
    assert_eq!(counts.failures[3], failure(3));
    assert_eq!(counts.new.failed.timeout, MAX_FAILURES_LISTED as u64 + 5);
    let json = serde_json::to_value(&counts.failures[0]).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "at_s": 0.0, "attempt": "new", "kind": "timeout", "step": "resolve",
            "resolve_s": null, "error": "nothing within 5s"
        })
    );
}
