//! Compression of the answers Prometheus scrapes: a scraper that sends
//! `Accept-Encoding: gzip` (Prometheus does) gets the metrics gzipped, a
//! tenth of their size on the wire. Which answers are compressed is the
//! caller's (`admin.rs`); here is only what the header allows and the
//! compression itself.

use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;

/// Whether an `Accept-Encoding` header (`None`: absent) accepts gzip: named
/// (or `*`) with a quality above zero (RFC 9110 §12.5.3). A header that
/// names gzip with `q=0` refuses it even where `*` would accept it.
pub(super) fn accepts_gzip(header: Option<&str>) -> bool {
    let Some(header) = header else {
        return false;
    };
    let mut star = false;
    for item in header.split(',') {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or_default().trim();
        let quality = parts
            .filter_map(|parameter| parameter.trim().strip_prefix("q="))
            .find_map(|value| value.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
            return quality > 0.0;
        }
        if coding == "*" {
            star = quality > 0.0;
        }
    }
    star
}

/// `body` gzipped at the default level: fast enough per scrape, and the
/// text of metrics compresses about tenfold at it.
pub(super) fn gzip(body: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(body.len() / 8), Compression::default());
    encoder.write_all(body)?;
    encoder.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_is_sent_only_where_the_header_accepts_it() {
        let rows: &[(Option<&str>, bool, &str)] = &[
            (None, false, "no header: identity"),
            (Some("gzip"), true, "gzip"),
            (Some("identity"), false, "identity only"),
            (
                Some("gzip, deflate, br"),
                true,
                "what Prometheus and browsers send",
            ),
            (
                Some("deflate, GZIP;q=0.5"),
                true,
                "any case, a quality above zero",
            ),
            (Some("gzip;q=0"), false, "refused by quality zero"),
            (
                Some("gzip; q=0.0, *"),
                false,
                "gzip's own zero beats the star",
            ),
            (Some("*"), true, "anything"),
            (Some("*;q=0"), false, "nothing"),
            (Some("x-gzip"), true, "the old name"),
            (
                Some("gzip;q=junk"),
                true,
                "a quality that does not parse is 1",
            ),
            (Some(""), false, "empty"),
        ];
        for (header, expected, reason) in rows {
            assert_eq!(accepts_gzip(*header), *expected, "{reason}: {header:?}");
        }
    }

    #[test]
    fn gzip_reads_back_with_a_decoder_that_is_not_ours() {
        let body = "ztunnel_connections_carried 3\n".repeat(100);
        let compressed = gzip(body.as_bytes()).unwrap();
        assert!(compressed.len() < body.len() / 10, "{}", compressed.len());
        let mut gunzip = std::process::Command::new("gzip")
            .args(["-d", "-c"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        gunzip.stdin.take().unwrap().write_all(&compressed).unwrap();
        let output = gunzip.wait_with_output().unwrap();
        assert_eq!(String::from_utf8(output.stdout).unwrap(), body);
    }
}
