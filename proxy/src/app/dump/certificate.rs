//! `certificates[]` of `/config_dump` (AMBIENT.md §6.5): per identity its
//! state, chain and roots, each certificate as base64 of its PEM text with
//! its serial and validity. Only public certificates are shown; the
//! private key that [`WorkloadCertificate`] holds is never read here.

use std::time::SystemTime;

use base64::Engine;
use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use ztunnel_certs::cert::{Certificate, WorkloadCertificate};
use ztunnel_certs::issuer::pem_certificate;

use crate::identity::manager::{CertificateState, CertificateSummary};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CertificatesDump {
    identity: String,
    state: String,
    cert_chain: Vec<CertDump>,
    root_certs: Vec<CertDump>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CertDump {
    pem: String,
    serial_number: String,
    valid_from: String,
    expiration_time: String,
}

/// The identities' certificates, in the order given (sorted by identity).
pub(super) fn certificates(summaries: &[CertificateSummary]) -> Vec<CertificatesDump> {
    summaries.iter().map(certificates_dump).collect()
}

fn certificates_dump(summary: &CertificateSummary) -> CertificatesDump {
    let (cert_chain, root_certs) = summary
        .certificate
        .as_deref()
        .map(chain_and_roots)
        .unwrap_or_default();
    CertificatesDump {
        identity: summary.identity.as_str().to_owned(),
        state: match &summary.state {
            CertificateState::Pending => "Initializing".to_owned(),
            CertificateState::Available => "Available".to_owned(),
            CertificateState::Failed { error, .. } => format!("Unavailable: {error}"),
        },
        cert_chain,
        root_certs,
    }
}

/// The leaf and intermediates, then the roots. A root that does not parse
/// (it was accepted as a trust anchor, so this does not happen) is left out.
fn chain_and_roots(certificate: &WorkloadCertificate) -> (Vec<CertDump>, Vec<CertDump>) {
    let chain = std::iter::once(certificate.leaf())
        .chain(certificate.intermediates())
        .map(cert_dump)
        .collect();
    let roots = certificate
        .roots()
        .certificates()
        .iter()
        .filter_map(|der| Certificate::from_der(der.clone()).ok())
        .map(|root| cert_dump(&root))
        .collect();
    (chain, roots)
}

fn cert_dump(certificate: &Certificate) -> CertDump {
    let pem = pem_certificate(certificate.der());
    CertDump {
        pem: base64::engine::general_purpose::STANDARD.encode(pem),
        serial_number: certificate.serial().to_owned(),
        valid_from: rfc3339(certificate.not_before()),
        expiration_time: rfc3339(certificate.not_after()),
    }
}

/// RFC 3339 in UTC, to the second, e.g. `2026-12-06T09:30:00Z`.
pub(super) fn rfc3339(time: SystemTime) -> String {
    let whole_seconds = OffsetDateTime::from(time)
        .replace_nanosecond(0)
        .unwrap_or_else(|_| OffsetDateTime::from(time));
    whole_seconds.format(&Rfc3339).unwrap_or_default()
}
