use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use ztunnel_certs::identity::Identity;
use ztunnel_certs::tls::{client_config, dummy_server_name, server_config};
use ztunnel_test_support::ca::certificates_from_one_root;

use super::*;

/// A TLS record's header: type, version, length.
const RECORD_HEADER: usize = 5;
/// What sealing adds to a TLS 1.3 record's plaintext: the content type and
/// the 16-byte AES-GCM tag.
const SEALING: usize = 17;
/// Pipe capacity: larger than anything one case writes, so no write waits.
const PIPE: usize = 1 << 20;

#[test]
fn a_payload_from_four_kib_is_split_from_what_comes_before_it() {
    let cases: &[(usize, &[usize], bool)] = &[
        (9, &[16_384], true),
        (9, &[4096], true),
        (9, &[4095], false),
        (9, &[2048, 2048], true),
        (20_000, &[8192], true),
        // Nothing before the payload: nothing to split off.
        (0, &[16_384], false),
        // A lone buffer: its records lie inside it already.
        (16_393, &[], false),
    ];
    for &(head_len, rest_lens, expected) in cases {
        let head = vec![0; head_len];
        let rest: Vec<Vec<u8>> = rest_lens.iter().map(|&len| vec![0; len]).collect();
        let rest: Vec<IoSlice<'_>> = rest.iter().map(|buf| IoSlice::new(buf)).collect();
        assert_eq!(
            split_before(&head, &rest),
            expected,
            "{head_len} bytes, then buffers of {rest_lens:?}"
        );
    }
}

/// Copies `from` to `to`, noting the plaintext length of every TLS record
/// that passes (its length on the wire less the sealing) before it passes.
async fn tap(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    records: Arc<Mutex<Vec<usize>>>,
) {
    let mut pending = Vec::new();
    let mut chunk = vec![0; 64 * 1024];
    loop {
        let read = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        pending.extend_from_slice(&chunk[..read]);
        while let Some(header) = pending.get(..RECORD_HEADER) {
            let length = usize::from(u16::from_be_bytes([header[3], header[4]]));
            if pending.len() < RECORD_HEADER + length {
                break;
            }
            records.lock().unwrap().push(length.saturating_sub(SEALING));
            pending.drain(..RECORD_HEADER + length);
        }
        if to.write_all(&chunk[..read]).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn each_payload_record_lies_inside_the_payload_and_every_byte_arrives_in_order() {
    let client_id: Identity = "spiffe://cluster.local/ns/default/sa/client"
        .parse()
        .unwrap();
    let server_id: Identity = "spiffe://cluster.local/ns/default/sa/server"
        .parse()
        .unwrap();
    let certs = certificates_from_one_root(&[client_id, server_id.clone()]).unwrap();
    let connector =
        TlsConnector::from(Arc::new(client_config(&certs[0], vec![server_id]).unwrap()));
    let acceptor = TlsAcceptor::from(Arc::new(server_config(&certs[1]).unwrap()));

    // client ⇄ tap ⇄ server; the tap notes the client's records.
    let (client_io, tap_client) = tokio::io::duplex(PIPE);
    let (tap_server, server_io) = tokio::io::duplex(PIPE);
    let (from_client, to_client) = tokio::io::split(tap_client);
    let (from_server, to_server) = tokio::io::split(tap_server);
    let records = Arc::new(Mutex::new(Vec::new()));
    let to_server_side = tokio::spawn(tap(from_client, to_server, Arc::clone(&records)));
    let to_client_side = tokio::spawn(tap(from_server, to_client, Arc::default()));

    let (client, server) = tokio::join!(
        connector.connect(dummy_server_name(), client_io),
        acceptor.accept(server_io)
    );
    let mut client = RecordAligned::new(client.unwrap());
    let mut server = server.unwrap();

    // (frame header and what h2 queued before it, payload, the records
    // the client sends, by plaintext length)
    let cases: &[(usize, usize, &[usize])] = &[
        // Alone, the header's record would take the payload's first
        // 16,375 bytes and span both buffers.
        (9, 40_000, &[9, 16_384, 16_384, 7232]),
        (9, 16_384, &[9, 16_384]),
        (9, 100, &[109]),
        (20_000, 16_384, &[16_384, 3616, 16_384]),
        (1, 4096, &[1, 4096]),
        (9, 4095, &[4104]),
    ];
    let mut sent_before = 0u8;
    for &(head_len, payload_len, expected) in cases {
        // Counting bytes, so that a byte out of place shows.
        let bytes: Vec<u8> = (0..head_len + payload_len)
            .map(|index| sent_before.wrapping_add(index as u8))
            .collect();
        sent_before = sent_before.wrapping_add(bytes.len() as u8);
        let (head, payload) = bytes.split_at(head_len);
        let noted = records.lock().unwrap().len();

        let written = client
            .write_vectored(&[IoSlice::new(head), IoSlice::new(payload)])
            .await
            .unwrap();
        assert_eq!(written, bytes.len(), "an unlimited session takes it all");
        client.flush().await.unwrap();
        let mut received = vec![0; bytes.len()];
        server.read_exact(&mut received).await.unwrap();

        assert!(received == bytes, "{head_len} + {payload_len} bytes intact");
        assert_eq!(
            records.lock().unwrap()[noted..],
            *expected,
            "records of {head_len} + {payload_len} bytes"
        );
    }

    drop((client, server));
    to_server_side.await.unwrap();
    to_client_side.await.unwrap();
}
