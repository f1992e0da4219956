//! Entering a pod's network namespace and running tools there.
//!
//! [`run_in`] runs a closure on a fresh thread that has `setns`'d into the
//! pod's netns; the thread ends with the closure, so no thread of the
//! async runtime ever changes namespace. A child process started from that
//! thread (`iptables-restore`, `ip`) inherits the thread's netns, because
//! namespaces belong to the task that forks. [`command`] bounds each child
//! in time and kills it, by PID, if it overruns.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Longest a rule tool may run. iptables-restore waits up to 5 s for the
/// xtables lock (`--wait=5`); the rest is margin for a loaded node.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `f` inside the netns at `path`, on its own thread.
pub fn run_in<R: Send>(path: &Path, f: impl FnOnce() -> R + Send) -> Result<R, NetnsError> {
    let file = File::open(path).map_err(|source| NetnsError::Open {
        path: path.to_owned(),
        source,
    })?;
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                setns(&file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
                    path: path.to_owned(),
                    source,
                })?;
                Ok(f())
            })
            .join()
            .map_err(|_| NetnsError::ThreadPanicked)?
    })
}

/// Runs `program` with `args` (and `stdin`) in the calling thread's netns
/// and returns its stdout; a non-zero exit is an error carrying stderr.
/// The whole run, stdin included, is bounded by `COMMAND_TIMEOUT`.
pub fn command(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, NetnsError> {
    let failed = |detail: String| NetnsError::Command {
        command: format!("{program} {}", args.join(" ")),
        detail,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| failed(error.to_string()))?;
    // Stdin is written on a thread of its own while the child runs, so a
    // child that fills its stdout before reading all of stdin cannot stall
    // the write outside the timeout. Killing the child ends the write
    // (broken pipe); the pipe closes when the thread drops it.
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let written = match (stdin, child.stdin.take()) {
        (Some(input), Some(mut pipe)) => {
            let input = input.to_owned();
            let (wrote, written) = mpsc::channel();
            std::thread::spawn(move || {
                let _ = wrote.send(pipe.write_all(input.as_bytes()));
            });
            Some(written)
        }
        _ => None,
    };
    let pid = child.id();
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let output = match finished.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(output) => output.map_err(|error| failed(error.to_string()))?,
        Err(_) => {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            return Err(failed(format!("did not finish within {COMMAND_TIMEOUT:?}")));
        }
    };
    if !output.status.success() {
        return Err(failed(format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    // A child that succeeded without taking all its input is still a
    // failure: it acted on part of it.
    if let Some(written) = written {
        match written.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(failed(format!("writing stdin: {error}"))),
            Err(_) => return Err(failed("stdin was not taken in time".into())),
        }
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Why a netns could not be entered or a tool failed in it.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The netns path cannot be opened (the pod is gone, or the path is wrong).
    #[error("cannot open netns {path}")]
    Open {
        /// The netns path.
        path: PathBuf,
        /// The open error.
        source: std::io::Error,
    },
    /// `setns` failed: the path is not a network namespace, or we lack
    /// CAP_SYS_ADMIN.
    #[error("cannot enter netns {path}")]
    Enter {
        /// The netns path.
        path: PathBuf,
        /// The setns error.
        source: nix::Error,
    },
    /// A tool failed, or could not be run.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// Exit status and stderr, or the spawn error.
        detail: String,
    },
    /// The thread inside the netns panicked.
    #[error("the thread inside the netns panicked")]
    ThreadPanicked,
}
