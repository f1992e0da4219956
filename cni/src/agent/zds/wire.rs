//! ZDS messages as plain data, and their bytes (WIRE.md §5): what the agent
//! sends (`WorkloadRequest`), what it reads (`ZdsHello`, then
//! `WorkloadResponse`), and which request stands in during a snapshot when
//! a pod's netns cannot be opened. No sockets here; those are in `socket.rs`.

use std::path::PathBuf;

use prost::Message;
use ztunnel_proto::istio::workload::zds::{
    AddWorkload, DelWorkload, KeepWorkload, SnapshotSent, Version, WorkloadInfo, WorkloadRequest,
    WorkloadResponse, ZdsHello, workload_request, workload_response,
};

use crate::agent::pods::PodRecord;

/// One request to ztunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Start proxying a pod; sent with the pod's netns fd.
    Add {
        /// Pod UID.
        uid: String,
        /// Pod name.
        name: String,
        /// Pod namespace.
        namespace: String,
        /// Pod service account.
        service_account: String,
        /// Opened when sending, for the SCM_RIGHTS fd.
        netns: PathBuf,
    },
    /// Keep a pod during a snapshot although its netns cannot be handed over.
    Keep {
        /// Pod UID.
        uid: String,
    },
    /// Stop proxying a pod.
    Del {
        /// Pod UID.
        uid: String,
    },
    /// End of the snapshot.
    SnapshotSent,
}

/// What ztunnel answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ack {
    /// Done.
    Ack,
    /// Refused, with ztunnel's text.
    Nack(String),
}

impl Request {
    /// The `add` for a recorded pod.
    pub fn add(pod: &PodRecord) -> Request {
        Request::Add {
            uid: pod.uid.clone(),
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            service_account: pod.service_account.clone(),
            netns: pod.netns.clone(),
        }
    }

    /// The `keep` that stands in for this `add` during a snapshot when its
    /// netns cannot be opened; `None` for any other request. Only a
    /// snapshot may carry `keep`: after `snapshot_sent` it is a protocol
    /// error that makes ztunnel exit.
    pub fn keep_for_snapshot(&self) -> Option<Request> {
        match self {
            Request::Add { uid, .. } => Some(Request::Keep { uid: uid.clone() }),
            Request::Keep { .. } | Request::Del { .. } | Request::SnapshotSent => None,
        }
    }

    /// The datagram. Never empty: every request sets its oneof member,
    /// which encodes to at least a tag and a length (an unset payload would
    /// encode to zero bytes, which ztunnel reads as end of stream).
    pub fn encode(&self) -> Vec<u8> {
        let payload = match self {
            Request::Add {
                uid,
                name,
                namespace,
                service_account,
                ..
            } => workload_request::Payload::Add(AddWorkload {
                uid: uid.clone(),
                workload_info: Some(WorkloadInfo {
                    name: name.clone(),
                    namespace: namespace.clone(),
                    service_account: service_account.clone(),
                }),
            }),
            Request::Keep { uid } => {
                workload_request::Payload::Keep(KeepWorkload { uid: uid.clone() })
            }
            Request::Del { uid } => {
                workload_request::Payload::Del(DelWorkload { uid: uid.clone() })
            }
            Request::SnapshotSent => workload_request::Payload::SnapshotSent(SnapshotSent {}),
        };
        WorkloadRequest {
            payload: Some(payload),
        }
        .encode_to_vec()
    }
}

/// The requests of a snapshot: an `add` per pod, then `snapshot_sent`.
pub fn snapshot<'a>(pods: impl IntoIterator<Item = &'a PodRecord>) -> Vec<Request> {
    pods.into_iter()
        .map(Request::add)
        .chain(std::iter::once(Request::SnapshotSent))
        .collect()
}

/// Reads ztunnel's first datagram; returns the version number it claims
/// (logged, not enforced).
pub fn decode_hello(bytes: &[u8]) -> Result<i32, WireError> {
    let hello = ZdsHello::decode(bytes).map_err(|error| WireError::Decode(error.to_string()))?;
    if hello.version != Version::V1 as i32 {
        tracing::debug!(
            version = hello.version,
            "ztunnel says a ZDS version other than V1"
        );
    }
    Ok(hello.version)
}

/// Reads an answer to a request.
pub fn decode_ack(bytes: &[u8]) -> Result<Ack, WireError> {
    let response =
        WorkloadResponse::decode(bytes).map_err(|error| WireError::Decode(error.to_string()))?;
    match response.payload {
        Some(workload_response::Payload::Ack(ack)) if ack.error.is_empty() => Ok(Ack::Ack),
        Some(workload_response::Payload::Ack(ack)) => Ok(Ack::Nack(ack.error)),
        None => Err(WireError::NoPayload),
    }
}

/// Why a datagram from ztunnel was not understood.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Not a protobuf message of the expected type.
    #[error("undecodable ZDS message: {0}")]
    Decode(String),
    /// A `WorkloadResponse` without its `ack`.
    #[error("ZDS response without a payload")]
    NoPayload,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> PodRecord {
        PodRecord {
            uid: uid.into(),
            name: "web-0".into(),
            namespace: "shop".into(),
            service_account: "web".into(),
            netns: "/run/netns/p".into(),
            netns_inode: None,
            ips: Vec::new(),
            dns_capture: None,
        }
    }

    #[test]
    fn every_request_encodes_to_a_non_empty_datagram_that_decodes_back() {
        let requests = [
            Request::add(&pod("u1")),
            Request::add(&pod("")),
            Request::Keep { uid: String::new() },
            Request::Del { uid: String::new() },
            Request::SnapshotSent,
        ];
        for request in requests {
            let bytes = request.encode();
            assert!(!bytes.is_empty(), "{request:?}");
            let decoded = WorkloadRequest::decode(bytes.as_slice()).unwrap();
            assert!(decoded.payload.is_some());
        }
        let add = WorkloadRequest::decode(Request::add(&pod("u1")).encode().as_slice()).unwrap();
        let Some(workload_request::Payload::Add(add)) = add.payload else {
            panic!("not an add")
        };
        assert_eq!(add.uid, "u1");
        assert_eq!(add.workload_info.unwrap().service_account, "web");
        // Field numbers of WIRE.md: del uses field 2 inside and 2 outside, keep 5.
        assert_eq!(
            Request::Del { uid: "u".into() }.encode(),
            [0x12, 0x03, 0x12, 0x01, b'u']
        );
        assert_eq!(
            Request::Keep { uid: "u".into() }.encode(),
            [0x2a, 0x03, 0x0a, 0x01, b'u']
        );
        assert_eq!(Request::SnapshotSent.encode(), [0x1a, 0x00]);
    }

    #[test]
    fn only_an_add_has_a_keep_to_stand_in_for_it() {
        let add = Request::add(&pod("u1"));
        assert_eq!(
            add.keep_for_snapshot(),
            Some(Request::Keep { uid: "u1".into() })
        );
        let del = Request::Del { uid: "u1".into() };
        assert_eq!(del.keep_for_snapshot(), None);
        assert_eq!(Request::SnapshotSent.keep_for_snapshot(), None);
    }

    #[test]
    fn snapshots_end_with_snapshot_sent() {
        let pods = [pod("a"), pod("b")];
        let requests = snapshot(&pods);
        assert_eq!(requests.len(), 3);
        assert_eq!(requests[2], Request::SnapshotSent);
        assert_eq!(snapshot(&[]), [Request::SnapshotSent]);
    }

    #[test]
    fn acks_nacks_and_garbage() {
        let ack = |error: &str| {
            WorkloadResponse {
                payload: Some(workload_response::Payload::Ack(
                    ztunnel_proto::istio::workload::zds::Ack {
                        error: error.into(),
                    },
                )),
            }
            .encode_to_vec()
        };
        assert_eq!(decode_ack(&ack("")).unwrap(), Ack::Ack);
        assert_eq!(
            decode_ack(&ack("failure to start proxy : x")).unwrap(),
            Ack::Nack("failure to start proxy : x".into())
        );
        assert!(matches!(decode_ack(&[]), Err(WireError::NoPayload)));
        assert!(matches!(
            decode_ack(&[0xff, 0xff]),
            Err(WireError::Decode(_))
        ));
        let hello = ZdsHello {
            version: Version::V1 as i32,
        }
        .encode_to_vec();
        assert_eq!(decode_hello(&hello).unwrap(), 1);
        assert_eq!(decode_hello(&[]).unwrap(), 0);
        // A ztunnel that answers before saying hello breaks the protocol:
        // the connection is refused rather than read as a hello.
        assert!(matches!(decode_hello(&ack("")), Err(WireError::Decode(_))));
    }
}
