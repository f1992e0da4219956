//! Fuzzes the `CRL_PATH` file's parser: any bytes either parse into
//! revocation lists or fail with a typed error, never a panic. A PEM file
//! that parses holds no more lists than it has lines opening an `X509 CRL`
//! block (other blocks are skipped; the PEM reader takes a begin line whose
//! five closing dashes have spaces among them); DER is exactly one list.

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
        let opening = b"-----BEGIN X509 CRL";
        let blocks = data
            .windows(opening.len())
            .filter(|window| window == opening)
            .count();
        assert!(lists.len() <= blocks, "{} lists from {blocks} blocks", lists.len());
    } else {
        assert_eq!(lists.len(), 1);
    }
});
