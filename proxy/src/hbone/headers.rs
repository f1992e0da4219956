//! The request headers an HBONE CONNECT carries (WIRE.md §4): `baggage`
//! with the source workload's labels (written and read by `baggage.rs`),
//! `forwarded` with the client address, and a fresh W3C `traceparent`.
//!
//! The builders take plain data; filling it from the workload state is the
//! caller's job.

use std::fmt::Write as _;
use std::net::SocketAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue, InvalidHeaderValue};

use super::baggage::{WorkloadLabels, baggage};

/// `baggage` request header name.
pub const BAGGAGE: HeaderName = HeaderName::from_static("baggage");
/// `forwarded` request header name (RFC 7239).
pub const FORWARDED: HeaderName = HeaderName::from_static("forwarded");
/// `traceparent` request header name (W3C Trace Context).
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// `x-forwarded-network` request header name: the sender's network, on the
/// inner CONNECT of double HBONE only (WIRE.md §4, AMBIENT.md §3.4, §3.5).
pub const X_FORWARDED_NETWORK: HeaderName = HeaderName::from_static("x-forwarded-network");

/// A header value could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    /// A label or hostname holds bytes a header may not carry (control
    /// characters, non-visible ASCII).
    #[error("header value holds bytes a header may not carry")]
    InvalidValue(#[from] InvalidHeaderValue),
}

/// The three headers every outgoing CONNECT carries.
pub fn connect_headers(
    labels: &WorkloadLabels<'_>,
    client: SocketAddr,
    service_hostname: Option<&str>,
) -> Result<HeaderMap, HeaderError> {
    let mut headers = HeaderMap::with_capacity(3);
    headers.insert(BAGGAGE, baggage(labels)?);
    headers.insert(FORWARDED, forwarded(client, service_hostname)?);
    headers.insert(TRACEPARENT, traceparent());
    Ok(headers)
}

/// `forwarded`: `for="<ip:port>"` (IPv6 in brackets), then
/// `;host=<hostname>` when a Service is the intended target.
pub fn forwarded(
    client: SocketAddr,
    service_hostname: Option<&str>,
) -> Result<HeaderValue, HeaderError> {
    let mut value = String::with_capacity(64);
    // `SocketAddr`'s Display already brackets IPv6; writing to a String
    // cannot fail.
    let _ = write!(value, "for=\"{client}\"");
    if let Some(host) = service_hostname {
        value.push_str(";host=");
        value.push_str(host);
    }
    Ok(HeaderValue::try_from(value)?)
}

/// The `host=` of a `forwarded` value: the Service the client meant, as
/// [`forwarded`] writes it (quotes taken off); `None` when absent or empty.
/// Only the first element (before any `,`) is read, the one the client's
/// own ztunnel wrote.
pub fn forwarded_host(value: &str) -> Option<&str> {
    let first = value.split(',').next().unwrap_or_default();
    first
        .split(';')
        .find_map(|pair| pair.trim().strip_prefix("host="))
        .map(|host| host.trim_matches('"'))
        .filter(|host| !host.is_empty())
}

/// A fresh `traceparent`: version 00, a random trace id and parent id, flags
/// 00 (not sampled).
pub fn traceparent() -> HeaderValue {
    traceparent_from(rand::random(), rand::random())
}

/// `traceparent` for the given ids; split out so that the format is testable.
fn traceparent_from(trace_id: u128, parent_id: u64) -> HeaderValue {
    let mut value = String::with_capacity(55);
    let _ = write!(value, "00-{trace_id:032x}-{parent_id:016x}-00");
    // Only hex digits and dashes: always a valid header value.
    HeaderValue::try_from(value).unwrap_or(HeaderValue::from_static(
        "00-00000000000000000000000000000000-0000000000000000-00",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hbone::baggage::tests::FULL;

    #[test]
    fn forwarded_quotes_the_client_and_brackets_ipv6() {
        let cases = [
            ("10.0.0.1:45000", None, "for=\"10.0.0.1:45000\""),
            ("[::1]:80", None, "for=\"[::1]:80\""),
            (
                "[fd00::5]:8080",
                Some("reviews.default.svc.cluster.local"),
                "for=\"[fd00::5]:8080\";host=reviews.default.svc.cluster.local",
            ),
            (
                "10.0.0.1:1",
                Some("a.b.svc"),
                "for=\"10.0.0.1:1\";host=a.b.svc",
            ),
        ];
        for (client, host, expected) in cases {
            let client: SocketAddr = client.parse().unwrap();
            assert_eq!(forwarded(client, host).unwrap(), expected);
        }
    }

    #[test]
    fn labels_with_control_characters_are_refused() {
        let labels = WorkloadLabels {
            namespace: "bad\nname",
            ..FULL
        };
        assert!(baggage(&labels).is_err());
        let client: SocketAddr = "10.0.0.1:1".parse().unwrap();
        assert!(forwarded(client, Some("evil\r\nx: y")).is_err());
    }

    #[test]
    fn traceparent_has_the_w3c_shape() {
        assert_eq!(
            traceparent_from(0xabc, 0x12),
            "00-00000000000000000000000000000abc-0000000000000012-00"
        );
        let value = traceparent();
        let text = value.to_str().unwrap();
        let parts: Vec<&str> = text.split('-').collect();
        assert_eq!(parts.len(), 4);
        assert_eq!((parts[0], parts[3]), ("00", "00"));
        assert_eq!(parts[1].len(), 32);
        assert_eq!(parts[2].len(), 16);
        assert!(text.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()));
        assert_ne!(traceparent(), value, "ids are random for each connection");
    }

    #[test]
    fn connect_headers_carry_all_three() {
        let client: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let headers = connect_headers(&FULL, client, None).unwrap();
        assert!(headers.contains_key(BAGGAGE));
        assert_eq!(headers[FORWARDED], "for=\"10.0.0.1:1\"");
        assert!(headers.contains_key(TRACEPARENT));
    }

    #[test]
    fn the_forwarded_host_is_the_service_the_client_named() {
        let rows: &[(&str, Option<&str>)] = &[
            (
                "for=\"10.0.0.1:5000\";host=echo.default.svc.cluster.local",
                Some("echo.default.svc.cluster.local"),
            ),
            ("for=\"10.0.0.1:5000\"", None),
            (
                "host=\"quoted.example\";for=\"[::1]:1\"",
                Some("quoted.example"),
            ),
            ("for=a;host=", None),
            ("for=a, for=b;host=second.example", None),
            ("for=a; host=spaced.example ", Some("spaced.example")),
            ("", None),
        ];
        for (value, expected) in rows {
            assert_eq!(forwarded_host(value), *expected, "{value}");
        }
        let written = forwarded("10.0.0.1:5000".parse().unwrap(), Some("svc.ns.svc")).unwrap();
        assert_eq!(
            forwarded_host(written.to_str().unwrap()),
            Some("svc.ns.svc")
        );
    }
}
