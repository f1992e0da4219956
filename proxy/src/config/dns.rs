//! The DNS proxy's settings (AMBIENT.md §5.1, §5.5), under istio/ztunnel's
//! names where it has them. What the proxy does with them is
//! `proxy/src/dns`'s business.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::ArgAction;

use super::{ConfigError, ValueError};
use crate::ports::DNS_PORT;

/// Where the DNS proxy's upstream resolvers come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DnsUpstream {
    /// The nameservers of this resolv.conf (port 53), read at start-up.
    ResolvConf(PathBuf),
    /// These servers, in order.
    Servers(Vec<SocketAddr>),
}

/// Where the DNS proxy listens in each pod (or, in dedicated mode, in
/// ztunnel's own namespace): istio/ztunnel's `DNS_PROXY_ADDR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsAddress {
    /// This port on 127.0.0.1, and on ::1 when IPv6 is on and the loopback
    /// has it (`localhost:<port>`, the default `localhost:15053`).
    Localhost(u16),
    /// This one address (`ip:port`).
    Socket(SocketAddr),
}

impl DnsAddress {
    /// Reads `localhost:<port>` (any case) or `ip:port` (`[ip]:port` for
    /// IPv6), as istio/ztunnel reads `DNS_PROXY_ADDR`.
    fn parse(text: &str) -> Result<DnsAddress, ConfigError> {
        let invalid = || ConfigError::Value {
            name: "DNS_PROXY_ADDR",
            source: ValueError::Range(text.to_owned(), "localhost:<port> or ip:port"),
        };
        let text = text.trim();
        if let Some((host, port)) = text.rsplit_once(':')
            && host.eq_ignore_ascii_case("localhost")
        {
            return port
                .parse()
                .map(DnsAddress::Localhost)
                .map_err(|_| invalid());
        }
        text.parse().map(DnsAddress::Socket).map_err(|_| invalid())
    }

    /// Its port.
    pub fn port(self) -> u16 {
        match self {
            DnsAddress::Localhost(port) => port,
            DnsAddress::Socket(address) => address.port(),
        }
    }
}

impl std::fmt::Display for DnsAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DnsAddress::Localhost(port) => write!(f, "localhost:{port}"),
            DnsAddress::Socket(address) => address.fmt(f),
        }
    }
}

/// The DNS proxy's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsSettings {
    /// Whether the proxy listens on [`DnsSettings::address`] in each pod.
    pub enabled: bool,
    /// Where it listens: istio-cni's rules redirect to 127.0.0.1:15053, so
    /// only a test or a custom capture has reason to change it.
    pub address: DnsAddress,
    /// The suffix of Kubernetes service names, for the search list.
    pub cluster_domain: Arc<str>,
    /// Which namespace's service a hostname resolves to when several
    /// namespaces have one and neither the client's nor a canonical one does.
    pub preferred_namespace: Option<Arc<str>>,
    /// Where queries the proxy does not answer go.
    pub upstream: DnsUpstream,
}

/// The flags and variables, flattened into the command line.
#[derive(Debug, clap::Args)]
pub(super) struct DnsArgs {
    /// The DNS proxy, on unless this is set to anything but `true`
    /// (case-insensitive), as Istio reads its proxy metadata.
    #[arg(long, env = "ISTIO_META_DNS_CAPTURE")]
    dns_capture: Option<String>,
    /// The DNS proxy's port on the pod's loopback addresses.
    #[arg(long, env = "DNS_PROXY_PORT", default_value_t = DNS_PORT)]
    dns_proxy_port: u16,
    /// Where the DNS proxy listens, `localhost:<port>` or `ip:port`, as
    /// istio/ztunnel reads it; when set it replaces `DNS_PROXY_PORT`.
    #[arg(long, env = "DNS_PROXY_ADDR")]
    dns_proxy_addr: Option<String>,
    /// The cluster's DNS domain, the suffix of service names.
    #[arg(long, env = "CLUSTER_DOMAIN", default_value = "cluster.local")]
    cluster_domain: String,
    /// The namespace whose service wins when several namespaces have a
    /// service of one hostname and neither the client's namespace nor a
    /// canonical service decides (Istio's spelling).
    #[arg(long, env = "PREFERED_SERVICE_NAMESPACE")]
    prefered_service_namespace: Option<String>,
    /// The resolver configuration whose nameservers receive the queries
    /// the DNS proxy does not answer.
    #[arg(long, env = "DNS_RESOLV_CONF", default_value = crate::resolve::RESOLV_CONF)]
    dns_resolv_conf: PathBuf,
    /// Upstream nameservers (`ip:port`, comma-separated) that replace those
    /// of the resolver configuration.
    #[arg(long, env = "DNS_UPSTREAMS", value_delimiter = ',', action = ArgAction::Append)]
    dns_upstreams: Vec<String>,
}

impl DnsArgs {
    /// The settings; Istio's proxy `metadata` (the `ISTIO_META_*`
    /// variables over `PROXY_CONFIG`'s and the mesh config's
    /// `proxyMetadata`) says whether the proxy is on (`DNS_CAPTURE`) and
    /// where it listens (`DNS_PROXY_ADDR`, over the variable of that name
    /// and `DNS_PROXY_PORT`).
    pub(super) fn parse(
        self,
        metadata: &BTreeMap<String, String>,
    ) -> Result<DnsSettings, ConfigError> {
        let enabled = self
            .dns_capture
            .as_deref()
            .or(metadata.get("DNS_CAPTURE").map(String::as_str))
            .is_none_or(|value| value.eq_ignore_ascii_case("true"));
        let upstream = if self.dns_upstreams.is_empty() {
            DnsUpstream::ResolvConf(self.dns_resolv_conf)
        } else {
            let servers = self
                .dns_upstreams
                .iter()
                .map(|text| {
                    text.trim().parse().map_err(|_| ConfigError::Value {
                        name: "DNS_UPSTREAMS",
                        source: ValueError::Range(text.clone(), "ip:port"),
                    })
                })
                .collect::<Result<_, _>>()?;
            DnsUpstream::Servers(servers)
        };
        let address = match metadata
            .get("DNS_PROXY_ADDR")
            .map(String::as_str)
            .or(self.dns_proxy_addr.as_deref())
        {
            Some(text) if !text.trim().is_empty() => DnsAddress::parse(text)?,
            _ => DnsAddress::Localhost(self.dns_proxy_port),
        };
        let cluster_domain = self.cluster_domain.trim_matches('.').to_ascii_lowercase();
        Ok(DnsSettings {
            enabled,
            address,
            cluster_domain: cluster_domain.into(),
            preferred_namespace: self
                .prefered_service_namespace
                .filter(|namespace| !namespace.is_empty())
                .map(Arc::from),
            upstream,
        })
    }
}
