//! The inbound decision, as a pure function: may a connection that arrived
//! for a local workload (over HBONE with a verified peer identity, or as
//! captured plaintext with none) reach it, and where is the application
//! dialled. The answer carries its HTTP status so that one place decides
//! what a refusal means on the wire (WIRE.md §4).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ztunnel_certs::identity::Identity;

use crate::hbone::InboundRefusal;
use crate::metrics::ResponseFlags;
use crate::outbound::route::PROXY_PORTS;
use crate::rbac::{Connection, DenyReason, DryRunMatch, Verdict, applicable_policies, authorize};
use crate::state::{State, Workload};

/// What arrived, in plain data.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// The peer's verified identity; `None` for plaintext (15006).
    pub peer_identity: Option<Identity>,
    /// The client's IP (the TCP peer of the tunnel or of the plaintext
    /// connection).
    pub source_ip: IpAddr,
    /// That peer's port, for the access log and the metrics' address.
    pub source_port: u16,
    /// The local address the connection arrived on.
    pub local_ip: IpAddr,
    /// Where the client wants to go: the CONNECT `:authority`, or the
    /// original destination for plaintext.
    pub target: SocketAddr,
}

/// An accepted connection: dial `upstream` for `workload`.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The local destination workload.
    pub workload: Arc<Workload>,
    /// The application address to dial.
    pub upstream: SocketAddr,
    /// The authorization inputs, kept to re-check the connection when
    /// policies change.
    pub connection: Connection,
    /// Dry-run policies that matched, for the log.
    pub dry_run: Vec<DryRunMatch>,
}

/// Why an inbound connection is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The authority's IP is not the address the connection arrived on.
    #[error("authority {target} does not match the destination address {local}")]
    AuthorityMismatch {
        /// The requested target.
        target: SocketAddr,
        /// The local address.
        local: IpAddr,
    },
    /// No local workload has the target IP.
    #[error("unknown destination workload {0}")]
    UnknownWorkload(IpAddr),
    /// The target port is one of ztunnel's own.
    #[error("attempted recursive call to ourselves")]
    SelfCall,
    /// Authorization policy refused it.
    #[error("{0}")]
    Denied(DenyReason),
}

/// What a refused inbound connection answers on the wire and how it is
/// counted: the one mapping of WIRE.md §4's statuses and the metrics'
/// response flags. A tunnelled connection gets the refusal's `:status`; a
/// plaintext one is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusalAnswer {
    /// The HBONE response.
    pub refusal: InboundRefusal,
    /// The `response_flags` of its metrics.
    pub flags: ResponseFlags,
}

impl RefusalAnswer {
    /// Admitted, but the application could not be dialled.
    pub const UNREACHABLE: RefusalAnswer = RefusalAnswer {
        refusal: InboundRefusal::Unavailable("application unreachable"),
        flags: ResponseFlags::Connect,
    };
}

impl Refusal {
    /// The answer to this refusal.
    pub fn answer(&self) -> RefusalAnswer {
        let (refusal, flags) = match self {
            Refusal::AuthorityMismatch { .. } => (
                InboundRefusal::BadRequest("authority does not match the destination"),
                ResponseFlags::Connect,
            ),
            Refusal::UnknownWorkload(_) => (
                InboundRefusal::Unavailable("unknown destination workload"),
                ResponseFlags::Connect,
            ),
            Refusal::SelfCall => (
                InboundRefusal::Unavailable("recursive call to ztunnel"),
                ResponseFlags::Connect,
            ),
            Refusal::Denied(_) => (InboundRefusal::Denied, ResponseFlags::Deny),
        };
        RefusalAnswer { refusal, flags }
    }
}

/// Decides an arrival against the state. `local` limits the destination to
/// the workloads this proxy serves (the dedicated workload, or the pod whose
/// namespace the listener is in).
pub fn admit(
    state: &State,
    network: &str,
    local: impl Fn(&Workload) -> bool,
    arrival: &Arrival,
) -> Result<Admitted, Refusal> {
    if arrival.target.ip() != arrival.local_ip {
        return Err(Refusal::AuthorityMismatch {
            target: arrival.target,
            local: arrival.local_ip,
        });
    }
    let workload = state
        .workload_by_address(network, arrival.target.ip())
        .filter(|workload| local(workload))
        .cloned()
        .ok_or(Refusal::UnknownWorkload(arrival.target.ip()))?;
    if PROXY_PORTS.contains(&arrival.target.port()) {
        return Err(Refusal::SelfCall);
    }
    let connection = Connection {
        source_identity: arrival.peer_identity.clone(),
        source_ip: arrival.source_ip,
        destination_ip: arrival.target.ip(),
        destination_port: arrival.target.port(),
        destination_namespace: workload.namespace.clone(),
        destination_workload: workload.uid.clone(),
    };
    let decision = authorize(&connection, applicable_policies(state, &workload));
    match decision.verdict {
        Verdict::Allow => Ok(Admitted {
            workload,
            upstream: arrival.target,
            connection,
            dry_run: decision.dry_run_matches,
        }),
        Verdict::Deny(reason) => Err(Refusal::Denied(reason)),
    }
}

/// Re-checks an open connection after a policy change.
pub fn still_allowed(state: &State, connection: &Connection) -> Result<(), DenyReason> {
    let Some(workload) = state.workload(&connection.destination_workload) else {
        // The workload is gone: nothing to check its connections against;
        // its proxy is being torn down.
        return Ok(());
    };
    match authorize(connection, applicable_policies(state, workload)).verdict {
        Verdict::Allow => Ok(()),
        Verdict::Deny(reason) => Err(reason),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::local;

    const STATE: &str = r#"
workloads:
- uid: uid-server
  name: server-0
  namespace: default
  serviceAccount: server
  workloadIps: [198.18.1.10]
  protocol: HBONE
  services: {}
policies:
- name: only-client
  namespace: default
  scope: Namespace
  action: Allow
  rules:
  - - - principals: [!Exact "cluster.local/ns/default/sa/client"]
- name: no-admin-port
  namespace: default
  scope: Namespace
  action: Deny
  rules:
  - - - destinationPorts: [9000]
"#;

    fn arrival(identity: Option<&str>, target: &str) -> Arrival {
        Arrival {
            peer_identity: identity.map(|id| id.parse().unwrap()),
            source_ip: "198.18.0.10".parse().unwrap(),
            source_port: 40000,
            local_ip: "198.18.1.10".parse().unwrap(),
            target: target.parse().unwrap(),
        }
    }

    #[test]
    fn admissions() {
        let state = local::parse(STATE, Path::new("t.yaml"))
            .unwrap()
            .into_state();
        let client = Some("spiffe://cluster.local/ns/default/sa/client");
        let other = Some("spiffe://cluster.local/ns/default/sa/other");
        let admitted = admit(&state, "", |_| true, &arrival(client, "198.18.1.10:8080")).unwrap();
        assert_eq!(admitted.upstream, "198.18.1.10:8080".parse().unwrap());
        assert_eq!(admitted.workload.name.as_ref(), "server-0");

        let cases: &[(Option<&str>, &str, u16)] = &[
            (client, "198.18.1.11:8080", 400),
            (client, "198.18.1.10:15008", 503),
            (client, "198.18.1.10:15006", 503),
            (other, "198.18.1.10:8080", 401),
            (None, "198.18.1.10:8080", 401),
            (client, "198.18.1.10:9000", 401),
        ];
        for (identity, target, status) in cases {
            let refusal = admit(&state, "", |_| true, &arrival(*identity, target)).unwrap_err();
            assert_eq!(
                refusal.answer().refusal.status().as_u16(),
                *status,
                "{identity:?} → {target}: {refusal}"
            );
        }
        let not_local = admit(&state, "", |_| false, &arrival(client, "198.18.1.10:8080"));
        let status = not_local.unwrap_err().answer().refusal.status();
        assert_eq!(status.as_u16(), 503);
    }

    #[test]
    fn every_refusal_has_one_status_and_one_flag() {
        let ip: IpAddr = "198.18.1.10".parse().unwrap();
        let denied = DenyReason::NotAllowed;
        let cases = [
            (
                Refusal::AuthorityMismatch {
                    target: "198.18.1.11:80".parse().unwrap(),
                    local: ip,
                },
                400,
                ResponseFlags::Connect,
            ),
            (Refusal::UnknownWorkload(ip), 503, ResponseFlags::Connect),
            (Refusal::SelfCall, 503, ResponseFlags::Connect),
            (Refusal::Denied(denied), 401, ResponseFlags::Deny),
        ];
        for (refusal, status, flags) in cases {
            let answer = refusal.answer();
            assert_eq!(answer.refusal.status().as_u16(), status, "{refusal}");
            assert_eq!(answer.flags, flags, "{refusal}");
        }
        assert_eq!(RefusalAnswer::UNREACHABLE.refusal.status().as_u16(), 503);
        assert_eq!(RefusalAnswer::UNREACHABLE.flags, ResponseFlags::Connect);
    }

    #[test]
    fn a_policy_change_is_seen_by_the_recheck() {
        let mut state = local::parse(STATE, Path::new("t.yaml"))
            .unwrap()
            .into_state();
        let other = Some("spiffe://cluster.local/ns/default/sa/other");
        let admitted = {
            let open = STATE.replace("sa/client", "sa/other");
            let state = local::parse(&open, Path::new("t.yaml"))
                .unwrap()
                .into_state();
            admit(&state, "", |_| true, &arrival(other, "198.18.1.10:8080")).unwrap()
        };
        assert!(still_allowed(&state, &admitted.connection).is_err());
        state.remove_policy("default/only-client");
        assert!(still_allowed(&state, &admitted.connection).is_ok());
    }
}
