//! Where a proxy's time goes, with `perf` (`--perf`): system calls and
//! context switches counted during a run (`perf stat`, every thread of the
//! process at the start of the run), and a flat CPU profile of the run
//! (`perf record` at about 1 kHz, summarised by `perf report` by shared
//! object and by symbol). Both attach to a running process by PID and stop
//! on SIGINT, so the run measures the process as it is.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;

use crate::harness::process::Process;

/// The events counted per run: every system call entered, and every
/// context switch of the process's threads.
const EVENTS: &str = "raw_syscalls:sys_enter,context-switches";
/// Samples per second of the CPU profile: a prime, so sampling does not
/// beat with periodic work.
const PROFILE_HZ: &str = "997";
/// How long perf may take to write its results after SIGINT.
const STOP_LIMIT: Duration = Duration::from_secs(60);
/// Entries of a profile's report below this share are left out.
const REPORT_PERCENT_LIMIT: &str = "0.5";

/// What one process did during a run, as `perf stat` counted it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// System calls entered.
    pub syscalls: u64,
    /// Context switches, voluntary and not.
    pub context_switches: u64,
}

/// `perf stat` and `perf record` attached to the proxies of one run.
pub struct Perf {
    /// Per proxy: the counting perf and its output file.
    counting: Vec<(Child, PathBuf)>,
    /// Per proxy: the recording perf and its data file.
    recording: Vec<(Child, PathBuf)>,
}

impl Perf {
    /// Attaches to every process of `proxies`; files are named
    /// `<dir>/<name>-<index>.{stat,data}`.
    pub fn start(proxies: &[Process], dir: &Path, name: &str) -> anyhow::Result<Perf> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut perf = Perf {
            counting: Vec::new(),
            recording: Vec::new(),
        };
        for (index, proxy) in proxies.iter().enumerate() {
            let stat = dir.join(format!("{name}-{index}.stat"));
            let counting = attach(&["stat", "-x", ",", "-e", EVENTS], &stat, *proxy)
                .context("starting perf stat (is perf installed?)")?;
            perf.counting.push((counting, stat));
            let data = dir.join(format!("{name}-{index}.data"));
            let recording = attach(&["record", "-q", "-F", PROFILE_HZ], &data, *proxy)
                .context("starting perf record")?;
            perf.recording.push((recording, data));
        }
        Ok(perf)
    }

    /// Stops every perf; returns each proxy's counts (`None` where perf
    /// gave none) and writes each profile's summary beside its data as
    /// `.txt`, removing the data.
    pub fn stop(self) -> Vec<Option<Counts>> {
        let mut counts = Vec::new();
        for (child, stat) in self.counting {
            stop(child);
            counts.push(
                std::fs::read_to_string(&stat)
                    .ok()
                    .and_then(|text| parse_stat(&text)),
            );
        }
        for (child, data) in self.recording {
            stop(child);
            if let Err(error) = summarise(&data) {
                eprintln!("bench: profile {}: {error:#}", data.display());
            }
            let _ = std::fs::remove_file(&data);
        }
        counts
    }
}

/// Starts `perf <args> -o <output> -p <pid of process>`, with no input and
/// its chatter discarded.
fn attach(args: &[&str], output: &Path, process: Process) -> std::io::Result<Child> {
    Command::new("perf")
        .args(args)
        .arg("-o")
        .arg(output)
        .args(["-p", &process.pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
}

/// Stops one perf as a terminal would (SIGINT, on which it writes its
/// results), by its PID; killed if it has not finished in time.
fn stop(mut child: Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGINT);
    }
    let finished =
        ztunnel_test_support::wait::until(STOP_LIMIT, || matches!(child.try_wait(), Ok(Some(_))));
    if !finished {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Writes `<data>.txt`: the profile by shared object (where user and
/// kernel time go), then by symbol.
fn summarise(data: &Path) -> anyhow::Result<()> {
    let mut text = String::new();
    for sort in ["dso", "dso,sym"] {
        let output = Command::new("perf")
            .args(["report", "--stdio", "--no-children", "--sort", sort])
            .args(["--percent-limit", REPORT_PERCENT_LIMIT, "-i"])
            .arg(data)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .context("running perf report")?;
        text.push_str(&String::from_utf8_lossy(&output.stdout));
    }
    std::fs::write(data.with_extension("txt"), text)?;
    Ok(())
}

/// The counts in `perf stat -x ,` output: `value,unit,event,...` per line;
/// `None` unless both events were counted.
fn parse_stat(text: &str) -> Option<Counts> {
    let mut syscalls = None;
    let mut context_switches = None;
    for line in text.lines() {
        let mut fields = line.split(',');
        let (Some(value), Some(_unit), Some(event)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Ok(value) = value.trim().parse::<u64>() else {
            continue;
        };
        match event.trim() {
            "raw_syscalls:sys_enter" => syscalls = Some(value),
            "context-switches" => context_switches = Some(value),
            _ => {}
        }
    }
    Some(Counts {
        syscalls: syscalls?,
        context_switches: context_switches?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_counts_from_perf_stat_csv() {
        let text = "# started on Mon Dec  7 18:50:00 2026\n\n\
                    109,,raw_syscalls:sys_enter,1295203,100.00,,\n\
                    7,,context-switches,1295203,100.00,,\n";
        assert_eq!(
            parse_stat(text),
            Some(Counts {
                syscalls: 109,
                context_switches: 7
            })
        );
        // An event perf could not count leaves no figure.
        let missing =
            "<not counted>,,raw_syscalls:sys_enter,0,0.00,,\n7,,context-switches,1,100.00,,\n";
        assert_eq!(parse_stat(missing), None);
        assert_eq!(parse_stat(""), None);
    }

    /// Counts a process of ours with the real perf, where it can run.
    #[test]
    fn counts_a_running_process() {
        let mut busy = match Command::new("sh")
            .args(["-c", "while :; do cat /proc/self/stat >/dev/null; done"])
            .stdout(Stdio::null())
            .spawn()
        {
            Ok(child) => child,
            Err(error) => panic!("cannot start sh: {error}"),
        };
        let dir = tempfile::tempdir().unwrap();
        let process = Process { pid: busy.id() };
        let perf = match Perf::start(&[process], dir.path(), "busy") {
            Ok(perf) => perf,
            Err(error) => {
                let _ = busy.kill();
                let _ = busy.wait();
                ztunnel_test_support::skip::skip(format!("{error:#}"));
                return;
            }
        };
        std::thread::sleep(Duration::from_millis(500));
        let counts = perf.stop();
        let _ = busy.kill();
        let _ = busy.wait();
        let Some(Some(counts)) = counts.first().copied() else {
            ztunnel_test_support::skip::skip(format!(
                "perf stat counted nothing here (not root, or perf_event_paranoid): {counts:?}"
            ));
            return;
        };
        // The shell forks and reads: it enters system calls, and switches.
        assert!(counts.syscalls > 100, "{counts:?}");
        assert!(counts.context_switches > 0, "{counts:?}");
        let summary = std::fs::read_to_string(dir.path().join("busy-0.txt")).unwrap();
        assert!(summary.contains("Overhead"), "{summary}");
        assert!(!dir.path().join("busy-0.data").exists());
    }
}
