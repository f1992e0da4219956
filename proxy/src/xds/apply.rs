//! The pure core of the xDS client: one `DeltaDiscoveryResponse` and the
//! versions known so far → the state changes to make, the ACK or NACK to
//! send, and the versions to remember (WIRE.md §7). No I/O, no clock, no
//! locks: the client task calls [`decide`], applies the changes under the
//! state's write lock with [`apply_changes`], and sends the reply.
//!
//! Rules:
//! - a resource that fails to decode or convert is rejected: it is named in
//!   the NACK as `<name>: <reason>` (joined with `; `), not applied, and its
//!   version is not recorded (the version accepted before it stays);
//! - the good resources and the removals of the same response still apply;
//! - a response of a type we do not handle changes nothing and is ACKed;
//! - removals come after the resources of the same response; a removal
//!   takes out whatever the state holds under that name, as istio/ztunnel
//!   does, which includes what a local file seeded beside xDS
//!   (`LOCAL_XDS_PATH` with `XDS_ADDRESS`); only a name xDS delivered has a
//!   version to forget.

use std::collections::HashSet;
use std::sync::Arc;

use prost::Message;
use ztunnel_proto::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource,
};
use ztunnel_proto::istio::security::Authorization;
use ztunnel_proto::istio::workload::Address;
use ztunnel_proto::xds_types::ResourceKind;

use crate::rbac::Policy;
use crate::state::{AddressResource, Interner, NamespacedHostname, State};

use super::known::{KnownVersions, Rejection, VersionChange};
use super::request;

/// One change to the state.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Insert or replace a workload or service (boxed: a workload is several
    /// hundred bytes, the other variants a few words).
    Address(Box<AddressResource>),
    /// Remove the Address resource with this name: a workload's uid, else a
    /// service's `namespace/hostname`.
    RemoveAddress(Arc<str>),
    /// Insert or replace the policy stored under this resource name.
    Policy {
        /// Resource name, the store key.
        name: Arc<str>,
        /// The policy.
        policy: Policy,
    },
    /// Remove the policy stored under this resource name.
    RemovePolicy(Arc<str>),
}

/// What to do with one response.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    /// The response's type; `None` when it is not one we handle.
    pub kind: Option<ResourceKind>,
    /// State changes, in order.
    pub changes: Vec<Change>,
    /// Changes to the known versions of `kind`.
    pub versions: Vec<VersionChange>,
    /// Resources not applied.
    pub rejected: Vec<Rejection>,
    /// The ACK (no rejections) or NACK to send.
    pub reply: DeltaDiscoveryRequest,
}

impl Update {
    /// Whether the reply is an ACK.
    pub fn is_ack(&self) -> bool {
        self.rejected.is_empty()
    }

    /// Whether the inputs of authorization changed, so that open connections
    /// must be re-checked: a policy, or a workload (its namespace and
    /// `authorization_policies` pick the policies that apply to it).
    /// Services and removed workloads cannot turn an allowed connection
    /// into a denied one.
    pub fn authorization_changed(&self) -> bool {
        self.changes.iter().any(|change| match change {
            Change::Policy { .. } | Change::RemovePolicy(_) => true,
            Change::Address(resource) => matches!(**resource, AddressResource::Workload(_)),
            Change::RemoveAddress(_) => false,
        })
    }
}

/// Decides what one response does. `known` is what was accepted before it;
/// workloads take their repeated values from `interner`.
pub fn decide(
    known: &KnownVersions,
    response: &DeltaDiscoveryResponse,
    interner: &mut Interner,
) -> Update {
    let Some(kind) = ResourceKind::from_type_url(&response.type_url) else {
        return Update {
            kind: None,
            changes: Vec::new(),
            versions: Vec::new(),
            rejected: Vec::new(),
            reply: request::ack(&response.type_url, &response.nonce),
        };
    };
    let mut changes = Vec::with_capacity(response.resources.len());
    let mut versions = Vec::with_capacity(response.resources.len());
    let mut rejected = Vec::new();
    for resource in &response.resources {
        match convert(kind, resource, interner) {
            Ok(change) => {
                changes.push(change);
                versions.push(VersionChange::Accepted {
                    name: resource.name.as_str().into(),
                    version: resource.version.clone(),
                });
            }
            Err(reason) => rejected.push(Rejection {
                name: resource.name.clone(),
                reason,
            }),
        }
    }
    let accepted_now: HashSet<Arc<str>> = if response.removed_resources.is_empty() {
        HashSet::new()
    } else {
        versions
            .iter()
            .filter_map(|version| match version {
                VersionChange::Accepted { name, .. } => Some(name.clone()),
                VersionChange::Removed(_) => None,
            })
            .collect()
    };
    for name in &response.removed_resources {
        let delivered = known.version(kind, name).is_some() || accepted_now.contains(name.as_str());
        let name: Arc<str> = name.as_str().into();
        changes.push(match kind {
            ResourceKind::Address => Change::RemoveAddress(name.clone()),
            ResourceKind::Authorization => Change::RemovePolicy(name.clone()),
        });
        if delivered {
            versions.push(VersionChange::Removed(name));
        }
    }
    let reply = if rejected.is_empty() {
        request::ack(&response.type_url, &response.nonce)
    } else {
        request::nack(&response.type_url, &response.nonce, &rejected)
    };
    Update {
        kind: Some(kind),
        changes,
        versions,
        rejected,
        reply,
    }
}

/// Decodes and converts one resource; the error is the NACK reason.
fn convert(
    kind: ResourceKind,
    resource: &Resource,
    interner: &mut Interner,
) -> Result<Change, String> {
    let Some(any) = &resource.resource else {
        return Err("resource is missing".to_owned());
    };
    let decode_error = |error: prost::DecodeError| format!("decode error: {error}");
    match kind {
        ResourceKind::Address => {
            let address = Address::decode(any.value.as_slice()).map_err(decode_error)?;
            let address = AddressResource::from_proto(&address, interner)
                .map_err(|error| error.to_string())?;
            Ok(Change::Address(Box::new(address)))
        }
        ResourceKind::Authorization => {
            let policy = Authorization::decode(any.value.as_slice()).map_err(decode_error)?;
            let policy = Policy::try_from(&policy).map_err(|error| error.to_string())?;
            Ok(Change::Policy {
                name: resource.name.as_str().into(),
                policy,
            })
        }
    }
}

/// What [`apply_changes`] did, for logs and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Resources inserted or replaced.
    pub updated: usize,
    /// Resources removed.
    pub removed: usize,
}

/// Applies the changes to the store one resource at a time: only the
/// resources named are touched.
pub fn apply_changes(state: &mut State, changes: Vec<Change>) -> Applied {
    let mut applied = Applied::default();
    for change in changes {
        match change {
            Change::Address(resource) => {
                state.insert_address(*resource);
                applied.updated += 1;
            }
            Change::Policy { name, policy } => {
                state.insert_policy(name, policy);
                applied.updated += 1;
            }
            Change::RemoveAddress(name) => {
                let removed = state.remove_workload(&name).is_some()
                    || name
                        .parse::<NamespacedHostname>()
                        .is_ok_and(|key| state.remove_service(&key).is_some());
                applied.removed += usize::from(removed);
            }
            Change::RemovePolicy(name) => {
                applied.removed += usize::from(state.remove_policy(&name).is_some());
            }
        }
    }
    applied
}

#[cfg(test)]
mod tests;
