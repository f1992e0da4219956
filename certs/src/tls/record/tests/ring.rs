//! A stock rustls peer on ring's own TLS 1.3 suites, so that the records we
//! seal are opened, and the records we open were sealed, by an AES-GCM and
//! a key schedule that are not aws-lc-rs's: each suite, both directions,
//! key updates either side asks for, and the limit that updates ours.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls13_signature};
use rustls::pki_types::CertificateDer;
use rustls::sign::SingleCertAndKey;
use rustls::{DigitallySignedStruct, SignatureScheme, SupportedCipherSuite};

use super::*;

/// ring's TLS 1.3 AES-GCM suites, those of WIRE.md §4.
fn ring_suites() -> [SupportedCipherSuite; 2] {
    [
        rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256,
        rustls::crypto::ring::cipher_suite::TLS13_AES_256_GCM_SHA384,
    ]
}

/// ring's provider, offering `suite` only.
fn ring_provider(suite: SupportedCipherSuite) -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider {
        cipher_suites: vec![suite],
        ..rustls::crypto::ring::default_provider()
    })
}

/// A stock server on ring, presenting our server's certificate.
fn ring_server(suite: SupportedCipherSuite) -> Arc<ServerConfig> {
    let mut config = ServerConfig::builder_with_provider(ring_provider(suite))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(Arc::clone(
            pki().server.certified_key(),
        ))));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Arc::new(config)
}

/// A stock client on ring, presenting our client's certificate.
fn ring_client(suite: SupportedCipherSuite) -> Arc<ClientConfig> {
    let provider = ring_provider(suite);
    let verifier = SignatureOnly(provider.signature_verification_algorithms);
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_client_cert_resolver(Arc::new(SingleCertAndKey::from(Arc::clone(
            pki().client.certified_key(),
        ))));
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Arc::new(config)
}

/// Checks the server's handshake signature with ring, not its chain: the
/// chain is the business of our verifier's tests, this peer is here for
/// its records.
#[derive(Debug)]
struct SignatureOnly(rustls::crypto::WebPkiSupportedAlgorithms);

impl ServerCertVerifier for SignatureOnly {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not offered".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, signature, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[tokio::test]
async fn a_stock_peer_on_ring_and_ours_move_every_byte_both_ways_with_each_suite() {
    for suite in ring_suites() {
        let (ours, negotiated, theirs, _) = ours_to_stock(ring_server(suite)).await;
        assert_eq!(negotiated.peer_identity, Some(identity(SERVER)));
        assert_eq!(theirs.get_ref().1.negotiated_cipher_suite(), Some(suite));
        exchange_every_size(ours, theirs).await;

        let (ours, negotiated, theirs, _) = stock_to_ours(ring_client(suite), server_tls()).await;
        assert_eq!(negotiated.peer_identity, Some(identity(CLIENT)));
        assert_eq!(theirs.get_ref().1.negotiated_cipher_suite(), Some(suite));
        exchange_every_size(ours, theirs).await;
    }
}

#[tokio::test]
async fn key_updates_with_a_stock_peer_on_ring_either_side_asks_for_keep_data_flowing() {
    let len = 4 * 16_384;
    for suite in ring_suites() {
        // The ring peer asks: we answer with one update each time.
        let (mut ours, _, mut theirs, wire) = ours_to_stock(ring_server(suite)).await;
        for _ in 0..3 {
            theirs.get_mut().1.refresh_traffic_keys().unwrap();
            let noted = wire.lock().unwrap().len();
            send(&mut theirs, &mut ours, len, &RECORD_CUTS).await;
            send(&mut ours, &mut theirs, len, &RECORD_CUTS).await;
            assert_eq!(key_updates(&wire, noted), 1, "one answer per request");
        }
        // Our key crosses its lowered limit four times in 4 MiB.
        let (mut ours, _, mut theirs, wire) = stock_to_ours(ring_client(suite), server_tls()).await;
        ours.sender.set_limit(64);
        let noted = wire.lock().unwrap().len();
        send(&mut ours, &mut theirs, 4 << 20, &RECORD_CUTS).await;
        assert_eq!(key_updates(&wire, noted), 4);
        send(&mut theirs, &mut ours, 1 << 20, &FRAME_CUTS).await;
    }
}
