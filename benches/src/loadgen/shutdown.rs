//! Stop requests from outside: SIGTERM (what a harness or an orchestrator
//! sends) and SIGINT (Ctrl-C). The server stops on them; the idle client
//! ends its hold on them.

use std::io;

use tokio::signal::unix::{SignalKind, signal};

/// Listeners for the stop signals, installed up front so that a signal
/// arriving before anyone waits is not lost (and does not kill the process
/// with the default action).
pub struct StopSignals {
    /// SIGTERM.
    terminate: tokio::signal::unix::Signal,
    /// SIGINT.
    interrupt: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Installs the handlers; needs a running runtime.
    pub fn install() -> io::Result<Self> {
        Ok(StopSignals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// Waits for either signal. Cancel safe: a signal that arrives while
    /// nobody waits is kept for the next call.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}
