//! Fuzzes SPIFFE identity parsing: any string either fails with a typed error
//! or parses into parts that rebuild the same identity.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ztunnel_certs::identity::Identity;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(identity) = text.parse::<Identity>() {
        assert_eq!(identity.as_str(), text);
        let rebuilt = Identity::new(
            identity.trust_domain(),
            identity.namespace(),
            identity.service_account(),
        );
        assert_eq!(rebuilt.as_ref(), Ok(&identity));
    }
});
