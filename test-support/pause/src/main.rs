//! `pause`: the process that holds a pod's namespaces for the test
//! cluster's container runtime, as Kubernetes' own pause does. It sleeps
//! until SIGTERM or SIGINT and then exits 0; on SIGCHLD it reaps every
//! exited child, because as PID 1 of a pod's shared PID namespace it
//! inherits the pod's orphans and their zombies would otherwise stay.
//!
//! The signals are blocked and taken with sigwait(2), not caught by
//! handlers: no code runs in signal context, and the signals still arrive
//! when the process is PID 1 of its namespace, where the kernel drops
//! signals whose action is the default one. The image that carries this
//! binary is built by `scripts/build-images.sh --test-images`.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpid};

/// What the process does on a signal it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    /// Exit with status 0: the runtime is stopping the sandbox.
    Exit,
    /// Collect every child that has exited.
    Reap,
}

impl Action {
    /// The signals this process waits for, and what each one asks of it.
    const SIGNALS: [(Signal, Action); 3] = [
        (Signal::SIGTERM, Action::Exit),
        (Signal::SIGINT, Action::Exit),
        (Signal::SIGCHLD, Action::Reap),
    ];

    /// What `signal` asks of the process; `None` for a signal it does not
    /// wait for.
    fn on(signal: Signal) -> Option<Action> {
        Action::SIGNALS
            .iter()
            .find(|(waited, _)| *waited == signal)
            .map(|(_, action)| *action)
    }
}

fn main() -> ExitCode {
    if std::env::args()
        .skip(1)
        .any(|arg| arg == "-v" || arg == "--version")
    {
        println!("pause {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let mut waited = SigSet::empty();
    for (signal, _) in Action::SIGNALS {
        waited.add(signal);
    }
    // Blocked before anything else, so none of them is lost or takes its
    // default action in between.
    if let Err(errno) = waited.thread_block() {
        eprintln!("pause: blocking signals: {errno}");
        return ExitCode::FAILURE;
    }
    if getpid() != Pid::from_raw(1) {
        eprintln!("pause: not PID 1: orphans of this PID namespace go to its init, not here");
    }
    // Runs for the life of the sandbox, by design; each pass sleeps in
    // sigwait until one of the waited signals arrives.
    loop {
        let signal = match waited.wait() {
            Ok(signal) => signal,
            Err(Errno::EINTR) => continue,
            Err(errno) => {
                eprintln!("pause: waiting for signals: {errno}");
                return ExitCode::FAILURE;
            }
        };
        match Action::on(signal) {
            Some(Action::Exit) => {
                eprintln!("pause: shutting down on {signal}");
                return ExitCode::SUCCESS;
            }
            Some(Action::Reap) => reap_exited_children(),
            None => {}
        }
    }
}

/// Collects every child that has exited. Several exits may have raised one
/// SIGCHLD, so it reaps until none is left; each pass reaps one zombie, and
/// the loop ends when waitpid finds no more (or no child at all).
fn reap_exited_children() {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
            Ok(_) | Err(Errno::EINTR) => {}
            Err(errno) => {
                eprintln!("pause: reaping children: {errno}");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_signals_exit_and_child_exits_reap() {
        let cases = [
            (Signal::SIGTERM, Some(Action::Exit)),
            (Signal::SIGINT, Some(Action::Exit)),
            (Signal::SIGCHLD, Some(Action::Reap)),
            // Not waited for: blocked nowhere, so it keeps its default action.
            (Signal::SIGHUP, None),
            (Signal::SIGUSR1, None),
        ];
        for (signal, action) in cases {
            assert_eq!(Action::on(signal), action, "{signal}");
        }
    }
}
