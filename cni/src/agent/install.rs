//! Installing the plugin on the node (KUBERNETES.md B1–B4, B6): the
//! `ztunnel-cni` binary copied into the host's CNI bin directory, our entry
//! chained last into the network configuration the runtime uses, both kept
//! in place while the agent runs, and taken out again on uninstall.
//!
//! The decisions on configuration files are pure functions in `conf`; this
//! module reads and writes the files, and `watch` re-runs the check when
//! either directory changes. Every write goes to a temporary file in the
//! same directory and is renamed into place, so a runtime never reads or
//! executes half a file.
//!
//! | Module | Owns |
//! |---|---|
//! | `conf` | choosing the file, inserting and removing our entry |
//! | `ordered` | JSON objects that keep their key order |
//! | `watch` | the inotify loop, its throttle and the fight warning |

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ztunnel_certs::error_chain::ErrorChain;

use crate::plugin::config::MAX_CONFIG_BYTES;

use conf::{ChainEntry, ConfError, ConfFile, ConfKind, ConfStatus};

pub mod conf;
mod ordered;
pub mod watch;

/// The host's CNI bin directory (`cniBinDir`); istio-cni's container sees
/// it mounted at `/host/opt/cni/bin`.
pub const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";
/// The host's CNI configuration directory (`cniConfDir`); mounted at
/// `/host/etc/cni/net.d` in istio-cni's container.
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// The installed binary's name, which is also our entry's `type`.
pub const DEFAULT_PLUGIN_NAME: &str = "ztunnel-cni";
/// The installed binary's mode: runtimes execute it as root.
const BINARY_MODE: u32 = 0o755;
/// Mode of a configuration file we create: it names the agent's socket and
/// nothing else needs to read it but the runtime (root).
const NEW_CONF_MODE: u32 = 0o600;
/// Suffix of the temporary file a write goes to before its rename; it ends
/// in neither `.conf` nor `.conflist`, so runtimes never load it.
const TEMP_SUFFIX: &str = ".installing";

/// Where and what to install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallConfig {
    /// The host's CNI bin directory, where runtimes look plugins up.
    pub bin_dir: PathBuf,
    /// The host's CNI configuration directory.
    pub conf_dir: PathBuf,
    /// The configuration file to chain into (`CNI_CONF_NAME`); `None`
    /// chains into the file the runtime would pick.
    pub conf_name: Option<String>,
    /// Our own `ztunnel-cni` binary, the source of the copy.
    pub plugin_source: PathBuf,
    /// The installed binary's file name and our entry's `name` and `type`.
    pub plugin_name: String,
    /// The plugin's settings written into our entry.
    pub entry: conf::EntrySettings,
}

impl InstallConfig {
    /// The default paths and entry, copying the binary at `plugin_source`.
    pub fn new(plugin_source: PathBuf) -> InstallConfig {
        InstallConfig {
            bin_dir: PathBuf::from(DEFAULT_BIN_DIR),
            conf_dir: PathBuf::from(DEFAULT_CONF_DIR),
            conf_name: None,
            plugin_source,
            plugin_name: DEFAULT_PLUGIN_NAME.to_owned(),
            entry: conf::EntrySettings::default(),
        }
    }
}

/// Whether the plugin is installed and its entry in place: what the
/// agent's readiness endpoint reports. Cheap to clone and to read.
#[derive(Debug, Clone, Default)]
pub struct InstallState {
    /// Set once a check finds the binary and the entry in place; cleared
    /// when a watched directory changes, until the next check passes.
    ready: Arc<AtomicBool>,
}

impl InstallState {
    /// Whether the last check found everything in place.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }
}

/// What a check did to the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfOutcome {
    /// No valid configuration file yet; nothing written.
    Waiting,
    /// The chosen file already held our entry; not touched.
    Unchanged(PathBuf),
    /// Our entry was written into this file.
    Written(PathBuf),
}

/// What a check did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairOutcome {
    /// The binary was missing or different, and was copied.
    pub binary_copied: bool,
    /// What happened to the configuration.
    pub conf: ConfOutcome,
}

/// Installs, checks and uninstalls the plugin for one [`InstallConfig`].
#[derive(Debug)]
pub struct Installer {
    /// What to install where; names checked by [`Installer::new`].
    config: InstallConfig,
    /// Our entry, built once from the settings.
    entry: ChainEntry,
    /// Shared with the readiness endpoint.
    state: InstallState,
}

impl Installer {
    /// An installer for `config`; refuses names that are not plain file
    /// names.
    pub fn new(config: InstallConfig) -> Result<Installer, InstallError> {
        check_file_name("plugin name", &config.plugin_name)?;
        if let Some(name) = &config.conf_name {
            check_file_name("configuration name", name)?;
            if ConfKind::of(name).is_none() {
                return Err(InstallError::InvalidName {
                    what: "configuration name",
                    name: name.clone(),
                });
            }
        }
        let entry = ChainEntry::new(&config.plugin_name, &config.entry)?;
        Ok(Installer {
            config,
            entry,
            state: InstallState::default(),
        })
    }

    /// The readiness handle.
    pub fn state(&self) -> InstallState {
        self.state.clone()
    }

    /// Creates both directories if the host has none yet, then
    /// [`Installer::check_and_repair`].
    pub fn install(&self) -> Result<RepairOutcome, InstallError> {
        for dir in [&self.config.bin_dir, &self.config.conf_dir] {
            fs::create_dir_all(dir).map_err(|source| InstallError::Io {
                path: dir.clone(),
                source,
            })?;
        }
        self.check_and_repair()
    }

    /// Copies the binary if it is missing or differs, and writes our entry
    /// if the configuration is not valid (B6); an already correct file is
    /// left as it is. Sets readiness from the result.
    pub fn check_and_repair(&self) -> Result<RepairOutcome, InstallError> {
        let result = self.repair();
        let ready = matches!(
            &result,
            Ok(RepairOutcome {
                conf: ConfOutcome::Unchanged(_) | ConfOutcome::Written(_),
                ..
            })
        );
        self.state.set_ready(ready);
        result
    }

    fn repair(&self) -> Result<RepairOutcome, InstallError> {
        let binary_copied = !self.binary_in_place()?;
        if binary_copied {
            self.copy_binary()?;
            tracing::info!(path = %self.installed_binary().display(), "installed the CNI plugin binary");
        }
        let files = self.read_conf_dir()?;
        let conf = match conf::status(self.config.conf_name.as_deref(), &files, &self.entry) {
            ConfStatus::Waiting => {
                tracing::info!(dir = %self.config.conf_dir.display(), "no valid CNI configuration yet; waiting");
                ConfOutcome::Waiting
            }
            ConfStatus::Installed(name) => ConfOutcome::Unchanged(self.config.conf_dir.join(name)),
            ConfStatus::Missing(name) => ConfOutcome::Written(self.insert_into(&files, &name)?),
        };
        Ok(RepairOutcome {
            binary_copied,
            conf,
        })
    }

    /// Whether the binary and our entry are in place, without changing
    /// anything.
    pub fn is_installed(&self) -> Result<bool, InstallError> {
        if !self.binary_in_place()? {
            return Ok(false);
        }
        let files = self.read_conf_dir()?;
        Ok(matches!(
            conf::status(self.config.conf_name.as_deref(), &files, &self.entry),
            ConfStatus::Installed(_)
        ))
    }

    /// Takes our entry out of every plugin list in the configuration
    /// directory and deletes the installed binary (B6). With `upgrading`,
    /// leaves both, so that pods created while the new agent starts still
    /// go through the plugin (and fail closed until it answers); whether
    /// one is coming is `upgrade.rs`'s decision. Call it once the watcher
    /// has stopped, or the watcher puts both back.
    pub fn uninstall(&self, upgrading: bool) -> Result<(), InstallError> {
        self.state.set_ready(false);
        if upgrading {
            return Ok(());
        }
        for file in self.read_conf_dir()? {
            if ConfKind::of(&file.name) != Some(ConfKind::Conflist) {
                continue;
            }
            let Some(contents) = conf::remove_entry(&file.contents, self.entry.plugin_type())
            else {
                continue;
            };
            let path = self.config.conf_dir.join(&file.name);
            let mode = existing_mode(&path)?.unwrap_or(NEW_CONF_MODE);
            write_atomically(&path, mode, &mut contents.as_slice())?;
            tracing::info!(path = %path.display(), "removed our entry from the CNI configuration");
        }
        let binary = self.installed_binary();
        match fs::remove_file(&binary) {
            Ok(()) => tracing::info!(path = %binary.display(), "removed the CNI plugin binary"),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(InstallError::Io {
                    path: binary,
                    source,
                });
            }
        }
        Ok(())
    }

    /// Keeps the installation in place until `shutdown` resolves: see
    /// [`watch::run`].
    pub async fn watch(self, shutdown: impl Future<Output = ()>) -> Result<(), InstallError> {
        watch::run(self, shutdown).await
    }

    /// Where the binary is installed.
    pub fn installed_binary(&self) -> PathBuf {
        self.config.bin_dir.join(&self.config.plugin_name)
    }

    /// Whether the installed binary exists with the source's contents and
    /// mode [`BINARY_MODE`].
    fn binary_in_place(&self) -> Result<bool, InstallError> {
        let installed = self.installed_binary();
        let io_error = |path: &Path| {
            let path = path.to_owned();
            move |source| InstallError::Io { path, source }
        };
        let installed_file = match File::open(&installed) {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(source) => return Err(io_error(&installed)(source)),
        };
        let metadata = installed_file.metadata().map_err(io_error(&installed))?;
        if metadata.permissions().mode() & 0o7777 != BINARY_MODE {
            return Ok(false);
        }
        let source = &self.config.plugin_source;
        let source_file = File::open(source).map_err(io_error(source))?;
        let source_len = source_file.metadata().map_err(io_error(source))?.len();
        if source_len != metadata.len() {
            return Ok(false);
        }
        same_contents(source_file, installed_file).map_err(io_error(&installed))
    }

    fn copy_binary(&self) -> Result<(), InstallError> {
        let source = &self.config.plugin_source;
        let mut reader = File::open(source).map_err(|error| InstallError::Io {
            path: source.clone(),
            source: error,
        })?;
        write_atomically(&self.installed_binary(), BINARY_MODE, &mut reader)
    }

    /// The configuration directory's `*.conf` and `*.conflist` files.
    /// Files that vanish or cannot be read while listing are left out, as
    /// are files larger than [`MAX_CONFIG_BYTES`] (no runtime would pass
    /// such a configuration to a plugin).
    fn read_conf_dir(&self) -> Result<Vec<ConfFile>, InstallError> {
        let dir = &self.config.conf_dir;
        let io_error = |source| InstallError::Io {
            path: dir.clone(),
            source,
        };
        let mut files = Vec::new();
        for item in fs::read_dir(dir).map_err(io_error)? {
            let item = item.map_err(io_error)?;
            let Ok(name) = item.file_name().into_string() else {
                continue;
            };
            if ConfKind::of(&name).is_none() {
                continue;
            }
            let path = item.path();
            match fs::metadata(&path) {
                Ok(metadata) if metadata.is_file() && metadata.len() <= MAX_CONFIG_BYTES => {}
                _ => continue,
            }
            match fs::read(&path) {
                Ok(contents) => files.push(ConfFile { name, contents }),
                Err(error) => {
                    tracing::debug!(path = %path.display(), error = %ErrorChain(&error), "skipping an unreadable CNI configuration file");
                }
            }
        }
        Ok(files)
    }

    /// Writes our entry into `name` (one of `files`) and returns the path
    /// written. A wrapped `.conf` keeps its mode as the new `.conflist`
    /// and is removed once the list is in place.
    fn insert_into(&self, files: &[ConfFile], name: &str) -> Result<PathBuf, InstallError> {
        let dir = &self.config.conf_dir;
        let file = files
            .iter()
            .find(|file| file.name == name)
            .ok_or_else(|| InstallError::Io {
                path: dir.join(name),
                source: io::ErrorKind::NotFound.into(),
            })?;
        let write = conf::plan_insert(file, &self.entry).map_err(|source| InstallError::Conf {
            path: dir.join(name),
            source,
        })?;
        let target = dir.join(&write.target);
        let mode = existing_mode(&dir.join(name))?.unwrap_or(NEW_CONF_MODE);
        write_atomically(&target, mode, &mut write.contents.as_slice())?;
        if let Some(replaced) = &write.replaces {
            let replaced = dir.join(replaced);
            fs::remove_file(&replaced).map_err(|source| InstallError::Io {
                path: replaced,
                source,
            })?;
        }
        tracing::info!(path = %target.display(), "chained our entry into the CNI configuration");
        Ok(target)
    }
}

/// Refuses names that would leave the directory or name nothing.
fn check_file_name(what: &'static str, name: &str) -> Result<(), InstallError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(InstallError::InvalidName {
            what,
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// The permission bits of `path`, or `None` if it does not exist.
fn existing_mode(path: &Path) -> Result<Option<u32>, InstallError> {
    match fs::metadata(path) {
        Ok(metadata) => Ok(Some(metadata.permissions().mode() & 0o7777)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(InstallError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Whether two readers yield the same bytes.
fn same_contents(left: impl Read, right: impl Read) -> io::Result<bool> {
    // Buffered reads of both; comparing a few megabytes of binary this way
    // costs less than hashing them.
    let (mut left, mut right) = (BufReader::new(left), BufReader::new(right));
    let mut left_chunk = [0u8; 8192];
    let mut right_chunk = [0u8; 8192];
    loop {
        let read = left.read(&mut left_chunk)?;
        if read == 0 {
            return Ok(right.read(&mut right_chunk[..1])? == 0);
        }
        match right.read_exact(&mut right_chunk[..read]) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
            Err(error) => return Err(error),
        }
        if left_chunk[..read] != right_chunk[..read] {
            return Ok(false);
        }
    }
}

/// Writes `contents` to `path` with `mode`: into a temporary file in the
/// same directory, flushed to disk, then renamed over `path`, so readers
/// see the old file or the new one, never a part.
fn write_atomically(path: &Path, mode: u32, contents: &mut impl Read) -> Result<(), InstallError> {
    let io_error = |path: &Path| {
        let path = path.to_owned();
        move |source| InstallError::Io { path, source }
    };
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io_error(path)(io::ErrorKind::InvalidInput.into()));
    };
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(TEMP_SUFFIX);
    let temp = dir.join(temp_name);
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&temp)?;
        io::copy(contents, &mut file)?;
        // The umask may have narrowed the mode given at creation, and a
        // temporary file left by a crash keeps its old mode.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.flush()?;
        file.sync_all()?;
        fs::rename(&temp, path)?;
        File::open(dir)?.sync_all()
    })();
    written.map_err(|source| {
        let _ = fs::remove_file(&temp);
        io_error(path)(source)
    })
}

/// Why installing, checking or uninstalling failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// A file or directory could not be read or written.
    #[error("{path}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// The chosen configuration file could not take our entry.
    #[error("cannot insert our entry into {path}")]
    Conf {
        /// The configuration file.
        path: PathBuf,
        /// Why.
        source: ConfError,
    },
    /// Our entry cannot be built from the settings.
    #[error(transparent)]
    Entry(#[from] ConfError),
    /// The plugin or configuration name is not a plain file name (or, for
    /// the configuration, does not end in `.conf` or `.conflist`).
    #[error("invalid {what} {name:?}")]
    InvalidName {
        /// Which name.
        what: &'static str,
        /// The name given.
        name: String,
    },
    /// A directory could not be watched.
    #[error("cannot watch {path}")]
    Watch {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: notify::Error,
    },
}

#[cfg(test)]
mod tests;
