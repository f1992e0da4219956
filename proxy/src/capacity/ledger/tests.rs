use super::*;

/// Counts of a node of 64 slots and a floor of 4.
fn counts(total: usize, active: usize, held: usize, others_lack: usize) -> Counts {
    Counts {
        limit: 64,
        floor: 4,
        total,
        active,
        held,
        others_lack,
    }
}

#[test]
fn one_more_slot_is_decided_by_the_node_the_floor_the_fair_part_and_the_neighbours_floors() {
    use Refusal::{NodeLimit, PodShare};
    let rows: &[(&str, Counts, Result<(), Refusal>)] = &[
        ("alone on an empty node", counts(0, 1, 0, 0), Ok(())),
        ("alone, one slot short of all", counts(63, 1, 63, 0), Ok(())),
        ("every slot taken", counts(64, 1, 64, 0), Err(NodeLimit)),
        (
            "every slot taken, even below the floor",
            counts(64, 2, 1, 0),
            Err(NodeLimit),
        ),
        (
            "below the floor while a neighbour holds nearly all",
            counts(62, 2, 2, 0),
            Ok(()),
        ),
        (
            "alone, the floors of three idle neighbours kept free",
            counts(51, 1, 51, 12),
            Ok(()),
        ),
        (
            "alone, at what the idle neighbours' floors leave",
            counts(52, 1, 52, 12),
            Err(PodShare),
        ),
        ("two busy pods: under half", counts(40, 2, 31, 0), Ok(())),
        (
            "two busy pods: at half, though slots are free",
            counts(40, 2, 32, 0),
            Err(PodShare),
        ),
        (
            "a newcomer counts itself among the busy ones",
            counts(40, 3, 0, 0),
            Ok(()),
        ),
        (
            "four busy pods: a quarter each",
            counts(60, 4, 16, 0),
            Err(PodShare),
        ),
        (
            "sixty-four busy pods: the floor beats the fair part",
            counts(60, 64, 3, 0),
            Ok(()),
        ),
        (
            "sixty-four busy pods: at the floor",
            counts(60, 64, 4, 0),
            Err(PodShare),
        ),
        (
            "a neighbour's missing floor is kept even from a pod under its fair part",
            counts(60, 2, 28, 4),
            Err(PodShare),
        ),
    ];
    for (reason, counts, expected) in rows {
        assert_eq!(decide(*counts), *expected, "{reason}: {counts:?}");
    }
}

#[test]
fn a_pod_that_pushed_first_leaves_its_neighbour_the_floor_and_is_refused_by_share() {
    let mut ledger = Ledger::new(8, 2);
    let (busy, quiet) = (ledger.join(), ledger.join());
    let admitted = (0..10)
        .filter(|_| matches!(ledger.take(busy), Taken::Admitted { .. }))
        .count();
    assert_eq!(admitted, 6, "the quiet pod's floor of 2 stays free");
    assert_eq!(
        ledger.take(busy),
        Taken::Refused {
            refusal: Refusal::PodShare,
            episode_started: false,
        },
        "the episode started at the seventh"
    );
    for _ in 0..2 {
        assert!(matches!(ledger.take(quiet), Taken::Admitted { .. }));
    }
    assert_eq!(
        ledger.take(quiet),
        Taken::Refused {
            refusal: Refusal::NodeLimit,
            episode_started: true,
        }
    );
    let refused = |pod| ledger.account(pod).map(|account| account.refused);
    assert_eq!(refused(busy), Some([0, 5]));
    assert_eq!(refused(quiet), Some([1, 0]));
}

#[test]
fn a_pod_over_its_share_after_a_neighbour_arrived_is_refused_until_enough_close() {
    let mut ledger = Ledger::new(8, 1);
    let first = ledger.join();
    for _ in 0..8 {
        assert!(matches!(ledger.take(first), Taken::Admitted { .. }));
    }
    // The second pod joins with every slot taken: nothing is taken back.
    let second = ledger.join();
    assert!(matches!(
        ledger.take(second),
        Taken::Refused {
            refusal: Refusal::NodeLimit,
            ..
        }
    ));
    ledger.give_back(first);
    assert!(
        matches!(ledger.take(first), Taken::Refused { .. }),
        "the freed slot is the second pod's floor"
    );
    assert!(matches!(ledger.take(second), Taken::Admitted { .. }));
    // Busy both: half each. The first holds 7 and gives back until under 4.
    for _ in 0..4 {
        ledger.give_back(first);
    }
    assert_eq!(ledger.share_of(first), 4);
    assert!(matches!(ledger.take(first), Taken::Admitted { .. }));
    assert!(matches!(
        ledger.take(first),
        Taken::Refused {
            refusal: Refusal::PodShare,
            ..
        }
    ));
    assert!(matches!(ledger.take(second), Taken::Admitted { .. }));
}

#[test]
fn a_pod_that_left_keeps_its_slots_until_given_back_and_takes_no_new_one() {
    let mut ledger = Ledger::new(8, 2);
    let (leaving, staying) = (ledger.join(), ledger.join());
    assert!(matches!(ledger.take(leaving), Taken::Admitted { .. }));
    assert_eq!(ledger.share_of(staying), 4, "two busy pods, half each");
    assert!(!ledger.leave(leaving), "one slot still held");
    assert_eq!(ledger.share_of(staying), 4, "its connection still counts");
    assert!(
        matches!(ledger.take(leaving), Taken::Refused { .. }),
        "nothing new for a pod no longer served"
    );
    assert!(ledger.give_back(leaving), "its last slot ends the account");
    assert_eq!(ledger.account(leaving), None);
    assert_eq!((ledger.total(), ledger.share_of(staying)), (0, 8));
}

#[test]
fn an_admission_after_refusals_ends_the_episode_with_its_count() {
    let mut ledger = Ledger::new(2, 1);
    let (one, two) = (ledger.join(), ledger.join());
    assert!(matches!(ledger.take(one), Taken::Admitted { .. }));
    assert!(matches!(ledger.take(two), Taken::Admitted { .. }));
    for started in [true, false, false] {
        assert_eq!(
            ledger.take(two),
            Taken::Refused {
                refusal: Refusal::NodeLimit,
                episode_started: started,
            }
        );
    }
    ledger.give_back(one);
    assert_eq!(
        ledger.take(one),
        Taken::Admitted {
            node_episode_ended: Some(3),
            pod_episode_ended: None,
        }
    );
    assert_eq!(
        ledger.take(one),
        Taken::Refused {
            refusal: Refusal::NodeLimit,
            episode_started: true,
        },
        "a new episode"
    );
}

#[test]
fn a_floor_above_the_limit_is_the_limit_and_many_pods_share_what_there_is() {
    let mut ledger = Ledger::new(4, 10);
    let pods: Vec<PodId> = (0..3).map(|_| ledger.join()).collect();
    // Floors of 4 each cannot all be kept: the first come take them.
    assert!(matches!(ledger.take(pods[0]), Taken::Admitted { .. }));
    assert!(matches!(ledger.take(pods[1]), Taken::Admitted { .. }));
    assert!(matches!(ledger.take(pods[2]), Taken::Admitted { .. }));
    assert!(matches!(ledger.take(pods[2]), Taken::Admitted { .. }));
    assert_eq!(ledger.total(), 4);
    assert!(matches!(
        ledger.take(pods[0]),
        Taken::Refused {
            refusal: Refusal::NodeLimit,
            ..
        }
    ));
}
