//! What became of a pod's `add` toward ztunnel, and what that means for
//! the pod's annotation and for the plugin's answer. The waiting is
//! `mesh.rs`'s.

use tokio::sync::oneshot;

use crate::agent::kube::Redirection;
use crate::agent::zds::ZdsError;

use super::MeshError;

/// What became of a pod's `add` toward ztunnel.
#[derive(Debug)]
pub(super) enum ZtunnelOutcome {
    /// ztunnel acked it.
    Acked,
    /// No ztunnel was connected; the pod is in the next snapshot.
    NoZtunnel,
    /// The connection or the netns went away before the ack; the pod is in
    /// the next snapshot.
    Lost(String),
    /// ztunnel refused it.
    Refused(ZdsError),
    /// ztunnel did not answer before the plugin's deadline.
    TimedOut,
}

impl ZtunnelOutcome {
    /// Classifies the wait for ztunnel's answer.
    pub(super) fn of(
        answer: Result<
            Result<Result<(), ZdsError>, oneshot::error::RecvError>,
            tokio::time::error::Elapsed,
        >,
    ) -> ZtunnelOutcome {
        match answer {
            Ok(Ok(Ok(()))) => ZtunnelOutcome::Acked,
            Ok(Ok(Err(ZdsError::ConnectionLost(error) | ZdsError::NetnsGone(error)))) => {
                ZtunnelOutcome::Lost(error)
            }
            Ok(Ok(Err(error))) => ZtunnelOutcome::Refused(error),
            Ok(Err(_)) => ZtunnelOutcome::Lost("the connection ended without answering".to_owned()),
            Err(_) => ZtunnelOutcome::TimedOut,
        }
    }

    /// The annotation that says it: `enabled` only once ztunnel has the
    /// pod, `pending` while its rules wait for ztunnel.
    pub(super) fn redirection(&self) -> Redirection {
        match self {
            ZtunnelOutcome::Acked => Redirection::Enabled,
            _ => Redirection::Pending,
        }
    }

    /// What the plugin hears: success once the rules are in place and the
    /// pod is ztunnel's or queued for it; an error when ztunnel refused it
    /// or did not answer in time.
    pub(super) fn into_result(self) -> Result<(), MeshError> {
        match self {
            ZtunnelOutcome::Acked | ZtunnelOutcome::NoZtunnel | ZtunnelOutcome::Lost(_) => Ok(()),
            ZtunnelOutcome::Refused(error) => Err(MeshError::Ztunnel(error)),
            ZtunnelOutcome::TimedOut => Err(MeshError::AckTimeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_ack_enables_and_only_a_refusal_or_timeout_fails_the_add() {
        let ok = Ok(Ok(Ok(())));
        let lost = Ok(Ok(Err(ZdsError::ConnectionLost("reset".to_owned()))));
        let netns_gone = Ok(Ok(Err(ZdsError::NetnsGone("ENOENT".to_owned()))));
        let refused = Ok(Ok(Err(ZdsError::Nack("unknown netns".to_owned()))));
        #[rustfmt::skip]
        let cases = [
            ("acked", ZtunnelOutcome::of(ok), Redirection::Enabled, true),
            ("no ztunnel connected", ZtunnelOutcome::NoZtunnel, Redirection::Pending, true),
            ("connection lost", ZtunnelOutcome::of(lost), Redirection::Pending, true),
            ("netns gone", ZtunnelOutcome::of(netns_gone), Redirection::Pending, true),
            ("refused", ZtunnelOutcome::of(refused), Redirection::Pending, false),
            ("not acked in time", ZtunnelOutcome::TimedOut, Redirection::Pending, false),
        ];
        for (reason, outcome, redirection, succeeds) in cases {
            assert_eq!(outcome.redirection(), redirection, "{reason}");
            assert_eq!(outcome.into_result().is_ok(), succeeds, "{reason}");
        }
    }
}
