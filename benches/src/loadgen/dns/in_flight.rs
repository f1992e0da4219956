//! The queries the `dns` client has sent and not yet had answered: each
//! under an id of its own, until its reply closes it or its time runs out.
//! A pure book over ids and instants, time passed in; the client's loop
//! (`dns.rs`) moves the bytes and reads the clock.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

/// One query waiting for its reply.
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// Which of the run's names it asked.
    name: usize,
    /// When it was sent.
    sent: Instant,
    /// Which opening this is, so that an expiry entry left behind by a
    /// closed query does not expire a later query under the same id.
    opening: u64,
}

/// The queries in flight, by id, and their expiry order.
#[derive(Debug)]
pub struct InFlight {
    /// How long a reply may take before its query counts as timed out.
    timeout: Duration,
    /// The open queries by id.
    pending: HashMap<u16, Pending>,
    /// (id, opening, deadline) in the order sent, so oldest first: every
    /// query has the same timeout. Entries of queries already closed stay
    /// until they reach the front, where they are skipped.
    deadlines: VecDeque<(u16, u64, Instant)>,
    /// The next id to try.
    next_id: u16,
    /// Openings so far.
    openings: u64,
}

/// A reply matched to its query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed {
    /// Which of the run's names the query asked.
    pub name: usize,
    /// From its send to its reply.
    pub latency: Duration,
}

impl InFlight {
    /// An empty book whose queries time out after `timeout`.
    pub fn new(timeout: Duration) -> InFlight {
        InFlight {
            timeout,
            pending: HashMap::new(),
            deadlines: VecDeque::new(),
            next_id: 0,
            openings: 0,
        }
    }

    /// Queries open.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether no query is open.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Opens a query for name `name`, sent at `now`, and returns its id:
    /// the next one not in use. `None` only with all 65,536 ids open.
    pub fn open(&mut self, name: usize, now: Instant) -> Option<u16> {
        if self.pending.len() > usize::from(u16::MAX) {
            return None;
        }
        let mut id = self.next_id;
        while self.pending.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        self.next_id = id.wrapping_add(1);
        self.openings += 1;
        let opening = self.openings;
        self.pending.insert(
            id,
            Pending {
                name,
                sent: now,
                opening,
            },
        );
        self.deadlines.push_back((id, opening, now + self.timeout));
        Some(id)
    }

    /// Closes the query of `id` on a reply at `now`; `None` when no query
    /// of that id is open (a reply after its query timed out, or a stray).
    pub fn close(&mut self, id: u16, now: Instant) -> Option<Closed> {
        let pending = self.pending.remove(&id)?;
        Some(Closed {
            name: pending.name,
            latency: now.saturating_duration_since(pending.sent),
        })
    }

    /// The name the open query of `id` asked, without closing it.
    pub fn name_of(&self, id: u16) -> Option<usize> {
        self.pending.get(&id).map(|pending| pending.name)
    }

    /// Closes every query whose time has run out at `now` and returns how
    /// many there were.
    pub fn expire(&mut self, now: Instant) -> u64 {
        let mut expired = 0;
        while let Some(&(id, opening, deadline)) = self.deadlines.front() {
            let open = self
                .pending
                .get(&id)
                .is_some_and(|pending| pending.opening == opening);
            if open && deadline > now {
                break;
            }
            self.deadlines.pop_front();
            if open {
                self.pending.remove(&id);
                expired += 1;
            }
        }
        expired
    }

    /// When the oldest open query runs out of time, if one is open.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(&(id, opening, deadline)) = self.deadlines.front() {
            let open = self
                .pending
                .get(&id)
                .is_some_and(|pending| pending.opening == opening);
            if open {
                return Some(deadline);
            }
            self.deadlines.pop_front();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(100);

    fn ms(count: u64) -> Duration {
        Duration::from_millis(count)
    }

    #[test]
    fn a_reply_closes_its_query_with_the_time_it_took() {
        let t0 = Instant::now();
        let mut book = InFlight::new(TIMEOUT);
        let first = book.open(0, t0).unwrap();
        let second = book.open(1, t0 + ms(1)).unwrap();
        assert_ne!(first, second);
        assert_eq!(book.name_of(second), Some(1));
        assert_eq!(
            book.close(second, t0 + ms(5)),
            Some(Closed {
                name: 1,
                latency: ms(4)
            })
        );
        // A second reply to the same id, or one to an id never used.
        assert_eq!(book.close(second, t0 + ms(6)), None);
        assert_eq!(book.close(first.wrapping_add(100), t0 + ms(6)), None);
        assert_eq!(book.len(), 1);
    }

    #[test]
    fn queries_time_out_oldest_first_and_a_late_reply_is_no_match() {
        let t0 = Instant::now();
        let mut book = InFlight::new(TIMEOUT);
        let a = book.open(0, t0).unwrap();
        let b = book.open(0, t0 + ms(10)).unwrap();
        let c = book.open(0, t0 + ms(20)).unwrap();
        book.close(b, t0 + ms(30));
        assert_eq!(book.next_deadline(), Some(t0 + ms(100)));
        assert_eq!(book.expire(t0 + ms(99)), 0);
        assert_eq!(book.expire(t0 + ms(100)), 1);
        // b was answered: its entry is skipped, c is next.
        assert_eq!(book.next_deadline(), Some(t0 + ms(120)));
        assert_eq!(book.close(a, t0 + ms(101)), None);
        assert_eq!(book.expire(t0 + ms(500)), 1);
        assert!(book.is_empty());
        assert_eq!(book.next_deadline(), None);
        assert_eq!(book.close(c, t0 + ms(501)), None);
    }

    #[test]
    fn an_id_in_use_is_skipped_and_a_reused_id_keeps_its_own_deadline() {
        let t0 = Instant::now();
        let mut book = InFlight::new(TIMEOUT);
        let ids: Vec<u16> = (0..3).map(|_| book.open(0, t0).unwrap()).collect();
        assert_eq!(ids, [0, 1, 2]);
        book.close(1, t0 + ms(1));
        // After wrapping around, ids 0 and 2 are still open and 1 is free.
        book.next_id = 0;
        assert_eq!(book.open(0, t0 + ms(50)), Some(1));
        assert_eq!(book.open(0, t0 + ms(50)), Some(3));
        // The first query of id 1 was closed: its old deadline at 100 ms
        // must not expire the query now open under id 1 (deadline 150 ms).
        assert_eq!(book.expire(t0 + ms(100)), 2);
        assert_eq!(book.name_of(1), Some(0));
        assert_eq!(book.expire(t0 + ms(150)), 2);
        assert!(book.is_empty());
    }
}
