//! Tables for the backoff arithmetic: growth, the cap, and each jitter mode.

use std::time::Duration;

use super::{Backoff, Jitter};

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

fn doubling(initial: Duration, max: Duration, jitter: Jitter) -> Backoff {
    Backoff {
        initial,
        max,
        multiplier: 2,
        jitter,
    }
}

#[test]
fn waits_grow_by_the_multiplier_up_to_the_cap() {
    let plain = doubling(ms(20), ms(150), Jitter::None);
    let waits: Vec<_> = (1..=6).map(|failures| plain.wait(failures, 0.5)).collect();
    assert_eq!(waits, [ms(20), ms(40), ms(80), ms(150), ms(150), ms(150)]);

    let tripling = Backoff {
        multiplier: 3,
        ..doubling(ms(10), ms(1_000), Jitter::None)
    };
    let waits: Vec<_> = (1..=6)
        .map(|failures| tripling.wait(failures, 0.5))
        .collect();
    assert_eq!(waits, [ms(10), ms(30), ms(90), ms(270), ms(810), ms(1_000)]);
}

#[test]
fn edge_counts_and_settings_neither_hang_nor_panic() {
    // (why, settings, failures, expected)
    let cases = [
        (
            "no failure yet counts as the first",
            doubling(ms(20), ms(150), Jitter::None),
            0,
            ms(20),
        ),
        (
            "a count that would overflow any power stays at the cap",
            doubling(ms(20), ms(150), Jitter::None),
            u32::MAX,
            ms(150),
        ),
        (
            "an initial wait above the cap is capped",
            doubling(ms(500), ms(150), Jitter::None),
            1,
            ms(150),
        ),
        (
            "a multiplier of 1 keeps the initial wait",
            Backoff {
                multiplier: 1,
                ..doubling(ms(20), ms(150), Jitter::None)
            },
            u32::MAX,
            ms(20),
        ),
        (
            "a zero initial wait stays zero",
            doubling(Duration::ZERO, ms(150), Jitter::Spread(0.2)),
            u32::MAX,
            Duration::ZERO,
        ),
        (
            "a cap of Duration::MAX saturates instead of overflowing",
            doubling(ms(20), Duration::MAX, Jitter::SpreadPastMax(0.2)),
            u32::MAX,
            Duration::MAX,
        ),
    ];
    for (why, backoff, failures, expected) in cases {
        assert_eq!(backoff.wait(failures, 1.0), expected, "{why}");
    }
}

#[test]
fn each_jitter_mode_moves_the_wait_within_its_band() {
    use Jitter::{Shorten, Spread, SpreadPastMax};
    // A wait of 100 ms at the cap of 100 ms.
    let at_cap = |jitter| doubling(ms(100), ms(100), jitter);
    // (jitter, random, expected wait in ms, why)
    let cases = [
        (Jitter::None, 0.9, 100, "no jitter ignores the sample"),
        (Shorten(0.2), 0.0, 100, "0.0 takes nothing off"),
        (Shorten(0.2), 0.5, 90, "0.5 takes half the share off"),
        (Shorten(0.2), 1.0, 80, "1.0 takes the share off"),
        (Spread(0.2), 0.0, 80, "0.0 is the shortest"),
        (Spread(0.2), 0.5, 100, "0.5 changes nothing"),
        (Spread(0.2), 1.0, 100, "1.0 is capped at max"),
        (SpreadPastMax(0.2), 0.0, 80, "0.0 is the shortest"),
        (SpreadPastMax(0.2), 1.0, 120, "1.0 passes the cap"),
        (Spread(0.2), f64::NAN, 80, "a NaN sample counts as 0.0"),
        (SpreadPastMax(0.2), 7.0, 120, "a sample above 1 is 1"),
        (Shorten(0.2), -3.0, 100, "a sample below 0 is 0"),
        (Shorten(5.0), 1.0, 0, "a share above 1 is 1"),
        (SpreadPastMax(-1.0), 1.0, 100, "a negative share is 0"),
    ];
    for (jitter, random, expected, why) in cases {
        let wait = at_cap(jitter).wait(1, random);
        assert_eq!(wait, ms(expected), "{jitter:?} {random}: {why}");
    }
}

#[test]
fn spread_jitter_below_the_cap_is_not_capped_early() {
    let backoff = doubling(ms(500), Duration::from_secs(150), Jitter::Spread(0.2));
    assert_eq!(backoff.wait(1, 0.0), ms(400));
    assert_eq!(backoff.wait(1, 1.0), ms(600));
    // 0.5 s × 2^8 = 128 s; +20 % would be 153.6 s, capped.
    assert_eq!(backoff.wait(9, 1.0), Duration::from_secs(150));
    assert_eq!(backoff.wait(9, 0.0), ms(102_400));
}
