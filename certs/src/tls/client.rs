//! The dialing side of mesh mTLS (WIRE.md §4): present the workload's chain,
//! send no SNI, never resume, and accept a server only if its chain reaches
//! our roots and its one identity is one we expected to reach.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use rustls::client::Resumption;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::sign::SingleCertAndKey;
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use webpki::KeyUsage;

use crate::cert::WorkloadCertificate;
use crate::identity::Identity;
use crate::tls::revocation;
use crate::tls::verify::{PeerError, leaf_identity, verify_chain};
use crate::tls::{ALPN_H2, TlsError, TrustRoots, provider};

/// The server name to dial with. Peers are identified by URI SAN, not by
/// name, and SNI is off, so any name works; ztunnel uses `0.0.0.0`.
pub fn dummy_server_name() -> ServerName<'static> {
    ServerName::IpAddress(IpAddr::V4(Ipv4Addr::UNSPECIFIED).into())
}

/// A client config that presents `cert` and accepts a server only if its
/// identity is in `expected` (the destination's identity plus its services'
/// SANs). Dial with [`dummy_server_name`].
pub fn client_config(
    cert: &WorkloadCertificate,
    expected: Vec<Identity>,
) -> Result<ClientConfig, TlsError> {
    if expected.is_empty() {
        return Err(TlsError::NoExpectedIdentity);
    }
    let provider = provider();
    let verifier = ServerIdentityVerifier {
        roots: cert.roots().clone(),
        expected,
        algorithms: provider.signature_verification_algorithms,
    };
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(Arc::clone(
            cert.certified_key(),
        ))));
    config.enable_sni = false;
    config.resumption = Resumption::disabled();
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    // The record layer (`tls/record.rs`) takes the traffic secrets out of
    // the session once the handshake is done.
    config.enable_secret_extraction = true;
    Ok(config)
}

/// Verifies the server's chain without looking at DNS or IP names, then its
/// SPIFFE identity against the expected set.
#[derive(Debug)]
struct ServerIdentityVerifier {
    roots: TrustRoots,
    /// Short (one workload plus a few service SANs), so a scan is cheapest.
    expected: Vec<Identity>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for ServerIdentityVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        verify_chain(
            end_entity,
            intermediates,
            &self.roots,
            now,
            KeyUsage::server_auth(),
            &self.algorithms,
            revocation::in_force().as_ref(),
        )?;
        let identity = leaf_identity(end_entity)?;
        if !self.expected.contains(&identity) {
            return Err(PeerError::UnexpectedIdentity(identity).into());
        }
        Ok(ServerCertVerified::assertion())
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
