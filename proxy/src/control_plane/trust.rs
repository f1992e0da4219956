//! The roots a control-plane server is trusted through, and the rustls
//! client configuration built on them: TLS 1.3, ALPN `h2`, no client
//! certificate, normal hostname checks, optionally a second acceptable name
//! (`ALT_XDS_HOSTNAME`, WIRE.md §7).

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::ControlPlaneError;

/// Where distributions keep the system's PEM root bundle, tried in order for
/// `SYSTEM` roots: Debian/Ubuntu/Alpine, Fedora/RHEL, openSUSE, the RHEL
/// extracted bundle, and the BSD/macOS-style path some images use.
const SYSTEM_ROOT_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Where the roots come from. The config module decides which from the
/// setting's text (WIRE.md §7: a file path, else inline PEM, or `SYSTEM`).
#[derive(Clone, PartialEq, Eq)]
pub enum RootSource {
    /// A PEM file, read at every connection attempt so a rotated root is
    /// picked up on the next reconnect.
    File(PathBuf),
    /// PEM given inline in the setting.
    Pem(String),
    /// The operating system's root bundle.
    System,
}

impl fmt::Debug for RootSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RootSource::File(path) => f.debug_tuple("File").field(path).finish(),
            RootSource::Pem(pem) => write!(f, "Pem({} bytes)", pem.len()),
            RootSource::System => f.write_str("System"),
        }
    }
}

impl RootSource {
    /// Reads and parses the roots now.
    pub fn load(&self) -> Result<RootCertStore, ControlPlaneError> {
        match self {
            RootSource::File(path) => {
                let pem = std::fs::read(path).map_err(|source| ControlPlaneError::RootRead {
                    path: path.clone(),
                    source,
                })?;
                parse_roots(&pem, &path.display().to_string(), Strictness::Every)
            }
            RootSource::Pem(pem) => {
                parse_roots(pem.as_bytes(), "the inline PEM", Strictness::Every)
            }
            RootSource::System => {
                let bundle = SYSTEM_ROOT_BUNDLES
                    .iter()
                    .find_map(|path| std::fs::read(path).ok().map(|pem| (path, pem)));
                let Some((path, pem)) = bundle else {
                    return Err(ControlPlaneError::NoSystemRoots(
                        SYSTEM_ROOT_BUNDLES.join(", "),
                    ));
                };
                // System bundles carry roots WebPKI cannot parse (old or
                // unusual ones); those are skipped rather than fatal.
                parse_roots(&pem, path, Strictness::AnyUsable)
            }
        }
    }
}

/// How a bundle with some unusable certificates is treated.
#[derive(Clone, Copy)]
enum Strictness {
    /// Every certificate must be a usable root: a configured root file
    /// names exactly what to trust.
    Every,
    /// Unusable certificates are skipped; at least one must remain.
    AnyUsable,
}

/// The certificates of a PEM bundle as roots.
fn parse_roots(
    pem: &[u8],
    origin: &str,
    strictness: Strictness,
) -> Result<RootCertStore, ControlPlaneError> {
    let invalid = |reason: String| ControlPlaneError::RootInvalid {
        origin: origin.to_owned(),
        reason,
    };
    let roots = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| invalid(error.to_string()))?;
    let mut store = RootCertStore::empty();
    match strictness {
        Strictness::Every => {
            for root in roots {
                store
                    .add(root)
                    .map_err(|error| invalid(error.to_string()))?;
            }
        }
        Strictness::AnyUsable => {
            store.add_parsable_certificates(roots);
        }
    }
    if store.is_empty() {
        return Err(invalid("no certificate found".to_owned()));
    }
    Ok(store)
}

/// TLS 1.3 only, HTTP/2 by ALPN, server authentication against `roots` alone
/// with normal hostname checks, no client certificate. With `alt_name`, a
/// certificate not valid for the dialed name is accepted when it is valid
/// for `alt_name` instead.
pub fn client_tls_config(
    roots: RootCertStore,
    alt_name: Option<&str>,
) -> Result<rustls::ClientConfig, ControlPlaneError> {
    let provider = ztunnel_certs::tls::provider();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(ControlPlaneError::Tls)?;
    let mut config = match alt_name {
        None => builder.with_root_certificates(roots).with_no_client_auth(),
        Some(alt_name) => {
            let verifier = AltNameVerifier::new(roots, alt_name, provider)?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
                .with_no_client_auth()
        }
    };
    config.alpn_protocols = vec![ztunnel_certs::tls::ALPN_H2.to_vec()];
    Ok(config)
}

/// The standard WebPKI verifier, retried with a second name when the
/// certificate is not valid for the first. Chain, expiry and signature
/// checks are the inner verifier's, unchanged.
#[derive(Debug)]
struct AltNameVerifier {
    inner: Arc<WebPkiServerVerifier>,
    alt_name: ServerName<'static>,
}

impl AltNameVerifier {
    fn new(
        roots: RootCertStore,
        alt_name: &str,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<AltNameVerifier, ControlPlaneError> {
        let alt_name = ServerName::try_from(alt_name.to_owned())
            .map_err(|_| ControlPlaneError::InvalidServerName(alt_name.to_owned()))?;
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|error| ControlPlaneError::Tls(rustls::Error::General(error.to_string())))?;
        Ok(AltNameVerifier { inner, alt_name })
    }
}

impl ServerCertVerifier for AltNameVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verify = |name: &ServerName<'_>| {
            self.inner
                .verify_server_cert(end_entity, intermediates, name, ocsp_response, now)
        };
        match verify(server_name) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => verify(&self.alt_name),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use ztunnel_certs::issuer::{Issuer, SigningMaterial, generate_root};

    use super::*;

    /// A root, and a serving chain for `dns_names` signed by it.
    fn root_and_server(dns_names: &[&str]) -> (String, Vec<CertificateDer<'static>>) {
        let now = SystemTime::now();
        let root = generate_root("cluster.local", now).unwrap();
        let issuer = Issuer::new(&SigningMaterial {
            root_cert_pem: root.cert_pem.clone(),
            root_key_pem: Some(root.key_pem),
            ..SigningMaterial::default()
        })
        .unwrap();
        let names: Vec<String> = dns_names.iter().map(|name| (*name).to_owned()).collect();
        let serving = issuer.sign_server(&names, &[], now).unwrap();
        (root.cert_pem, serving.chain)
    }

    fn verify(verifier: &dyn ServerCertVerifier, chain: &[CertificateDer<'_>], name: &str) -> bool {
        let name = ServerName::try_from(name.to_owned()).unwrap();
        verifier
            .verify_server_cert(&chain[0], &chain[1..], &name, &[], UnixTime::now())
            .is_ok()
    }

    #[test]
    fn the_alternative_name_is_a_second_acceptable_name() {
        let provider = ztunnel_certs::tls::provider;
        let (root, chain) = root_and_server(&["istiod.istio-system.svc"]);
        let roots = || RootSource::Pem(root.clone()).load().unwrap();

        let plain = WebPkiServerVerifier::builder_with_provider(Arc::new(roots()), provider())
            .build()
            .unwrap();
        assert!(verify(plain.as_ref(), &chain, "istiod.istio-system.svc"));
        assert!(!verify(plain.as_ref(), &chain, "xds.example"));

        let alt = AltNameVerifier::new(roots(), "istiod.istio-system.svc", provider()).unwrap();
        assert!(verify(&alt, &chain, "xds.example"));
        assert!(verify(&alt, &chain, "istiod.istio-system.svc"));
        let wrong_alt = AltNameVerifier::new(roots(), "other.example", provider()).unwrap();
        assert!(!verify(&wrong_alt, &chain, "xds.example"));

        // A chain from another root fails whatever the name.
        let (_, foreign) = root_and_server(&["istiod.istio-system.svc"]);
        assert!(!verify(&alt, &foreign, "istiod.istio-system.svc"));

        let config = client_tls_config(roots(), Some("istiod.istio-system.svc")).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec()]);
        assert!(matches!(
            client_tls_config(roots(), Some("not a name!")),
            Err(ControlPlaneError::InvalidServerName(_))
        ));
    }

    #[test]
    fn roots_come_from_a_file_or_inline_pem_and_garbage_is_refused() {
        let (root, _) = root_and_server(&["a.example"]);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("root.pem");
        std::fs::write(&file, &root).unwrap();
        assert_eq!(RootSource::File(file).load().unwrap().len(), 1);
        assert_eq!(RootSource::Pem(root).load().unwrap().len(), 1);

        let missing = RootSource::File(dir.path().join("missing.pem")).load();
        assert!(matches!(missing, Err(ControlPlaneError::RootRead { .. })));
        let garbage = RootSource::Pem("not a certificate".to_owned()).load();
        assert!(matches!(
            garbage,
            Err(ControlPlaneError::RootInvalid { .. })
        ));
    }
}
