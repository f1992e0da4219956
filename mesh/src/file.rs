//! The mesh file source: a YAML file (`--mesh`) read whole, checked, and
//! swapped in as a new [`MeshSnapshot`] when its content changes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use ztunnel_certs::error_chain::ErrorChain;

use crate::{MeshError, MeshFile, MeshSnapshot, PodRegistry};

/// Largest mesh file read, in bytes: 10,000 pods with labels take about
/// 3 MiB; 64 MiB leaves room for far larger meshes and bounds what a bad
/// file can make the control plane hold.
const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// A registry read from a YAML file and reloaded when its content changes.
#[derive(Debug)]
pub struct FileRegistry {
    /// The file.
    path: PathBuf,
    /// The content last read, good or bad, so that unchanged content is
    /// neither parsed nor reported again. Held across a reload, so that
    /// concurrent reloads swap in file order.
    last_read: Mutex<Vec<u8>>,
    /// The last good snapshot; receivers are told of each swap.
    current: watch::Sender<Arc<MeshSnapshot>>,
}

impl FileRegistry {
    /// Loads the file; an invalid file is an error (the CA must not start
    /// with a registry it cannot read).
    pub fn load(path: &Path) -> Result<Self, RegistryError> {
        let bytes = read_bounded(path)?;
        let snapshot = parse(path, &bytes)?;
        Ok(FileRegistry {
            path: path.to_owned(),
            last_read: Mutex::new(bytes),
            current: watch::Sender::new(Arc::new(snapshot)),
        })
    }

    /// The file this registry reads.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Re-reads the file. Content unchanged since the last read (good or
    /// bad) does nothing and returns `Ok(false)`; new valid content is
    /// swapped in and returns `Ok(true)`; new invalid content keeps the last
    /// good registry and returns the error, once.
    pub fn reload(&self) -> Result<bool, RegistryError> {
        let bytes = read_bounded(&self.path)?;
        let mut last_read = self
            .last_read
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *last_read == bytes {
            return Ok(false);
        }
        let parsed = parse(&self.path, &bytes);
        *last_read = bytes;
        self.current.send_replace(Arc::new(parsed?));
        Ok(true)
    }

    /// Polls the file every `interval` until `shutdown` resolves, logging
    /// each reload and each refused file (with its line), and counting the
    /// refusals through `on_refused`.
    pub async fn watch(
        self: Arc<Self>,
        interval: Duration,
        on_refused: impl Fn(&RegistryError) + Send,
        shutdown: impl Future<Output = ()>,
    ) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            // Reading and parsing a large file takes milliseconds: off the
            // runtime's workers.
            let registry = Arc::clone(&self);
            let Ok(result) = tokio::task::spawn_blocking(move || registry.reload()).await else {
                return;
            };
            match result {
                Ok(false) => {}
                Ok(true) => {
                    let snapshot = self.snapshot();
                    tracing::info!(
                        path = %self.path.display(),
                        pods = snapshot.len(),
                        services = snapshot.services().len(),
                        policies = snapshot.policies().len(),
                        "mesh file reloaded"
                    );
                }
                Err(error) => {
                    on_refused(&error);
                    tracing::error!(
                        path = %self.path.display(),
                        error = %ErrorChain(&error),
                        "mesh file not reloaded; keeping the last good one"
                    );
                }
            }
        }
    }
}

impl PodRegistry for FileRegistry {
    fn snapshot(&self) -> Arc<MeshSnapshot> {
        Arc::clone(&self.current.borrow())
    }

    fn changes(&self) -> watch::Receiver<Arc<MeshSnapshot>> {
        self.current.subscribe()
    }
}

/// Why a mesh file was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The file could not be read.
    #[error("cannot read mesh file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is larger than the registry accepts.
    #[error("mesh file {path} is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The YAML does not parse as a mesh file.
    #[error("mesh file {path}:{line}:{column}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error (0 when unknown).
        line: usize,
        /// 1-based column of the error (0 when unknown).
        column: usize,
        /// What serde_yaml_ng said.
        message: String,
    },
    /// The entries parse but contradict each other.
    #[error("mesh file {path}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: MeshError,
    },
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, RegistryError> {
    let read_error = |source| RegistryError::Read {
        path: path.to_owned(),
        source,
    };
    let len = std::fs::metadata(path).map_err(read_error)?.len();
    if len > MAX_FILE_BYTES {
        return Err(RegistryError::TooLarge {
            path: path.to_owned(),
        });
    }
    std::fs::read(path).map_err(read_error)
}

/// Parses and checks the file; an empty file is an empty registry.
fn parse(path: &Path, bytes: &[u8]) -> Result<MeshSnapshot, RegistryError> {
    let blank = bytes.iter().all(u8::is_ascii_whitespace);
    let file: MeshFile = if blank {
        MeshFile::default()
    } else {
        serde_yaml_ng::from_slice(bytes).map_err(|error| {
            let (line, column) = error
                .location()
                .map_or((0, 0), |at| (at.line(), at.column()));
            RegistryError::Parse {
                path: path.to_owned(),
                line,
                column,
                message: error.to_string(),
            }
        })?
    };
    MeshSnapshot::new(file).map_err(|source| RegistryError::Invalid {
        path: path.to_owned(),
        source,
    })
}
