//! Opening the HBONE streams a route asks for, one path whatever the
//! number of hops ([`Tunnel`]): one CONNECT on a pooled connection (to the
//! destination's ztunnel or a waypoint), or, through a network gateway, a
//! CONNECT on a pooled connection to the gateway with a session of its own
//! inside it (`hbone/double.rs`). Which route to take
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
use crate::hbone::{self, Authority, Baggage, HboneError, X_FORWARDED_NETWORK, connect_headers};
use crate::metrics::Reporter;
use crate::pool::{Checkout, PoolKey};
use crate::report;
use crate::state::{Service, Workload};

/// The HBONE hops of a route, as data: a CONNECT on a pooled connection
/// to `dial`, and, through another network's gateway, a session of its
/// own inside that stream to the service.
pub(super) struct Tunnel<'a> {
    /// The HBONE listener dialled: the destination's ztunnel, a waypoint,
    /// or a network gateway.
    pub dial: SocketAddr,
    /// Identities whoever answers at `dial` may present.
    pub dial_expected: &'a [Identity],
    /// The `:authority` of every CONNECT.
    pub authority: Authority,
    /// The inner session's expected identities, for a tunnel inside the
    /// tunnel; `None` for one hop.
    pub inner: Option<&'a [Identity]>,
    /// The address the connection is reported to.
    pub destination: SocketAddr,
    /// The workload reached, for reports.
    pub workload: &'a Workload,
    /// The service dialled, named in the CONNECT's headers and reports.
    pub service: Option<&'a Service>,
}

impl<'a> Tunnel<'a> {
    /// One hop: to the destination's ztunnel, or to a waypoint.
    pub fn single(route: &'a HboneRoute) -> Self {
        Tunnel {
            dial: route.dial,
            dial_expected: &route.expected,
            authority: Authority::Address(route.authority),
            inner: None,
            destination: route.authority,
            workload: &route.workload,
            service: route.service.as_deref(),
        }
    }

    /// Two hops: to another network's gateway, and through it to the
    /// service, for a connection to `target`.
    pub fn double(route: &'a DoubleHboneRoute, target: SocketAddr) -> Self {
        Tunnel {
            dial: route.dial,
            dial_expected: &route.gateway_expected,
            authority: route.authority.clone(),
            inner: Some(&route.expected),
            destination: target,
            workload: &route.workload,
            service: Some(&route.service),
        }
    }

    /// Identities the far end may present: the inner session's, else the
    /// one hop's.
    pub fn far_end_expected(&self) -> &'a [Identity] {
        self.inner.unwrap_or(self.dial_expected)
    }
}

/// Opens the tunnel's CONNECT stream on a pooled HBONE connection, and for
/// two hops the session inside it, with the same certificate, whose
/// CONNECT tells the far side the network it came from; through two hops,
/// with what the far side's answer says of the workload it serves.
pub(super) async fn open(
    proxy: &Proxy,
    source: Option<&Workload>,
    client: SocketAddr,
    tunnel: &Tunnel<'_>,
) -> Result<(hbone::H2Stream, Option<Baggage>), OutboundError> {
    let source = source.ok_or(OutboundError::UnknownSource)?;
    let certificate = certificate(proxy, source).await?;
    let failed = |error| OutboundError::Tunnel(Arc::new(error));
    // Built first: an empty list (a service without SANs) fails here, as
    // nothing could prove who ends the inner session, and the gateway is
    // not bothered with a tunnel that could not be used.
    let inner_tls = tunnel
        .inner
        .map(|expected| ztunnel_certs::tls::client_config(&certificate, expected.to_vec()))
        .transpose()
        .map_err(|error| failed(HboneError::TlsConfig(error)))?;
    let service = tunnel.service.map(|service| &*service.hostname);
    let headers = headers(source, client, service)?;
    let checkout = checkout(
        proxy,
        source,
        client,
        &certificate,
        tunnel.dial,
        tunnel.dial_expected,
    )
    .await?;
    let Some(inner_tls) = inner_tls else {
        let stream = checkout.send_connect(&tunnel.authority, headers).await;
        return stream.map(|stream| (stream, None)).map_err(failed);
    };
    let mut inner_headers = headers.clone();
    let network =
        HeaderValue::from_str(&proxy.node.config.network).map_err(hbone::HeaderError::from)?;
    inner_headers.insert(X_FORWARDED_NETWORK, network);
    let outer = checkout
        .send_connect(&tunnel.authority, headers)
        .await
        .map_err(failed)?;
    let watch = proxy.revocation_watch(Reporter::Source, certificate.roots());
    let inner = hbone::connect_inner(
        outer,
        Arc::new(inner_tls),
        &proxy.node.h2,
        &tunnel.authority,
        inner_headers,
        watch,
    );
    let (stream, described) = tokio::time::timeout(CONNECT_TIMEOUT, inner)
        .await
        .unwrap_or_else(|_elapsed| Err(HboneError::Connect(io::ErrorKind::TimedOut.into())))
        .map_err(failed)?;
    Ok((stream, Some(described)))
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
    let labels = report::baggage_labels(source);
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
