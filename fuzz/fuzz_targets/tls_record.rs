//! Fuzzes the receiving half of our TLS record layer
//! (`certs/src/tls/record/receive.rs`) after a real handshake, replayed
//! with fixed keys (`fuzz/src/record.rs`). Input: `[chunk][mode]` then the
//! stream: mode 0 raw bytes as they are, else records sealed with the
//! server's key from the rest (`record::seal`), so most get past the MAC.
//! The transport's reads return at most `chunk` bytes (0: any number).

#![no_main]

use libfuzzer_sys::fuzz_target;
use ztunnel_fuzz::record::{End, read_ours, seal};

fuzz_target!(|data: &[u8]| {
    let [chunk, mode, rest @ ..] = data else {
        return;
    };
    if *mode == 0 {
        // Bytes not sealed with the key never authenticate: no plaintext,
        // and no close_notify.
        let outcome = read_ours(rest, usize::from(*chunk));
        assert!(outcome.plaintext.is_empty());
        assert_ne!(outcome.end, End::Closed);
        return;
    }
    let sealed = seal(rest);
    let outcome = read_ours(&sealed.bytes, usize::from(*chunk));
    // Records are opened in order and the first fault stops the stream: what
    // the reader got is the start of what was sent as application data.
    assert!(
        sealed.application_data.starts_with(&outcome.plaintext),
        "{} bytes delivered that were not sent so",
        outcome.plaintext.len()
    );
});
