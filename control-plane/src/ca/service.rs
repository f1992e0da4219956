//! `istio.v1.auth.IstioCertificateService/CreateCertificate` (WIRE.md §3):
//! the thin async shell that reads the request, calls authentication,
//! authorization and the issuer, and maps every outcome to the gRPC status
//! istiod would return. All decisions live in the modules it calls.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use tonic::{Request, Response, Status};
use ztunnel_proto::istio::v1::auth::istio_certificate_service_server::IstioCertificateService;
use ztunnel_proto::istio::v1::auth::{IstioCertificateRequest, IstioCertificateResponse};

use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_certs::issuer::{Issuer, IssuerError, SigningRequest, TtlPolicy};

use super::CaConfig;
use super::authenticator::Authenticator;
use super::authn::{Caller, bearer_token};
use super::authz::{Denial, NodeAgentAccount, authorize};
use super::connection::{Authenticated, mark_authenticated};
use super::denial_log::DenialLog;
use super::metrics::CaMetrics;
use ztunnel_mesh::PodRegistry;

/// The request metadata key naming the identity a node agent asks for.
const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

/// Everything a request is decided against.
pub struct CertificateService {
    /// The CA's trust domain.
    trust_domain: String,
    /// Signs the certificates.
    issuer: Arc<Issuer>,
    /// Default and maximum lifetimes.
    ttl: TtlPolicy,
    /// Who a token belongs to.
    authenticator: Arc<Authenticator>,
    /// Who may impersonate.
    trusted_node_accounts: Vec<NodeAgentAccount>,
    /// Where pods and their nodes come from.
    registry: Arc<dyn PodRegistry>,
    /// Counters.
    metrics: Arc<CaMetrics>,
    /// Budgets the lines about unauthenticated denials.
    unauthenticated_log: Mutex<DenialLog>,
}

impl CertificateService {
    /// A service deciding requests by `config`.
    pub fn new(config: CaConfig) -> Self {
        CertificateService {
            trust_domain: config.trust_domain,
            issuer: config.issuer,
            ttl: config.ttl,
            authenticator: config.authenticator,
            trusted_node_accounts: config.trusted_node_accounts,
            registry: config.registry,
            metrics: config.metrics,
            unauthenticated_log: Mutex::new(DenialLog::default()),
        }
    }

    /// Handles one request at `now`.
    async fn create(
        &self,
        request: &Request<IstioCertificateRequest>,
        now: SystemTime,
    ) -> Result<IstioCertificateResponse, Status> {
        let body = request.get_ref();
        let impersonate = impersonated_identity(body);
        let caller = self
            .authenticate(request, now)
            .await
            .map_err(|denial| self.deny(None, impersonate, &denial))?;
        mark_authenticated(request.extensions().get::<Authenticated>());
        let identity = authorize(
            &caller,
            impersonate,
            &self.trust_domain,
            &self.trusted_node_accounts,
            &self.registry.snapshot(),
        )
        .map_err(|denial| self.deny(Some(&caller), impersonate, &denial))?;

        let ttl = self.ttl.resolve(body.validity_duration).map_err(|error| {
            self.metrics.record_rejection("ttl_too_long");
            signing_error(&error)
        })?;
        let csr = SigningRequest::from_pem(&body.csr).map_err(|error| {
            self.metrics.record_rejection("invalid_csr");
            tracing::info!(caller = %identity, error = %ErrorChain(&error), "CSR refused");
            Status::invalid_argument(format!("CSR signing error ({})", ErrorChain(&error)))
        })?;
        let cert_chain = self
            .issuer
            .sign_workload(&csr, &identity, ttl, now)
            .map_err(|error| {
                tracing::error!(%identity, error = %ErrorChain(&error), "signing failed");
                signing_error(&error)
            })?;
        self.metrics.record_issued(impersonate.is_some());
        tracing::info!(
            caller = %format_args!("{}/{}", caller.namespace, caller.pod_name),
            %identity,
            ttl_secs = ttl.as_secs(),
            "certificate issued"
        );
        Ok(IstioCertificateResponse { cert_chain })
    }

    async fn authenticate(
        &self,
        request: &Request<IstioCertificateRequest>,
        now: SystemTime,
    ) -> Result<Caller, Denial> {
        let header = request
            .metadata()
            .get("authorization")
            .map(|value| value.as_bytes());
        let token = bearer_token(header)?;
        Ok(self.authenticator.authenticate(token, now).await?)
    }

    /// Logs and counts a denial and returns the opaque status for it.
    fn deny(&self, caller: Option<&Caller>, requested: Option<&str>, denial: &Denial) -> Status {
        self.metrics.record_denial(denial);
        // A flood of junk is counted in full and logged a line a second.
        let left_out = match caller {
            Some(_) => 0,
            None => {
                let mut log = self
                    .unauthenticated_log
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                match log.admit(Instant::now()) {
                    Some(left_out) => left_out,
                    None => return Status::unauthenticated(denial.public_message()),
                }
            }
        };
        let caller = caller.map(|c| {
            format!(
                "{}/{} pod={} uid={}",
                c.namespace, c.service_account, c.pod_name, c.pod_uid
            )
        });
        tracing::warn!(
            caller = caller.as_deref().unwrap_or("unauthenticated"),
            requested = requested.map_or("own identity", |text| bounded_for_log(text, 256)),
            reason = denial.label(),
            detail = %ErrorChain(denial),
            unauthenticated_left_out = left_out,
            "certificate request denied"
        );
        Status::unauthenticated(denial.public_message())
    }
}

#[tonic::async_trait]
impl IstioCertificateService for CertificateService {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        // `clusterid` picks the cluster in a multi-cluster istiod; this CA
        // serves one cluster and accepts any value.
        self.create(&request, SystemTime::now())
            .await
            .map(Response::new)
    }
}

/// The non-empty string `ImpersonatedIdentity` of the request metadata. A
/// non-string value reads as empty, as it does in istiod.
pub fn impersonated_identity(request: &IstioCertificateRequest) -> Option<&str> {
    let value = request
        .metadata
        .as_ref()?
        .fields
        .get(IMPERSONATED_IDENTITY)?;
    match &value.kind {
        Some(prost_types::value::Kind::StringValue(identity)) if !identity.is_empty() => {
            Some(identity)
        }
        _ => None,
    }
}

/// The first `max` characters of a caller-supplied string: enough to
/// recognise it, without letting a caller write megabyte log lines.
pub(crate) fn bounded_for_log(text: &str, max: usize) -> &str {
    text.char_indices()
        .nth(max)
        .and_then(|(end, _)| text.get(..end))
        .unwrap_or(text)
}

/// The status for an issuer error, in istiod's `CSR signing error (...)` form.
fn signing_error(error: &IssuerError) -> Status {
    let message = format!("CSR signing error ({})", ErrorChain(error));
    match error {
        IssuerError::TtlTooLong { .. } => Status::invalid_argument(message),
        _ => Status::internal(message),
    }
}

#[cfg(test)]
mod tests {
    use prost_types::value::Kind;
    use prost_types::{Struct, Value};

    use super::*;

    fn with_metadata(kind: Option<Kind>) -> IstioCertificateRequest {
        IstioCertificateRequest {
            metadata: Some(Struct {
                fields: [(IMPERSONATED_IDENTITY.to_string(), Value { kind })].into(),
            }),
            ..IstioCertificateRequest::default()
        }
    }

    #[test]
    fn impersonated_identity_is_a_non_empty_string_value() {
        let uri = "spiffe://cluster.local/ns/a/sa/b";
        let request = with_metadata(Some(Kind::StringValue(uri.into())));
        assert_eq!(impersonated_identity(&request), Some(uri));
        let empty = with_metadata(Some(Kind::StringValue(String::new())));
        assert_eq!(impersonated_identity(&empty), None);
        let number = with_metadata(Some(Kind::NumberValue(1.0)));
        assert_eq!(
            impersonated_identity(&number),
            None,
            "as istiod: not a string reads as empty"
        );
        assert_eq!(
            impersonated_identity(&IstioCertificateRequest::default()),
            None
        );
    }

    #[test]
    fn caller_strings_are_bounded_in_logs() {
        assert_eq!(bounded_for_log("short", 256), "short");
        let long = "é".repeat(1000);
        assert_eq!(bounded_for_log(&long, 256).chars().count(), 256);
    }
}
