//! Ctrl-C (SIGINT) and SIGTERM: a watcher thread turns the first one into
//! a flag that the scenario checks between steps and while it waits, so
//! that the scenario returns early and its cluster is torn down by its
//! owner, on the main thread, as on any other return. A second signal ends
//! the process at once, for a teardown that hangs.
//!
//! The teardown itself is the clusters' `Drop`; this file only decides
//! when the scenario stops.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;

/// How often a wait polls its condition: fast enough that a step shows
/// its outcome within a blink, slow enough that polling `kubectl` does not
/// load the machine the cluster runs on.
const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Whether the demo was asked to stop; cheap to clone.
#[derive(Clone, Default)]
pub struct Interrupt {
    asked: Arc<AtomicBool>,
}

impl Interrupt {
    /// Starts the watcher thread.
    pub fn watch() -> Interrupt {
        let interrupt = Interrupt::default();
        let flag = Arc::clone(&interrupt.asked);
        let spawned = std::thread::Builder::new()
            .name("interrupt".into())
            .spawn(move || watch_signals(&flag));
        if let Err(error) = spawned {
            eprintln!("demo: Ctrl-C will not clean up: {error}");
        }
        interrupt
    }

    /// Whether a signal came.
    pub fn asked(&self) -> bool {
        self.asked.load(Ordering::SeqCst)
    }

    /// Fails once a signal came, so that `?` ends the scenario.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.asked() {
            bail!("interrupted");
        }
        Ok(())
    }

    /// Polls `check` until it holds (true) or `timeout` passes (false);
    /// fails at once when a signal comes.
    pub fn wait_until(
        &self,
        timeout: Duration,
        mut check: impl FnMut() -> bool,
    ) -> anyhow::Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check()?;
            if check() {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

/// Sets `flag` at the first SIGINT or SIGTERM; exits at the second.
fn watch_signals(flag: &AtomicBool) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        for signals in 1.. {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            if signals > 1 {
                eprintln!("\ndemo: interrupted again; exiting without removing everything");
                std::process::exit(130);
            }
            eprintln!("\ndemo: interrupted; removing everything once the current step returns");
            flag.store(true, Ordering::SeqCst);
        }
    });
}
