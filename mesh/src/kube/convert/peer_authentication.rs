//! One Istio PeerAuthentication → one mesh [`PeerAuthentication`], and the
//! age order the mesh reads them in (at each level the oldest applies, as
//! istiod's `getOldestPeerAuthn`). What they make for ztunnel is decided
//! on the model, in `peer_authentication.rs`, so that the mesh file's get
//! the same.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use super::{ObjectProblem, Outcome, ProblemReason, name_and_namespace, problem};
use crate::kube::peer_authentication_crd::{
    MutualTls, PeerAuthentication as KubePeerAuthentication,
};
use crate::{MtlsMode, PeerAuthentication};

/// Every PeerAuthentication that converts, oldest first: by creation time,
/// then namespace and name (istiod keeps whichever it met first of two
/// created in the same second).
pub(super) fn peer_authentications(
    objects: &[Arc<KubePeerAuthentication>],
    problems: &mut Vec<ObjectProblem>,
) -> Vec<PeerAuthentication> {
    let mut sorted: Vec<&KubePeerAuthentication> = objects.iter().map(Arc::as_ref).collect();
    sorted.sort_by(|a, b| {
        let key = |object: &KubePeerAuthentication| {
            let metadata = &object.metadata;
            (
                metadata.creation_timestamp.as_ref().map(|time| time.0),
                metadata.namespace.clone(),
                metadata.name.clone(),
            )
        };
        key(a).cmp(&key(b))
    });
    let mut converted = Vec::with_capacity(sorted.len());
    let mut names = HashSet::new();
    for object in sorted {
        let report = |reason| problem("PeerAuthentication", &object.metadata, reason);
        let outcome = peer_authentication(object);
        problems.extend(outcome.problems.into_iter().map(report));
        let Some(entry) = outcome.entry else {
            continue;
        };
        if !names.insert((entry.namespace.clone(), entry.name.clone())) {
            problems.push(report(ProblemReason::Duplicate));
            continue;
        }
        converted.push(entry);
    }
    converted
}

/// The mesh PeerAuthentication of one object, or why it is left out. A
/// port key that is no port is skipped; a mode this Istio does not know
/// leaves the object out (istiod cannot decode it either).
fn peer_authentication(object: &KubePeerAuthentication) -> Outcome<PeerAuthentication> {
    let (name, namespace) = match name_and_namespace(&object.metadata) {
        Ok(names) => names,
        Err(reason) => return Outcome::left_out(reason),
    };
    let spec = &object.spec;
    let mode = match mode(spec.mtls.as_ref()) {
        Ok(mode) => mode,
        Err(reason) => return Outcome::left_out(reason),
    };
    let mut problems = Vec::new();
    let mut port_level_mtls = BTreeMap::new();
    for (key, mtls) in &spec.port_level_mtls {
        let port_mode = match mode_of(mtls) {
            Ok(mode) => mode,
            Err(reason) => return Outcome::left_out(reason),
        };
        match key.parse::<u16>() {
            Ok(port) if port != 0 => {
                port_level_mtls.insert(port, port_mode);
            }
            _ => problems.push(ProblemReason::BadPortKey { key: key.clone() }),
        }
    }
    Outcome {
        entry: Some(PeerAuthentication {
            name,
            namespace,
            selector: spec
                .selector
                .as_ref()
                .map(|selector| selector.match_labels.clone()),
            mode,
            port_level_mtls,
        }),
        problems,
    }
}

fn mode(mtls: Option<&MutualTls>) -> Result<MtlsMode, ProblemReason> {
    mtls.map_or(Ok(MtlsMode::Unset), mode_of)
}

fn mode_of(mtls: &MutualTls) -> Result<MtlsMode, ProblemReason> {
    match mtls.mode.as_deref() {
        None | Some("UNSET") => Ok(MtlsMode::Unset),
        Some("DISABLE") => Ok(MtlsMode::Disable),
        Some("PERMISSIVE") => Ok(MtlsMode::Permissive),
        Some("STRICT") => Ok(MtlsMode::Strict),
        Some(other) => Err(ProblemReason::UnknownMtlsMode {
            mode: other.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests;
