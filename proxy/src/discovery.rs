//! The local config file as a source of the proxy's state: loaded at
//! start-up, then watched and reloaded when its content changes, through
//! the same [`SharedState`] that delta xDS (`xds.rs`) writes.
//!
//! The file's format lives in `config/local.rs`; the store in `state.rs`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ztunnel_certs::error_chain::ErrorChain;

use crate::config::local::{self, LocalConfigError};
use crate::state::{SharedState, State};

/// How often the local file is checked for changes. A second is quick
/// enough for an operator's edit and costs one small read.
pub const LOCAL_FILE_POLL: Duration = Duration::from_secs(1);

/// Loads the local file at start-up: an invalid file is a start-up error
/// naming the file, line and problem.
pub fn load_local_file(path: &Path) -> Result<(State, FileVersion), LocalConfigError> {
    let read_error = |source| LocalConfigError::Read {
        path: path.to_owned(),
        source,
    };
    // Stamped before reading: an edit in between changes the stamp, and the
    // watcher reads the file again.
    let stamp = Stamp::of(&std::fs::metadata(path).map_err(read_error)?);
    let text = std::fs::read_to_string(path).map_err(read_error)?;
    let config = local::parse(&text, path)?;
    let version = FileVersion {
        stamp,
        digest: digest(&text),
    };
    Ok((config.into_state(), version))
}

/// What the watcher remembers of the file it last read: its metadata, so
/// that a poll of an untouched file reads nothing, and the SHA-256 of its
/// content, so that a touched but unchanged file is not parsed again. Not
/// the text itself: that is a few MB for a mesh of 10,000 workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileVersion {
    stamp: Stamp,
    digest: [u8; 32],
}

/// The metadata a write changes: size, modification and change times, and
/// the inode (a ConfigMap update swaps the file for another).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    device: u64,
    inode: u64,
    len: u64,
    modified: (i64, i64),
    changed: (i64, i64),
}

impl Stamp {
    fn of(metadata: &std::fs::Metadata) -> Self {
        Stamp {
            device: metadata.dev(),
            inode: metadata.ino(),
            len: metadata.len(),
            modified: (metadata.mtime(), metadata.mtime_nsec()),
            changed: (metadata.ctime(), metadata.ctime_nsec()),
        }
    }
}

/// The SHA-256 of `text`.
fn digest(text: &str) -> [u8; 32] {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, text.as_bytes());
    let mut bytes = [0; 32];
    bytes.copy_from_slice(digest.as_ref());
    bytes
}

/// Watches the local file and replaces the state when its content changes.
/// A bad edit keeps the last good state and logs why. Ends when `stop`
/// resolves.
pub async fn watch_local_file(
    path: PathBuf,
    mut last: FileVersion,
    shared: SharedState,
    interval: Duration,
    stop: impl Future<Output = ()>,
) {
    let mut stop = std::pin::pin!(stop);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = ticker.tick() => {}
        }
        let read = async {
            let stamp = Stamp::of(&tokio::fs::metadata(&path).await?);
            if stamp == last.stamp {
                return Ok(None);
            }
            Ok(Some((stamp, tokio::fs::read_to_string(&path).await?)))
        };
        let (stamp, text) = match read.await {
            Ok(Some(read)) => read,
            Ok(None) => continue,
            Err(error) => {
                let error: std::io::Error = error;
                tracing::warn!(path = %path.display(), error = %ErrorChain(&error), "cannot read the local config file; keeping the last good state");
                continue;
            }
        };
        let version = FileVersion {
            stamp,
            digest: digest(&text),
        };
        let unchanged = version.digest == last.digest;
        last = version;
        if unchanged {
            continue;
        }
        match local::parse(&text, &path) {
            Ok(config) => {
                shared.update(|state| config.apply(state));
                crate::memory::give_back();
                tracing::info!(path = %path.display(), "local config file reloaded");
            }
            Err(error) => {
                tracing::error!(error = %ErrorChain(&error), "invalid local config file; keeping the last good state");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str = "\
workloads:
- uid: uid-a
  name: a
  namespace: default
  workloadIps: [198.18.0.10]
  protocol: HBONE
  services: {}
";

    #[tokio::test]
    async fn a_bad_edit_keeps_the_last_good_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("local.yaml");
        std::fs::write(&path, ONE).unwrap();
        let (state, version) = load_local_file(&path).unwrap();
        let shared = SharedState::new(state);
        let mut changes = shared.subscribe();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let watcher = tokio::spawn(watch_local_file(
            path.clone(),
            version,
            shared.clone(),
            Duration::from_millis(10),
            async move {
                let _ = stopped.await;
            },
        ));

        std::fs::write(&path, "workloads: [ {uid: x, bogus: 1} ]").unwrap();
        // Twenty polls: the watcher has read the bad edit by then.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            shared.read().workload("uid-a").is_some(),
            "bad edit must keep state"
        );
        assert!(!changes.has_changed().unwrap());

        std::fs::write(&path, ONE.replace("uid-a", "uid-b")).unwrap();
        changes.changed().await.unwrap();
        assert!(shared.read().workload("uid-a").is_none());
        assert!(shared.read().workload("uid-b").is_some());

        // Written again with the same content: read (the stamp changed),
        // not applied (the digest did not).
        changes.mark_unchanged();
        std::fs::write(&path, ONE.replace("uid-a", "uid-b")).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!changes.has_changed().unwrap(), "same content, no update");
        // An edit of the same size, seen through the stamp's times.
        std::fs::write(&path, ONE.replace("uid-a", "uid-c")).unwrap();
        changes.changed().await.unwrap();
        assert!(shared.read().workload("uid-c").is_some());

        stop.send(()).unwrap();
        watcher.await.unwrap();
    }

    #[test]
    fn only_authorization_changes_wake_the_policy_recheck() {
        let shared = SharedState::new(State::new());
        let mut every = shared.subscribe();
        let mut authorization = shared.subscribe_authorization();
        let removed = shared.apply(|state| state.remove_workload("none").is_some(), false);
        assert!(!removed);
        assert!(every.has_changed().unwrap());
        assert!(!authorization.has_changed().unwrap());
        every.mark_unchanged();
        shared.apply(|_| (), true);
        assert!(every.has_changed().unwrap() && authorization.has_changed().unwrap());
        authorization.mark_unchanged();
        shared.update(|_| ());
        assert!(authorization.has_changed().unwrap());
    }

    #[test]
    fn an_invalid_file_at_start_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("local.yaml");
        std::fs::write(&path, "workloads:\n- uid: a\n  surprise: 1\n").unwrap();
        let error = load_local_file(&path).err().unwrap().to_string();
        assert!(error.contains("local.yaml"), "{error}");
        assert!(error.contains("line"), "{error}");
    }
}
