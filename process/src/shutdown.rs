//! Waiting for the signal that asks a process to stop: SIGTERM (kubelet
//! ending a pod, a rollout) or SIGINT (Ctrl-C). What the process then does
//! (drain, exit) is its own.

use tokio::signal::unix::{Signal, SignalKind};

/// The signal that asked the process to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM.
    Terminate,
    /// SIGINT.
    Interrupt,
}

impl Stop {
    /// The signal's name, for log lines.
    pub fn name(self) -> &'static str {
        match self {
            Self::Terminate => "SIGTERM",
            Self::Interrupt => "SIGINT",
        }
    }
}

/// The handlers of both signals, installed: from then on either signal is
/// caught rather than ending the process.
#[derive(Debug)]
pub struct Shutdown {
    terminate: Option<Signal>,
    interrupt: Option<Signal>,
}

impl Shutdown {
    /// Installs the handlers (inside a tokio runtime). A signal whose
    /// handler cannot be installed is logged and not waited for.
    pub fn listen() -> Shutdown {
        Shutdown {
            terminate: install(SignalKind::terminate(), Stop::Terminate),
            interrupt: install(SignalKind::interrupt(), Stop::Interrupt),
        }
    }

    /// Waits for either signal and says which came. With neither handler
    /// installed this never returns, and the process stops only by other
    /// means (ztunnel's `/quitquitquit`, SIGKILL). Cancel-safe: a signal
    /// that comes while it is not polled is kept for the next poll.
    pub async fn wait(mut self) -> Stop {
        tokio::select! {
            stop = next(&mut self.terminate, Stop::Terminate) => stop,
            stop = next(&mut self.interrupt, Stop::Interrupt) => stop,
        }
    }
}

/// [`Shutdown::listen`], then [`Shutdown::wait`].
pub async fn signal() -> Stop {
    Shutdown::listen().wait().await
}

/// The handler of `kind`, or `None`, logged, when it cannot be installed.
fn install(kind: SignalKind, stop: Stop) -> Option<Signal> {
    match tokio::signal::unix::signal(kind) {
        Ok(signal) => Some(signal),
        Err(error) => {
            tracing::error!(%error, "cannot listen for {}", stop.name());
            None
        }
    }
}

/// Resolves when the signal comes; never without a handler.
async fn next(signal: &mut Option<Signal>, stop: Stop) -> Stop {
    match signal {
        Some(signal) => {
            signal.recv().await;
            stop
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a panic is a failed test

    use std::time::Duration;

    use super::*;

    /// Sends `signal` to this test process, whose handlers are installed.
    fn send(signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    #[tokio::test]
    async fn each_signal_is_caught_and_named() {
        for (signal, stop) in [("-INT", Stop::Interrupt), ("-TERM", Stop::Terminate)] {
            let shutdown = Shutdown::listen();
            send(signal);
            let caught = tokio::time::timeout(Duration::from_secs(10), shutdown.wait()).await;
            assert_eq!(caught.ok(), Some(stop), "{signal}");
        }
    }
}
