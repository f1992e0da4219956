//! Fuzzes the `CRL_PATH` file's parser: any bytes either parse into
//! revocation lists or fail with a typed error, never a panic. A PEM file
//! that parses holds no more lists than it has `X509 CRL` blocks (other
//! blocks are skipped); DER is exactly one list.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ztunnel_certs::tls::revocation::RevocationLists;

fuzz_target!(|data: &[u8]| {
    let Ok(lists) = RevocationLists::parse(data) else {
        return;
    };
    if data.is_empty() {
        assert!(lists.is_empty());
    } else if data.starts_with(b"-----BEGIN") {
        let blocks = data
            .windows(b"-----BEGIN X509 CRL-----".len())
            .filter(|window| *window == b"-----BEGIN X509 CRL-----")
            .count();
        assert!(lists.len() <= blocks, "{} lists from {blocks} blocks", lists.len());
    } else {
        assert_eq!(lists.len(), 1);
    }
});
