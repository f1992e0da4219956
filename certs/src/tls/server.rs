//! The accepting side of mesh mTLS (WIRE.md §4): present the workload's
//! chain, require a client certificate, and accept a client only if its chain
//! reaches our roots and its one identity is in our trust domain. Who may do
//! what is authorization's business, fed by [`super::peer_identity`].

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::SingleCertAndKey;
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};
use webpki::KeyUsage;

use crate::cert::WorkloadCertificate;
use crate::tls::revocation;
use crate::tls::verify::{PeerError, leaf_identity, verify_chain};
use crate::tls::{ALPN_H2, TlsError, TrustRoots, provider};

/// A server config that presents `cert` and admits clients of `cert`'s own
/// trust domain only.
pub fn server_config(cert: &WorkloadCertificate) -> Result<ServerConfig, TlsError> {
    let own = cert.identity().ok_or(TlsError::NoOwnIdentity)?;
    let provider = provider();
    let verifier = ClientIdentityVerifier {
        roots: cert.roots().clone(),
        trust_domain: own.trust_domain().to_owned(),
        algorithms: provider.signature_verification_algorithms,
    };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(Arc::new(verifier))
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(Arc::clone(
            cert.certified_key(),
        ))));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    // Mesh clients never resume (WIRE.md §4), so tickets would be wasted
    // bytes, and a session cache (rustls allocates one of 256 entries,
    // ~21 KiB, with every config) would be memory held by every connection
    // for nothing.
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    // The record layer (`tls/record.rs`) takes the traffic secrets out of
    // the session once the handshake is done.
    config.enable_secret_extraction = true;
    Ok(config)
}

/// Verifies the client's chain, then that its identity shares our trust
/// domain.
#[derive(Debug)]
struct ClientIdentityVerifier {
    roots: TrustRoots,
    trust_domain: String,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for ClientIdentityVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Mesh clients hold one certificate and present it regardless, so
        // naming the roots in every CertificateRequest would only cost bytes.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        verify_chain(
            end_entity,
            intermediates,
            &self.roots,
            now,
            KeyUsage::client_auth(),
            &self.algorithms,
            revocation::in_force().as_ref(),
        )?;
        let identity = leaf_identity(end_entity)?;
        if identity.trust_domain() != self.trust_domain {
            return Err(PeerError::ForeignTrustDomain {
                identity,
                trust_domain: self.trust_domain.clone(),
            }
            .into());
        }
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
