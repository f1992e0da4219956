//! The local config file as a source of the proxy's state: loaded at
//! start-up, then watched and reloaded when its content changes, through
//! the same [`SharedState`] that delta xDS (`xds.rs`) writes.
//!
//! The file's format lives in `config/local.rs`; the store in `state.rs`.

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
pub fn load_local_file(path: &Path) -> Result<(State, FileDigest), LocalConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| LocalConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let config = local::parse(&text, path)?;
    Ok((config.into_state(), FileDigest::of(&text)))
}

/// The SHA-256 of a file's content: what the watcher compares to tell an
/// edit from an unchanged file, instead of keeping the whole text (a few MB
/// for a mesh of 10,000 workloads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileDigest([u8; 32]);

impl FileDigest {
    /// The digest of `text`.
    pub fn of(text: &str) -> Self {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, text.as_bytes());
        let mut bytes = [0; 32];
        bytes.copy_from_slice(digest.as_ref());
        FileDigest(bytes)
    }
}

/// Watches the local file and replaces the state when its content changes.
/// A bad edit keeps the last good state and logs why. Ends when `stop`
/// resolves.
pub async fn watch_local_file(
    path: PathBuf,
    mut last: FileDigest,
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
        let text = match tokio::fs::read_to_string(&path).await {
            Ok(text) => text,
            Err(error) => {
                tracing::warn!(path = %path.display(), error = %ErrorChain(&error), "cannot read the local config file; keeping the last good state");
                continue;
            }
        };
        let digest = FileDigest::of(&text);
        if digest == last {
            continue;
        }
        match local::parse(&text, &path) {
            Ok(config) => {
                shared.update(|state| config.apply(state));
                tracing::info!(path = %path.display(), "local config file reloaded");
            }
            Err(error) => {
                tracing::error!(error = %ErrorChain(&error), "invalid local config file; keeping the last good state");
            }
        }
        last = digest;
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
        let (state, digest) = load_local_file(&path).unwrap();
        let shared = SharedState::new(state);
        let mut changes = shared.subscribe();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let watcher = tokio::spawn(watch_local_file(
            path.clone(),
            digest,
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
