//! State files written so that a reader never sees half of one: the
//! control plane's generated root and token key (created once, and only if
//! absent, so that two processes started together agree on one), and the
//! node agent's pod set (replaced on every change). Each is written and
//! synced under a fresh temporary name beside its path, then moved into
//! place.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A state file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("writing state file {path}")]
pub struct StateFileError {
    /// The file, or the temporary one beside it.
    pub path: PathBuf,
    /// The I/O error.
    pub source: io::Error,
}

/// Atomically replaces `path` with `contents` (file mode `mode`): readers
/// see the old file or the new one, never a mix.
pub fn replace(path: &Path, contents: &[u8], mode: u32) -> Result<(), StateFileError> {
    let temporary = write_temporary(path, contents, mode)?;
    std::fs::rename(&temporary, path).map_err(|source| {
        let _ = std::fs::remove_file(&temporary);
        error(path, source)
    })
}

/// Creates `path` with `contents` (file mode `mode`) unless it exists; a
/// concurrent creator wins and its file is kept.
pub fn create_if_absent(path: &Path, contents: &[u8], mode: u32) -> Result<(), StateFileError> {
    let temporary = write_temporary(path, contents, mode)?;
    let linked = std::fs::hard_link(&temporary, path);
    let _ = std::fs::remove_file(&temporary);
    match linked {
        Ok(()) => Ok(()),
        Err(source) if source.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(error(path, source)),
    }
}

/// Writes and syncs `contents` to a fresh, uniquely named temporary file
/// beside `path`.
fn write_temporary(path: &Path, contents: &[u8], mode: u32) -> Result<PathBuf, StateFileError> {
    let suffix: u64 = rand::random();
    let temporary = path.with_extension(format!("tmp-{suffix:016x}"));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temporary)
        .map_err(|source| error(&temporary, source))?;
    if let Err(source) = file.write_all(contents).and_then(|()| file.sync_all()) {
        // A half-written temporary is of no use to anyone: leave nothing.
        let _ = std::fs::remove_file(&temporary);
        return Err(error(&temporary, source));
    }
    Ok(temporary)
}

fn error(path: &Path, source: io::Error) -> StateFileError {
    StateFileError {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a panic is a failed test

    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replace_overwrites_with_the_mode_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pods.json");
        replace(&path, b"first", 0o600).unwrap();
        replace(&path, b"second", 0o644).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        assert_eq!(names(dir.path()), ["pods.json"]);
    }

    #[test]
    fn create_if_absent_keeps_the_first_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("root-key.pem");
        create_if_absent(&path, b"first", 0o600).unwrap();
        create_if_absent(&path, b"second", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        assert_eq!(names(dir.path()), ["root-key.pem"]);
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent/pods.json");
        let error = replace(&path, b"x", 0o600).unwrap_err();
        assert!(
            error.path.starts_with(dir.path().join("absent")),
            "{error:?}"
        );
        assert_eq!(error.source.kind(), io::ErrorKind::NotFound);
    }
}
