//! Resolving the hostname of an endpoint that has no IP (AMBIENT.md §4.6):
//! istiod sends a DNS-resolution ServiceEntry's hosts as workloads with a
//! `hostname` only, and each connection to one asks DNS for its addresses.
//!
//! One [`Resolver`] per process, with the nameservers and options of
//! ztunnel's own resolv.conf, read once at start-up, and a TTL cache of
//! [`CACHE_SIZE`] answers. Its sockets are made by the runtime's threads,
//! which are always in ztunnel's own network namespace, never a pod's.
//! Which of the answered addresses a connection takes is
//! `outbound/route.rs`'s decision; counting the lookups is the caller's.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
    ResolverOpts,
};
use hickory_resolver::net::NetError;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::system_conf::parse_resolv_conf;
use ztunnel_certs::error_chain::ErrorChain;

/// Where the system's resolver configuration is.
pub const RESOLV_CONF: &str = "/etc/resolv.conf";

/// Answers the cache keeps (one per name and record type), as
/// istio/ztunnel sets it for these lookups: only the hosts of
/// DNS-resolution ServiceEntries are looked up here, never a pod's
/// arbitrary names, so half of hickory's default is ample.
pub const CACHE_SIZE: u64 = 4096;

/// Why a hostname gave no address to dial, or why the resolver could not
/// be set up.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The resolver configuration file could not be read.
    #[error("reading the resolver configuration {}", .path.display())]
    ReadConfig {
        /// The file.
        path: Arc<Path>,
        /// Why.
        source: io::Error,
    },
    /// The resolver configuration file was read but is not usable (no
    /// nameserver, say).
    #[error("parsing the resolver configuration {}", .path.display())]
    ParseConfig {
        /// The file.
        path: Arc<Path>,
        /// Why.
        source: NetError,
    },
    /// hickory refused the configuration it was given.
    #[error("building the DNS resolver")]
    Build(#[source] NetError),
    /// The resolver has no configuration, because reading it failed at
    /// start-up (the reason was logged then): no hostname resolves.
    #[error("no DNS resolver: {} could not be used at start-up", .0.display())]
    Unconfigured(Arc<Path>),
    /// The lookup failed: no such name, no record, no answer in time.
    #[error("resolving {hostname}")]
    Lookup {
        /// The name looked up.
        hostname: Arc<str>,
        /// What the resolver said.
        source: NetError,
    },
    /// The answer had records but no address in it.
    #[error("{0} resolved to no address")]
    NoAddress(Arc<str>),
}

/// A DNS stub resolver with a TTL cache. Cheap to clone: clones share the
/// cache and the connections to the nameservers.
#[derive(Debug, Clone)]
pub struct Resolver {
    /// The resolver, or the configuration file that could not be used.
    lookup: Result<TokioResolver, Arc<Path>>,
}

impl Resolver {
    /// The resolver of the configuration in the resolv.conf at `path`
    /// (nameservers, search list, `ndots`, `timeout`, `attempts`,
    /// `edns0`), as the system would resolve. A file that cannot be read
    /// or used is logged once, here, and gives a resolver whose every
    /// lookup fails with [`ResolveError::Unconfigured`]: hostname
    /// endpoints are then refused, and the rest of the proxy serves.
    ///
    /// `ipv6_enabled` decides whether AAAA records are asked for besides A.
    pub fn from_resolv_conf(path: &Path, ipv6_enabled: bool) -> Resolver {
        match system_resolver(path, ipv6_enabled) {
            Ok(resolver) => Resolver {
                lookup: Ok(resolver),
            },
            Err(error) => {
                tracing::warn!(
                    error = %ErrorChain(&error),
                    "hostname endpoints will not resolve: every connection to one is refused"
                );
                Resolver {
                    lookup: Err(Arc::from(path)),
                }
            }
        }
    }

    /// A resolver that asks only `nameservers` (over UDP and TCP), with
    /// no search list and no hosts file, for a caller that knows its DNS
    /// servers rather than the system's.
    pub fn with_nameservers(
        nameservers: &[SocketAddr],
        ipv6_enabled: bool,
    ) -> Result<Resolver, ResolveError> {
        let servers = nameservers
            .iter()
            .map(|server| {
                let connections = [ConnectionConfig::udp(), ConnectionConfig::tcp()]
                    .into_iter()
                    .map(|mut connection| {
                        connection.port = server.port();
                        connection
                    })
                    .collect();
                NameServerConfig::new(server.ip(), true, connections)
            })
            .collect();
        let mut options = ResolverOpts::default();
        options.use_hosts_file = ResolveHosts::Never;
        let resolver = build(
            ResolverConfig::from_name_servers(servers),
            options,
            ipv6_enabled,
        )
        .map_err(ResolveError::Build)?;
        Ok(Resolver {
            lookup: Ok(resolver),
        })
    }

    /// The addresses `hostname` has now: from the cache while its answer's
    /// TTL lasts, else from the nameservers. A and AAAA are asked in
    /// parallel (A only with IPv6 off); the result is never empty.
    ///
    /// Cancel safe: a lookup dropped half-way leaves the cache as it was
    /// or with the answer that arrived.
    pub async fn lookup(&self, hostname: &Arc<str>) -> Result<Vec<IpAddr>, ResolveError> {
        let resolver = match &self.lookup {
            Ok(resolver) => resolver,
            Err(path) => return Err(ResolveError::Unconfigured(Arc::clone(path))),
        };
        let answer =
            resolver
                .lookup_ip(&**hostname)
                .await
                .map_err(|source| ResolveError::Lookup {
                    hostname: Arc::clone(hostname),
                    source,
                })?;
        let addresses: Vec<IpAddr> = answer.iter().collect();
        if addresses.is_empty() {
            return Err(ResolveError::NoAddress(Arc::clone(hostname)));
        }
        Ok(addresses)
    }
}

/// The resolver of the system's configuration at `path`.
fn system_resolver(path: &Path, ipv6_enabled: bool) -> Result<TokioResolver, ResolveError> {
    let shared = || Arc::<Path>::from(path);
    let text = std::fs::read(path).map_err(|source| ResolveError::ReadConfig {
        path: shared(),
        source,
    })?;
    let (config, options) =
        parse_resolv_conf(text).map_err(|source| ResolveError::ParseConfig {
            path: shared(),
            source,
        })?;
    let nameservers: Vec<IpAddr> = config
        .name_servers()
        .iter()
        .map(|server| server.ip)
        .collect();
    let resolver = build(config, options, ipv6_enabled).map_err(ResolveError::Build)?;
    tracing::info!(
        config = %path.display(),
        ?nameservers,
        ipv6_enabled,
        "hostname endpoints resolve through the system's nameservers"
    );
    Ok(resolver)
}

/// Builds a resolver from `config` and `options`, with this proxy's cache
/// size and the record types `ipv6_enabled` allows.
fn build(
    config: ResolverConfig,
    mut options: ResolverOpts,
    ipv6_enabled: bool,
) -> Result<TokioResolver, NetError> {
    options.cache_size = CACHE_SIZE;
    // Both families in parallel, not one then the other: which family a
    // connection takes is chosen afterwards, against its original
    // destination's (outbound/route.rs), so both must be known.
    options.ip_strategy = if ipv6_enabled {
        LookupIpStrategy::Ipv4AndIpv6
    } else {
        LookupIpStrategy::Ipv4Only
    };
    let mut builder = TokioResolver::builder_with_config(config, TokioRuntimeProvider::default());
    *builder.options_mut() = options;
    builder.build()
}

#[cfg(test)]
pub(crate) mod tests;
