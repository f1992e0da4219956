//! The names in the CA's own serving certificate, the ones node agents may
//! dial it by. Issuing the certificate is `ca::server`'s business.

use std::net::IpAddr;

/// The flags, flattened into `serve`'s command line.
#[derive(Debug, clap::Args)]
pub(crate) struct ServingCertArgs {
    /// DNS name in the CA's serving certificate. Repeatable.
    #[arg(long = "serving-dns-name", default_values = ["localhost", "istiod.istio-system.svc"])]
    pub(crate) serving_dns_names: Vec<String>,
    /// IP address in the CA's serving certificate. Repeatable.
    #[arg(long = "serving-ip", default_value = "127.0.0.1")]
    pub(crate) serving_ips: Vec<IpAddr>,
}
