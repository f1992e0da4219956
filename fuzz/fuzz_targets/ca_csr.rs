//! Fuzzes the CA's CSR validation with arbitrary PEM text and arbitrary DER.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ztunnel_certs::issuer::SigningRequest;

fuzz_target!(|data: &[u8]| {
    let _ = SigningRequest::from_der(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = SigningRequest::from_pem(text);
    }
});
