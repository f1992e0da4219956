//! Keeping the installation in place (KUBERNETES.md B6): inotify on the
//! bin and configuration directories; on any change readiness drops, the
//! installation is checked, and repaired only if it is no longer valid.
//!
//! Repairs are throttled ([`repair_delay`]) so that a primary plugin that
//! rewrites its file each time we do cannot drive a busy loop, and a file
//! rewritten again and again is reported ([`RewriteLog`]). What is checked
//! and written is `install.rs`'s.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use ztunnel_certs::error_chain::ErrorChain;

use super::{ConfOutcome, InstallError, Installer};

/// Least time between two repairs: about one run per 5 s when something
/// keeps undoing our entry, as istio-cni does.
pub const REPAIR_INTERVAL: Duration = Duration::from_secs(5);
/// How long a burst of events (a writer's create, write and rename) is left
/// to finish before the directory is read, so one check sees the end state.
const SETTLE: Duration = Duration::from_millis(100);
/// How long a failed check waits before it is tried again without a new
/// event (the disk may have been full, a file briefly unreadable).
const RETRY: Duration = REPAIR_INTERVAL;
/// The window in which repeated rewrites of one file count as a fight.
pub const FIGHT_WINDOW: Duration = Duration::from_secs(60);
/// Rewrites of one file within [`FIGHT_WINDOW`] that are reported: one
/// rewrite is the primary plugin's normal start-up, a third means it undoes
/// our entry each time.
pub const FIGHT_REWRITES: usize = 3;

/// Runs until `shutdown` resolves: watches both directories, checks once
/// at start (a change between [`Installer::install`] and the watch being
/// set is not missed), then after every change. Readiness is cleared on
/// the way out. Fails only if the directories cannot be watched.
///
/// `shutdown` is polled between steps; file writes happen between awaits,
/// so stopping never leaves a half-done write (each write is a rename
/// anyway).
pub async fn run(
    installer: Installer,
    shutdown: impl Future<Output = ()>,
) -> Result<(), InstallError> {
    let (wake, mut woken) = mpsc::channel::<()>(1);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match &event {
            Ok(event) => is_change(&event.kind),
            Err(error) => {
                tracing::warn!(error = %ErrorChain(&error), "CNI directory watch error; checking the installation");
                true
            }
        };
        if relevant {
            // A full channel already holds a wake-up: nothing is lost.
            let _ = wake.try_send(());
        }
    })
    .map_err(|source| watch_error(&installer.config.conf_dir, source))?;
    for dir in [&installer.config.bin_dir, &installer.config.conf_dir] {
        watcher
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(|source| watch_error(dir, source))?;
    }

    tokio::pin!(shutdown);
    let mut tracker = RepairTracker::default();
    loop {
        let Some(pass) = tracker
            .next_pass(&installer, &mut shutdown, &mut woken)
            .await
        else {
            break;
        };
        let retry = match pass {
            Pass::Done => None,
            Pass::Failed => Some(tokio::time::Instant::now() + RETRY),
        };
        tokio::select! {
            () = &mut shutdown => break,
            woke = woken.recv() => if woke.is_none() { break },
            () = sleep_until(retry), if retry.is_some() => {}
        }
        installer.state.set_ready(false);
    }
    installer.state.set_ready(false);
    drop(watcher);
    Ok(())
}

fn watch_error(path: &Path, source: notify::Error) -> InstallError {
    InstallError::Watch {
        path: path.to_owned(),
        source,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    if let Some(deadline) = deadline {
        tokio::time::sleep_until(deadline).await;
    }
}

/// How one check ended.
enum Pass {
    /// Installed, repaired, or waiting for a configuration.
    Done,
    /// An error; tried again after [`RETRY`].
    Failed,
}

/// The watch loop's memory of its own repairs.
#[derive(Debug, Default)]
struct RepairTracker {
    /// When the last repair wrote something.
    last_repair: Option<Instant>,
    /// Recent configuration rewrites.
    rewrites: RewriteLog,
}

impl RepairTracker {
    /// Lets events settle, checks, and repairs if needed once
    /// [`repair_delay`] allows. `None` if `shutdown` resolved meanwhile.
    async fn next_pass(
        &mut self,
        installer: &Installer,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
        woken: &mut mpsc::Receiver<()>,
    ) -> Option<Pass> {
        pause(SETTLE, shutdown, woken).await?;
        match installer.is_installed() {
            Ok(true) => {
                installer.state.set_ready(true);
                return Some(Pass::Done);
            }
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(error = %ErrorChain(&error), "checking the CNI plugin installation");
                return Some(Pass::Failed);
            }
        }
        let delay = repair_delay(self.last_repair, Instant::now());
        if !delay.is_zero() {
            pause(delay, shutdown, woken).await?;
        }
        match installer.check_and_repair() {
            Ok(outcome) => {
                let now = Instant::now();
                if outcome.binary_copied {
                    self.last_repair = Some(now);
                }
                if let ConfOutcome::Written(path) = &outcome.conf {
                    self.last_repair = Some(now);
                    if let Some(count) = self.rewrites.record(path, now) {
                        tracing::warn!(
                            path = %path.display(),
                            rewrites = count,
                            window = ?FIGHT_WINDOW,
                            "our CNI entry keeps being removed from this file: another \
                             plugin or installer is rewriting it (with Cilium, set \
                             cni.exclusive=false)"
                        );
                    }
                }
                Some(Pass::Done)
            }
            Err(error) => {
                tracing::warn!(error = %ErrorChain(&error), "repairing the CNI plugin installation");
                Some(Pass::Failed)
            }
        }
    }
}

/// Sleeps for `duration`, then drops the wake-ups that arrived meanwhile
/// (the check that follows covers them). `None` if `shutdown` resolved.
async fn pause(
    duration: Duration,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    woken: &mut mpsc::Receiver<()>,
) -> Option<()> {
    tokio::select! {
        () = shutdown.as_mut() => return None,
        () = tokio::time::sleep(duration) => {}
    }
    while woken.try_recv().is_ok() {}
    Some(())
}

/// Whether an inotify event can change what is installed. Opening, reading
/// and closing without writing cannot, and runtimes and our own checks do
/// them all the time.
pub fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// How long to wait before the next repair so that repairs are at least
/// [`REPAIR_INTERVAL`] apart.
pub fn repair_delay(last_repair: Option<Instant>, now: Instant) -> Duration {
    last_repair.map_or(Duration::ZERO, |last| {
        REPAIR_INTERVAL.saturating_sub(now.saturating_duration_since(last))
    })
}

/// Recent rewrites of configuration files, to notice one file being
/// rewritten again and again.
#[derive(Debug, Default)]
pub struct RewriteLog {
    /// Rewrites within the last [`FIGHT_WINDOW`], oldest first.
    recent: VecDeque<(PathBuf, Instant)>,
}

impl RewriteLog {
    /// Records a rewrite of `path` at `now`; returns how many rewrites of
    /// it fell within [`FIGHT_WINDOW`] when that is [`FIGHT_REWRITES`] or
    /// more.
    pub fn record(&mut self, path: &Path, now: Instant) -> Option<usize> {
        while self
            .recent
            .front()
            .is_some_and(|(_, at)| now.saturating_duration_since(*at) >= FIGHT_WINDOW)
        {
            self.recent.pop_front();
        }
        self.recent.push_back((path.to_owned(), now));
        let count = self.recent.iter().filter(|(seen, _)| seen == path).count();
        (count >= FIGHT_REWRITES).then_some(count)
    }
}
