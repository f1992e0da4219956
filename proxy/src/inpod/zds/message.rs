//! The ZDS messages as typed values (WIRE.md §5): a received datagram (its
//! bytes and the fds that came with it) becomes a [`Request`] or a
//! [`ReadError`], and the answers (`ZdsHello`, `WorkloadResponse`) become
//! bytes. Pure: the socket lives in `socket.rs`, and what a request means
//! for the pods is decided in `session.rs`.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use prost::Message;
use ztunnel_proto::istio::workload::zds;

use crate::config::WorkloadInfo;

/// One datagram as the socket delivered it.
#[derive(Debug)]
pub struct Datagram {
    /// The datagram's bytes (at most the receive buffer's size).
    pub bytes: Vec<u8>,
    /// Every fd that came with it (SCM_RIGHTS), owned so that each one we do
    /// not keep is closed when dropped.
    pub fds: Vec<OwnedFd>,
    /// The kernel flagged the datagram or its control data as cut short
    /// (`MSG_TRUNC`, `MSG_CTRUNC`).
    pub truncated: bool,
}

/// Why a datagram could not be read: the detail of a
/// `failure to read message : …` NACK, after which the connection is
/// closed and opened again. The texts are the ones istio's ztunnel sends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The datagram did not fit the 1024-byte buffer, or its control data
    /// did not fit either.
    #[error("received truncated message")]
    Truncated,
    /// The bytes are not a `WorkloadRequest` (prost's text already starts
    /// with `failed to decode Protobuf message: `).
    #[error("{0}")]
    Decode(prost::DecodeError),
    /// A `WorkloadRequest` with no payload member set.
    #[error("no payload")]
    NoPayload,
    /// An `add` came without its netns fd.
    #[error("No control message")]
    MissingFd,
    /// A message other than `add` came with fds.
    #[error("Unexpected control message")]
    UnexpectedFd,
    /// An `add` came with more than one fd (all of them are closed).
    #[error("Expected 1 FD, got {0}")]
    TooManyFds(usize),
}

/// The handle that came with an `add`, classified at the edge.
#[derive(Debug)]
pub enum Handle {
    /// A network namespace, ready to hand to the per-pod proxies.
    Netns(OwnedFd),
    /// Some other kind of file; it was closed when read. Such an `add` can
    /// never succeed, so it is answered at once and never retried.
    NotNetns,
}

/// A request of the node agent, parsed.
#[derive(Debug)]
pub enum Request {
    /// Start serving a pod inside its network namespace.
    Add {
        /// The pod's `metadata.uid`.
        uid: Arc<str>,
        /// Name, namespace and service account; `None` when the agent left
        /// `workload_info` out, which the session treats as a protocol
        /// error.
        workload: Option<WorkloadInfo>,
        /// The pod's network namespace.
        handle: Handle,
    },
    /// Keep a pod during the snapshot though the agent has no handle for it.
    Keep {
        /// The pod's `metadata.uid`.
        uid: Arc<str>,
    },
    /// Stop serving a pod.
    Del {
        /// The pod's `metadata.uid`.
        uid: Arc<str>,
    },
    /// The end of the snapshot that starts every connection.
    SnapshotSent,
}

impl Request {
    /// The pod the request names, for logs.
    pub fn uid(&self) -> Option<Arc<str>> {
        match self {
            Request::Add { uid, .. } | Request::Keep { uid } | Request::Del { uid } => {
                Some(uid.clone())
            }
            Request::SnapshotSent => None,
        }
    }
}

/// Parses one non-empty datagram. `is_netns` tells whether an fd is a
/// network namespace; it is only asked about the single fd of an `add`.
///
/// Every fd not kept in the result is closed before this returns.
pub fn parse(
    datagram: Datagram,
    is_netns: impl FnOnce(BorrowedFd<'_>) -> bool,
) -> Result<Request, ReadError> {
    use zds::workload_request::Payload;

    let Datagram {
        bytes,
        mut fds,
        truncated,
    } = datagram;
    if truncated {
        return Err(ReadError::Truncated);
    }
    let request = zds::WorkloadRequest::decode(bytes.as_slice()).map_err(ReadError::Decode)?;
    let payload = request.payload.ok_or(ReadError::NoPayload)?;
    let add = match payload {
        Payload::Add(add) => add,
        _ if !fds.is_empty() => return Err(ReadError::UnexpectedFd),
        Payload::Keep(keep) => {
            return Ok(Request::Keep {
                uid: keep.uid.into(),
            });
        }
        Payload::Del(del) => {
            return Ok(Request::Del {
                uid: del.uid.into(),
            });
        }
        Payload::SnapshotSent(_) => return Ok(Request::SnapshotSent),
    };
    let fd = match (fds.pop(), fds.len()) {
        (None, _) => return Err(ReadError::MissingFd),
        (Some(fd), 0) => fd,
        (Some(_), more) => return Err(ReadError::TooManyFds(more + 1)),
    };
    let handle = if is_netns(std::os::fd::AsFd::as_fd(&fd)) {
        Handle::Netns(fd)
    } else {
        Handle::NotNetns
    };
    let workload = add.workload_info.map(|info| WorkloadInfo {
        namespace: info.namespace.into(),
        name: info.name.into(),
        service_account: info.service_account.into(),
    });
    Ok(Request::Add {
        uid: add.uid.into(),
        workload,
        handle,
    })
}

/// The first datagram of every connection: a bare `ZdsHello{version: V1}`.
pub fn hello() -> Vec<u8> {
    zds::ZdsHello {
        version: zds::Version::V1.into(),
    }
    .encode_to_vec()
}

/// A `WorkloadResponse` carrying an `Ack`: empty `error` for an ACK, the
/// NACK text otherwise.
pub fn ack(error: String) -> Vec<u8> {
    zds::WorkloadResponse {
        payload: Some(zds::workload_response::Payload::Ack(zds::Ack { error })),
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests;
