//! Opening the HBONE streams a route asks for: one CONNECT on a pooled
//! connection (to the destination's ztunnel or a waypoint), or, through a
//! network gateway, a CONNECT on a pooled connection to the gateway with
//! a session of its own inside it (`hbone/double.rs`). Which route to take
//! is `outbound/route.rs`'s decision; the copy that follows is `outbound.rs`'s.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::identity::Identity;

use super::OutboundError;
use super::route::{DoubleHboneRoute, HboneRoute};
use crate::context::{CONNECT_TIMEOUT, Proxy};
use crate::hbone::{
    self, Authority, HboneError, WorkloadLabels, X_FORWARDED_NETWORK, connect_headers,
};
use crate::metrics::Reporter;
use crate::pool::{Checkout, PoolKey};
use crate::state::Workload;

/// Opens a CONNECT stream to `route` on a pooled HBONE connection.
pub(super) async fn tunnel(
    proxy: &Proxy,
    source: Option<&Workload>,
    client: SocketAddr,
    route: &HboneRoute,
) -> Result<hbone::H2Stream, OutboundError> {
    let source = source.ok_or(OutboundError::UnknownSource)?;
    let certificate = certificate(proxy, source).await?;
    let service = route.service.as_deref().map(|service| &*service.hostname);
    let headers = headers(source, client, service)?;
    let checkout = checkout(
        proxy,
        source,
        client,
        &certificate,
        route.dial,
        &route.expected,
    )
    .await?;
    let authority = Authority::Address(route.authority);
    checkout
        .send_connect(&authority, headers)
        .await
        .map_err(|error| OutboundError::Tunnel(Arc::new(error)))
}

/// Opens the double tunnel of `route`: a CONNECT stream to the network
/// gateway on a pooled connection, and inside it a session of its own to
/// the service, with the same certificate, whose CONNECT tells the far
/// side the network it came from.
pub(super) async fn double_tunnel(
    proxy: &Proxy,
    source: Option<&Workload>,
    client: SocketAddr,
    route: &DoubleHboneRoute,
) -> Result<hbone::H2Stream, OutboundError> {
    let source = source.ok_or(OutboundError::UnknownSource)?;
    let certificate = certificate(proxy, source).await?;
    let tunnel = |error| OutboundError::Tunnel(Arc::new(error));
    // Built first: an empty list (a service without SANs) fails here, as
    // nothing could prove who ends the inner session, and the gateway is
    // not bothered with a tunnel that could not be used.
    let inner_tls = ztunnel_certs::tls::client_config(&certificate, route.expected.clone())
        .map_err(|error| tunnel(HboneError::TlsConfig(error)))?;
    let headers = headers(source, client, Some(&route.service.hostname))?;
    let mut inner_headers = headers.clone();
    let network =
        HeaderValue::from_str(&proxy.node.config.network).map_err(hbone::HeaderError::from)?;
    inner_headers.insert(X_FORWARDED_NETWORK, network);
    let checkout = checkout(
        proxy,
        source,
        client,
        &certificate,
        route.dial,
        &route.gateway_expected,
    )
    .await?;
    let outer = checkout
        .send_connect(&route.authority, headers)
        .await
        .map_err(tunnel)?;
    let watch = proxy.revocation_watch(Reporter::Source, certificate.roots());
    let inner = hbone::connect_inner(
        outer,
        Arc::new(inner_tls),
        &proxy.node.h2,
        &route.authority,
        inner_headers,
        watch,
    );
    tokio::time::timeout(CONNECT_TIMEOUT, inner)
        .await
        .unwrap_or_else(|_elapsed| Err(HboneError::Connect(io::ErrorKind::TimedOut.into())))
        .map_err(tunnel)
}

/// The source workload's certificate.
async fn certificate(
    proxy: &Proxy,
    source: &Workload,
) -> Result<Arc<WorkloadCertificate>, OutboundError> {
    proxy
        .node
        .identities
        .fetch_certificate(&source.identity)
        .await
        .map_err(OutboundError::Certificate)
}

/// The CONNECT headers of a connection from `source`'s client at `client`.
fn headers(
    source: &Workload,
    client: SocketAddr,
    service: Option<&str>,
) -> Result<HeaderMap, OutboundError> {
    let labels = WorkloadLabels {
        cluster_id: &source.group.cluster_id,
        namespace: &source.namespace,
        workload_type: source.group.workload_type.as_str(),
        workload_name: &source.group.workload_name,
        canonical_name: &source.group.canonical_name,
        canonical_revision: &source.group.canonical_revision,
        region: &source.group.locality.region,
        zone: &source.group.locality.zone,
    };
    Ok(connect_headers(&labels, client, service)?)
}

/// A stream slot on a pooled HBONE connection from `source` to `dial`,
/// whose server presents one of `expected`.
async fn checkout(
    proxy: &Proxy,
    source: &Workload,
    client: SocketAddr,
    certificate: &WorkloadCertificate,
    dial: SocketAddr,
    expected: &[Identity],
) -> Result<Checkout, OutboundError> {
    let source_ip = source.addresses.first().copied().unwrap_or(client.ip());
    let key = PoolKey::new(source.identity.clone(), expected.to_vec(), dial, source_ip);
    // Only a new pooled connection needs a TLS configuration; most
    // connections reuse one and skip building it. The whole dial (TCP, TLS
    // and HTTP/2 handshakes) is bounded; a caller waiting for another's
    // dial waits at most as long.
    let dial = || async {
        let tls = ztunnel_certs::tls::client_config(certificate, expected.to_vec())?;
        let connect = async {
            let tcp = super::dial(proxy, dial)
                .await
                .map_err(HboneError::Connect)?;
            let watch = proxy.revocation_watch(Reporter::Source, certificate.roots());
            hbone::connect(tcp, Arc::new(tls), &proxy.node.h2, watch).await
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .unwrap_or_else(|_elapsed| Err(HboneError::Connect(io::ErrorKind::TimedOut.into())))
    };
    Ok(proxy.pool.checkout(&key, dial).await?)
}

#[cfg(test)]
mod tests;
