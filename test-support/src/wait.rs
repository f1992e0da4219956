//! Waiting for something a test or the demo expects to happen soon: the
//! components reload files and reconnect on their own schedule, so checks
//! poll, bounded in time.

use std::time::{Duration, Instant};

/// How often a check is repeated: often enough that a wait ends soon after
/// its condition holds, rarely enough not to load the components checked.
const POLL: Duration = Duration::from_millis(100);

/// Calls `check` until it returns true or `within` has passed; returns
/// whether it did.
pub fn until(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(POLL);
    }
}
