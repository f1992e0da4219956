//! Differential fuzzing of our TLS record layer against rustls's own
//! record reader: the same records, sealed with the key of one replayed
//! session (`fuzz/src/record.rs`), read by our client (aws-lc-rs opening
//! them) and by a stock rustls `ClientConnection` (ring opening them).
//! Input: `[chunk]` then the records as `record::seal` reads them; our
//! transport's reads return at most `chunk` bytes (0: any number).

#![no_main]

use libfuzzer_sys::fuzz_target;
use ztunnel_fuzz::record::{End, read_ours, read_stock, seal};

fuzz_target!(|data: &[u8]| {
    let [chunk, rest @ ..] = data else {
        return;
    };
    let sealed = seal(rest);
    let ours = read_ours(&sealed.bytes, usize::from(*chunk));
    let stock = read_stock(&sealed.bytes, &sealed.ends);
    let failed = |end: &End| matches!(end, End::Failed(_));
    // Where we differ on purpose, we refuse what rustls takes or has not
    // seen whole yet: we stop, rustls may read on.
    let refused_on_purpose = match &ours.end {
        End::Failed(error) => {
            (sealed.ends_in_refusable_header && stock.end == End::Eof)
                || (sealed.empty_handshake_record && error.contains("empty record"))
        }
        _ => false,
    };
    if refused_on_purpose {
        assert!(stock.plaintext.starts_with(&ours.plaintext));
        return;
    }
    assert_eq!(
        ours.plaintext, stock.plaintext,
        "the same plaintext; ours ended {:?}, stock {:?}",
        ours.end, stock.end
    );
    assert_eq!(
        failed(&ours.end),
        failed(&stock.end),
        "both refuse or both accept: ours {:?}, stock {:?}",
        ours.end,
        stock.end
    );
    if !failed(&ours.end) {
        assert_eq!(ours.end, stock.end);
    }
});
