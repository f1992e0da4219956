//! Tables for the refresh time, the backoff and the queue order.

use std::collections::BinaryHeap;

use super::*;

const SEC: Duration = Duration::from_secs(1);

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn refresh_is_at_half_life_brought_forward_by_jitter() {
    // (not_before, not_after, now, jitter, expected refresh)
    let cases = [
        // No jitter: exactly half-life.
        (1_000, 3_000, 1_000, 0.0, at(2_000)),
        // Full jitter: 10% of the 1000 s left taken off.
        (1_000, 3_000, 1_000, 1.0, at(1_900)),
        // Later in life, jitter only shortens what is left.
        (1_000, 3_000, 1_500, 1.0, at(1_950)),
        // Jitter outside 0..=1 is clamped.
        (1_000, 3_000, 1_000, 7.0, at(1_900)),
        (1_000, 3_000, 1_000, -1.0, at(2_000)),
        (1_000, 3_000, 1_000, f64::NAN, at(2_000)),
        // Half-life passed (short TTL with a backdated NotBefore): soon, not now.
        (1_000, 1_130, 1_120, 0.0, at(1_121)),
        // Already expired: still not a busy loop.
        (1_000, 1_130, 5_000, 0.5, at(5_001)),
        // NotAfter before NotBefore: treated as zero lifetime.
        (1_000, 900, 1_000, 0.0, at(1_001)),
    ];
    for (not_before, not_after, now, jitter, expected) in cases {
        assert_eq!(
            refresh_at(at(not_before), at(not_after), at(now), jitter),
            expected,
            "not_before={not_before} not_after={not_after} now={now} jitter={jitter}"
        );
    }
}

#[test]
fn backoff_doubles_with_jitter_up_to_the_maximum() {
    // (attempt, jitter, expected)
    let cases = [
        (1, 0.5, SEC / 2),
        (0, 0.5, SEC / 2),
        (2, 0.5, SEC),
        (3, 0.5, 2 * SEC),
        (4, 0.5, 4 * SEC),
        (1, 0.0, Duration::from_millis(400)),
        (1, 1.0, Duration::from_millis(600)),
        (3, 0.0, Duration::from_millis(1_600)),
        // 0.5 s × 2^9 = 256 s, capped.
        (10, 0.5, BACKOFF.max),
        (10, 0.0, Duration::from_secs(120)),
        (10, 1.0, BACKOFF.max),
        (u32::MAX, 1.0, BACKOFF.max),
        (1, f64::NAN, Duration::from_millis(400)),
    ];
    for (attempt, jitter, expected) in cases {
        assert_eq!(
            BACKOFF.wait(attempt, jitter),
            expected,
            "attempt={attempt} jitter={jitter}"
        );
    }
}

#[test]
fn waiting_connections_go_first_then_prefetch_then_refresh_each_in_arrival_order() {
    let arrivals = [
        (Priority::Refresh, "refresh-1"),
        (Priority::Prefetch, "prefetch-1"),
        (Priority::Waiting, "waiting-1"),
        (Priority::Refresh, "refresh-2"),
        (Priority::Waiting, "waiting-2"),
        (Priority::Prefetch, "prefetch-2"),
    ];
    let mut queue: BinaryHeap<_> = arrivals
        .iter()
        .zip(0..)
        .map(|(&(priority, key), sequence)| QueuedFetch {
            priority,
            sequence,
            key,
        })
        .collect();
    let mut order = Vec::new();
    while let Some(next) = queue.pop() {
        order.push(next.key);
    }
    assert_eq!(
        order,
        [
            "waiting-1",
            "waiting-2",
            "prefetch-1",
            "prefetch-2",
            "refresh-1",
            "refresh-2"
        ]
    );
}
