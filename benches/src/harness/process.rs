//! What a proxy process spent, read from `/proc`: CPU time (user and
//! system, every thread, also those that exited) and resident memory (now
//! and peak).
//! Sampling during a run is in `harness/scenario.rs`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, bail};

/// Kernel clock ticks per second when `getconf` cannot say: the value of
/// every mainstream Linux build.
const DEFAULT_TICKS_PER_SECOND: u64 = 100;

/// One observed process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Process {
    /// Its PID.
    pub pid: u32,
}

/// CPU time of a process, in seconds, split as the kernel counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTime {
    /// In user space (`utime`).
    pub user_s: f64,
    /// In the kernel on its behalf (`stime`), including softirq work done
    /// in its context.
    pub system_s: f64,
}

impl CpuTime {
    /// User and system together.
    pub fn total_s(self) -> f64 {
        self.user_s + self.system_s
    }

    /// What was spent from `before` to `self`.
    pub fn since(self, before: CpuTime) -> CpuTime {
        CpuTime {
            user_s: self.user_s - before.user_s,
            system_s: self.system_s - before.system_s,
        }
    }
}

/// Memory figures of a process, in KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident now (`VmRSS`).
    pub rss_kib: u64,
    /// Highest resident since start or the last [`Process::reset_peak`]
    /// (`VmHWM`).
    pub peak_kib: u64,
}

impl Process {
    /// CPU time used so far, user and system, by every thread the process
    /// has had.
    pub fn cpu(self) -> anyhow::Result<CpuTime> {
        let path = self.file("stat");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        // The command name (field 2) is in parentheses and may hold spaces:
        // fields are counted after its closing parenthesis.
        let after_name = text
            .rsplit_once(')')
            .map(|(_, rest)| rest)
            .with_context(|| format!("{}: no command name", path.display()))?;
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the file; after the name,
        // field 3 (state) has index 0, so they have indexes 11 and 12.
        let ticks = |index: usize| -> anyhow::Result<u64> {
            fields
                .get(index)
                .and_then(|field| field.parse().ok())
                .with_context(|| format!("{}: field {} missing", path.display(), index + 3))
        };
        let per_second = ticks_per_second() as f64;
        Ok(CpuTime {
            user_s: ticks(11)? as f64 / per_second,
            system_s: ticks(12)? as f64 / per_second,
        })
    }

    /// Resident memory now and at its peak.
    pub fn memory(self) -> anyhow::Result<Memory> {
        let path = self.file("status");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let field = |name: &str| -> anyhow::Result<u64> {
            text.lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
                .with_context(|| format!("{}: no {name}", path.display()))
        };
        Ok(Memory {
            rss_kib: field("VmRSS:")?,
            peak_kib: field("VmHWM:")?,
        })
    }

    /// Starts a new peak: the kernel resets `VmHWM` to the current RSS.
    pub fn reset_peak(self) -> anyhow::Result<()> {
        let path = self.file("clear_refs");
        // "5" resets the peak resident set size (proc(5)).
        std::fs::write(&path, "5").with_context(|| format!("writing {}", path.display()))
    }

    /// Fails unless the process is alive.
    pub fn check_alive(self) -> anyhow::Result<()> {
        if self.file("stat").exists() {
            return Ok(());
        }
        bail!("process {} is gone", self.pid)
    }

    fn file(self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/{name}", self.pid))
    }
}

/// `getconf CLK_TCK`, asked once.
fn ticks_per_second() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|output| String::from_utf8(output.stdout).ok())
            .and_then(|text| text.trim().parse().ok())
            .filter(|ticks| *ticks > 0)
            .unwrap_or(DEFAULT_TICKS_PER_SECOND)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_cpu_and_memory() {
        let me = Process {
            pid: std::process::id(),
        };
        let before = me.cpu().unwrap();
        // Burn a little CPU so the counter moves by at least one tick.
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = me.cpu().unwrap();
        assert!(
            after.total_s() > before.total_s(),
            "{before:?} -> {after:?}"
        );
        // A busy loop in user space: user time moved, neither went back.
        let spent = after.since(before);
        assert!(spent.user_s > 0.0 && spent.system_s >= 0.0, "{spent:?}");
        let memory = me.memory().unwrap();
        assert!(memory.rss_kib > 0 && memory.peak_kib >= memory.rss_kib);
    }
}
