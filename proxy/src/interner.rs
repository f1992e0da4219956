//! One shared copy of the values many open connections carry alike: the
//! metric label set and the access log's description of the two ends are
//! the same for every connection between the same two workloads, and ten
//! thousand such connections need each once, not ten thousand times.
//!
//! Values no connection holds any more are dropped whenever the table has
//! doubled since the last sweep, so it stays near the number of distinct
//! values in use, not the number ever seen.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

/// The fewest values kept before a sweep is worth its cost.
pub const SWEEP_MIN: usize = 1024;

/// Shares equal values; cheap to clone (one reference count).
#[derive(Debug)]
pub struct Interner<T> {
    table: Arc<Mutex<Table<T>>>,
}

#[derive(Debug)]
struct Table<T> {
    values: HashSet<Arc<T>>,
    sweep_at: usize,
}

impl<T> Clone for Interner<T> {
    fn clone(&self) -> Self {
        Interner {
            table: Arc::clone(&self.table),
        }
    }
}

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            table: Arc::new(Mutex::new(Table {
                values: HashSet::new(),
                sweep_at: 0,
            })),
        }
    }
}

impl<T: Hash + Eq> Interner<T> {
    /// The shared copy of `value`.
    pub fn intern(&self, value: T) -> Arc<T> {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(shared) = table.values.get(&value) {
            return Arc::clone(shared);
        }
        if table.values.len() >= table.sweep_at.max(SWEEP_MIN) {
            // Held only here: no open connection uses it.
            table.values.retain(|shared| Arc::strong_count(shared) > 1);
            table.sweep_at = table.values.len() * 2;
        }
        let shared = Arc::new(value);
        table.values.insert(Arc::clone(&shared));
        shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_copy_and_unused_ones_are_swept() {
        let interner = Interner::default();
        let first = interner.intern("client".to_owned());
        let second = interner.intern("client".to_owned());
        assert!(Arc::ptr_eq(&first, &second));

        // Many distinct values taken and let go one after the other: the
        // table stays near the number in use, not the number seen.
        for n in 0..4 * SWEEP_MIN {
            drop(interner.intern(format!("client-{n}")));
        }
        let kept = interner.table.lock().unwrap().values.len();
        assert!(kept <= SWEEP_MIN + 1, "{kept} kept");
        // Values still held survive every sweep.
        assert!(Arc::ptr_eq(&first, &interner.intern("client".to_owned())));
    }
}
