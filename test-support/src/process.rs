//! A process a test started, stopped by its own handle when the test is
//! done, with its log shown when the test failed.

use std::path::PathBuf;
use std::process::Child;

/// A child process writing to `log`: killed and reaped on drop, and the
/// log printed on a failing (panicking) test's output.
pub struct LoggedChild {
    child: Child,
    log: PathBuf,
    name: &'static str,
}

impl LoggedChild {
    /// Owns `child`, whose output goes to `log`; `name` heads the log
    /// when it is shown.
    pub fn new(name: &'static str, child: Child, log: PathBuf) -> LoggedChild {
        LoggedChild { child, log, name }
    }
}

impl Drop for LoggedChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- {} log\n{log}", self.name);
        }
    }
}
