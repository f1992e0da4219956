//! The filesystem side of the agent's two unix sockets (plugin events and
//! ZDS): binding at a path so that the socket is never reachable with a
//! wider mode than [`SOCKET_MODE`], and removing it on the way out only
//! while it is still the socket this agent bound. During a rollout a newer
//! agent may already have replaced the file; its socket must survive the
//! old agent's exit. The sockets themselves are `server.rs`'s and
//! `zds/socket.rs`'s; who may connect, beyond the mode, is `peer.rs`'s.
//!
//! Why a private directory: `bind(2)` creates the socket file with the
//! mode `0777 & ~umask`, and a `chmod` after it leaves a window in which
//! any local user can connect (an `fchmod` of the socket after `bind`
//! changes the socket's inode, not the file's). The umask is
//! process-wide, so setting it around the bind would race every other
//! thread creating files. An `fchmod` before `bind` does narrow the file
//! on Linux (checked on 6.18: the file takes the socket inode's mode, less
//! the umask), but only because sockfs accepts `setattr`, which no
//! interface promises. So the socket is bound inside a fresh directory
//! only the owner can enter (0700), given its exact mode there, and
//! renamed into place: it becomes reachable already 0600, and a stale
//! socket is replaced in one step instead of unlink-then-bind.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of both sockets: connecting needs write permission, and only the
/// owner (root, which the agent, the plugin and ztunnel run as in Istio's
/// charts and ours) may connect.
pub const SOCKET_MODE: u32 = 0o600;
/// Mode of a socket's directory when the agent creates it: others may
/// enter it but not replace the socket with one of their own.
const DIR_MODE: u32 = 0o755;
/// Prefix of the private directory a socket is bound in before its
/// rename. Kept short: a unix socket path has room for 107 bytes, and the
/// staged path (`<dir>/.s-XXXXXX/s`) must be no longer than the final one
/// for any name of ten bytes or more.
const STAGING_PREFIX: &str = ".s-";
/// Name of the socket inside the private directory.
const STAGED_NAME: &str = "s";

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
    /// Binds a socket at `path` with `bind` (which gets the path to bind
    /// at), so that it appears at `path` already with [`SOCKET_MODE`],
    /// whatever the umask; a stale socket there is replaced. Creates the
    /// directory of `path` if needed.
    pub fn bind<T>(
        path: &Path,
        bind: impl FnOnce(&Path) -> io::Result<T>,
    ) -> io::Result<(T, SocketFile)> {
        let parent = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(parent)?;
        // Created 0700 (less under a stricter umask), removed with what is
        // left in it when this function returns, on success or failure.
        let private = tempfile::Builder::new()
            .prefix(STAGING_PREFIX)
            .rand_bytes(6)
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(parent)?;
        let staged = private.path().join(STAGED_NAME);
        let socket = bind(&staged)?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(SOCKET_MODE))?;
        let identity = identity(&std::fs::symlink_metadata(&staged)?);
        std::fs::rename(&staged, path)?;
        Ok((
            socket,
            SocketFile {
                path: path.to_owned(),
                identity,
            },
        ))
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

    fn bind_at(path: &Path) -> (UnixListener, SocketFile) {
        SocketFile::bind(path, |staged| UnixListener::bind(staged)).unwrap()
    }

    #[test]
    fn only_the_socket_still_bound_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/agent.sock");
        let (_old_listener, old) = bind_at(&path);

        // A newer agent takes the path over.
        let (_new_listener, new) = bind_at(&path);
        drop(old);
        assert!(path.exists(), "the newer agent's socket survives");
        drop(new);
        assert!(!path.exists());
    }

    #[test]
    fn the_socket_answers_at_its_path_with_the_owner_only_mode_and_nothing_is_left_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        std::fs::write(&path, b"stale").unwrap();
        let (listener, _file) = bind_at(&path);
        let mode = std::fs::symlink_metadata(&path)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, SOCKET_MODE);
        let _client = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let (_server, _) = listener.accept().unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, ["agent.sock"], "the private directory is gone");
    }

    #[test]
    fn a_failed_bind_leaves_no_private_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.sock");
        let failed = SocketFile::bind(&path, |_| -> io::Result<()> { Err(io::Error::other("no")) });
        assert!(failed.is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
