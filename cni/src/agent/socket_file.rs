//! The filesystem side of the agent's two unix sockets (plugin events and
//! ZDS): making the path ready to bind, and removing it on the way out only
//! while it is still the socket this agent bound. During a rollout a newer
//! agent may already have replaced the file; its socket must survive the
//! old agent's exit. The sockets themselves are `server.rs`'s and
//! `zds/socket.rs`'s.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A bound socket's path, unlinked on drop if the path still names the
/// file that was bound (same device and inode).
#[derive(Debug)]
pub struct SocketFile {
    /// Where the socket was bound.
    path: PathBuf,
    /// (device, inode) of the socket file right after bind.
    identity: (u64, u64),
}

impl SocketFile {
    /// Makes `path` ready for bind: creates its directory and removes a
    /// stale socket left by an earlier agent.
    pub fn prepare(path: &Path) -> io::Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Records the socket file just bound at `path`.
    pub fn bound(path: &Path) -> io::Result<SocketFile> {
        Ok(SocketFile {
            path: path.to_owned(),
            identity: identity(&std::fs::symlink_metadata(path)?),
        })
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|metadata| identity(&metadata) == self.identity);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn identity(metadata: &std::fs::Metadata) -> (u64, u64) {
    (metadata.dev(), metadata.ino())
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    #[test]
    fn only_the_socket_still_bound_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/agent.sock");
        SocketFile::prepare(&path).unwrap();
        let _old_listener = UnixListener::bind(&path).unwrap();
        let old = SocketFile::bound(&path).unwrap();

        // A newer agent takes the path over.
        SocketFile::prepare(&path).unwrap();
        let _new_listener = UnixListener::bind(&path).unwrap();
        let new = SocketFile::bound(&path).unwrap();
        drop(old);
        assert!(path.exists(), "the newer agent's socket survives");
        drop(new);
        assert!(!path.exists());
    }
}
