//! Double HBONE (AMBIENT.md §3.4, WIRE.md §4): a second HBONE session
//! inside a CONNECT stream to another network's gateway. The gateway ends
//! the outer TLS and passes the inner bytes on, opaque, to an endpoint's
//! ztunnel (or waypoint), where the inner TLS ends.
//!
//! The outer stream comes from the pool like any tunnel's (`pool.rs`); the
//! inner session is made here, for one connection, and never pooled: its
//! TLS and h2 state live in the stream this returns and end with it.

use std::sync::Arc;

use http::HeaderMap;
use rustls::ClientConfig;

use crate::hbone::client::{HboneError, connect};
use crate::hbone::stream::H2Stream;
use crate::hbone::{Authority, Baggage, H2Settings};
use crate::revocation::RevocationWatch;

/// Runs TLS with `tls` (the source's certificate, expecting the service's
/// identities) and the h2 handshake over `outer`, then sends the inner
/// CONNECT to `authority` with `headers`, which carry
/// `x-forwarded-network`. The inner connection's driver runs until the
/// returned stream and the outer stream under it are done, or until a
/// revocation list revokes the destination (with `watch`). The far
/// side's `baggage` comes with the stream: the workload the tunnel ended
/// at, as it describes itself.
///
/// Not bounded in time by itself: the caller wraps it in its connect timeout.
pub async fn connect_inner(
    outer: H2Stream,
    tls: Arc<ClientConfig>,
    settings: &H2Settings,
    authority: &Authority,
    headers: HeaderMap,
    watch: Option<RevocationWatch>,
) -> Result<(H2Stream, Baggage), HboneError> {
    let inner = connect(outer, tls, settings, watch).await?;
    inner.send_connect_reading_baggage(authority, headers).await
}
