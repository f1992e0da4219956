//! The record layer against stock rustls (tokio-rustls) and against itself:
//! handshakes in both directions, data of every size intact and in order
//! under back-pressure, key updates asked for by the peer and forced by a
//! lowered limit, close_notify, session tickets, the memory an idle stream
//! holds. A raw peer that sends what no TLS stack would is `tests/raw.rs`;
//! the handshake's handover and refusals are `tests/handshake.rs`; a stock
//! peer on ring's suites is `tests/ring.rs`; transports that cut reads and
//! writes anywhere are `tests/transport.rs`. OpenSSL as a peer is the
//! integration test `certs/tests/openssl.rs`.

use std::io::{self, IoSlice};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use rustls::server::ServerSessionMemoryCache;
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{
    AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf,
};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::send::SEND_BUFFER;
use super::*;
use crate::cert::WorkloadCertificate;
use crate::csr::CertRequest;
use crate::identity::Identity;
use crate::issuer::{Issuer, SigningMaterial, SigningRequest, generate_root};
use crate::tls::{ALPN_H2, client_config, dummy_server_name, peer_identity, server_config};

mod handshake;
mod raw;
mod ring;
mod transport;

const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/client";
const SERVER: &str = "spiffe://cluster.local/ns/default/sa/server";

/// Capacity of each pipe between the two sides: a quarter of our send
/// buffer, so writers meet back-pressure.
const PIPE: usize = 64 * 1024;

/// What sealing adds to a record's content on the wire: header, content
/// type, AES-GCM tag.
const SEALING: usize = HEADER_LEN + 1 + 16;

/// A KeyUpdate record on the wire: its 5-byte message, sealed.
const KEY_UPDATE_RECORD: usize = 5 + SEALING;

/// Generous: everything here is in memory; this only stops a hung test.
const PATIENCE: Duration = Duration::from_secs(30);

type StockServer = tokio_rustls::server::TlsStream<DuplexStream>;
type StockClient = tokio_rustls::client::TlsStream<DuplexStream>;
/// Lengths on the wire of the records one side sent, handshake included.
type Wire = Arc<Mutex<Vec<usize>>>;

/// A client and a server certificate from one root of their own.
struct Pki {
    client: WorkloadCertificate,
    server: WorkloadCertificate,
}

fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let issuer = root_issuer();
        Pki {
            client: issue(&issuer, &identity(CLIENT)),
            server: issue(&issuer, &identity(SERVER)),
        }
    })
}

/// An issuer signing from a root of its own.
fn root_issuer() -> Issuer {
    let root = generate_root("cluster.local", SystemTime::now()).unwrap();
    Issuer::new(&SigningMaterial {
        root_cert_pem: root.cert_pem,
        root_key_pem: Some(root.key_pem),
        ..SigningMaterial::default()
    })
    .unwrap()
}

fn issue(issuer: &Issuer, identity: &Identity) -> WorkloadCertificate {
    let request = CertRequest::generate(identity).unwrap();
    let signing = SigningRequest::from_pem(request.csr_pem()).unwrap();
    let hour = Duration::from_secs(3600);
    let chain = issuer
        .sign_workload(&signing, identity, hour, SystemTime::now())
        .unwrap();
    WorkloadCertificate::from_ca_response(&chain, request.private_key(), Some(identity)).unwrap()
}

fn identity(uri: &str) -> Identity {
    uri.parse().unwrap()
}

fn client_tls() -> Arc<ClientConfig> {
    Arc::new(client_config(&pki().client, vec![identity(SERVER)]).unwrap())
}

fn server_tls() -> Arc<ServerConfig> {
    Arc::new(server_config(&pki().server).unwrap())
}

/// Our server config, sending `tickets` session tickets after each
/// handshake as a stock server does.
fn server_tls_with_tickets(tickets: usize) -> Arc<ServerConfig> {
    let mut config = server_config(&pki().server).unwrap();
    config.send_tls13_tickets = tickets;
    config.session_storage = ServerSessionMemoryCache::new(16);
    Arc::new(config)
}

/// A plaintext whose bytes differ from their neighbours', so that a
/// shifted or reordered byte shows; `seed` tells directions apart.
fn plaintext(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 7 + i / 251) as u8).wrapping_add(seed))
        .collect()
}

/// Copies `from` to `to`, noting each record's length on the wire before
/// it passes, and passes the end of the stream on.
async fn tap(mut from: ReadHalf<DuplexStream>, mut to: WriteHalf<DuplexStream>, wire: Wire) {
    let mut pending = Vec::new();
    let mut chunk = vec![0; 64 * 1024];
    loop {
        let read = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        pending.extend_from_slice(&chunk[..read]);
        while pending.len() >= HEADER_LEN {
            let len = HEADER_LEN + usize::from(u16::from_be_bytes([pending[3], pending[4]]));
            if pending.len() < len {
                break;
            }
            wire.lock().unwrap().push(len);
            pending.drain(..len);
        }
        if to.write_all(&chunk[..read]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Two ends of a connection with a tap between them, and what the tap
/// sees of the records sent from `ours`.
fn tapped() -> (DuplexStream, DuplexStream, Wire) {
    let (ours, tap_ours) = tokio::io::duplex(PIPE);
    let (tap_theirs, theirs) = tokio::io::duplex(PIPE);
    let (from_ours, to_ours) = tokio::io::split(tap_ours);
    let (from_theirs, to_theirs) = tokio::io::split(tap_theirs);
    let wire = Wire::default();
    tokio::spawn(tap(from_ours, to_theirs, Arc::clone(&wire)));
    tokio::spawn(tap(from_theirs, to_ours, Wire::default()));
    (ours, theirs, wire)
}

/// Our client connected to a stock server with `server`'s config.
async fn ours_to_stock(
    server: Arc<ServerConfig>,
) -> (RecordStream<DuplexStream>, Negotiated, StockServer, Wire) {
    let (ours, theirs, wire) = tapped();
    let (ours, theirs) = tokio::join!(
        connect(client_tls(), dummy_server_name(), ours),
        TlsAcceptor::from(server).accept(theirs),
    );
    let (ours, negotiated) = ours.unwrap();
    (ours, negotiated, theirs.unwrap(), wire)
}

/// A stock client with `client`'s config connected to our server with
/// `server`'s.
async fn stock_to_ours(
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
) -> (RecordStream<DuplexStream>, Negotiated, StockClient, Wire) {
    let (ours, theirs, wire) = tapped();
    let (ours, theirs) = tokio::join!(
        accept(server, ours),
        TlsConnector::from(client).connect(dummy_server_name(), theirs),
    );
    let (ours, negotiated) = ours.unwrap();
    (ours, negotiated, theirs.unwrap(), wire)
}

/// Our client connected to our server.
async fn ours_to_ours() -> (RecordStream<DuplexStream>, RecordStream<DuplexStream>) {
    let (client, server, _) = tapped();
    let (client, server) = tokio::join!(
        connect(client_tls(), dummy_server_name(), client),
        accept(server_tls(), server),
    );
    (client.unwrap().0, server.unwrap().0)
}

/// Writes all of `data` in vectored writes of up to four slices, cut into
/// pieces whose sizes cycle through `cuts`, then flushes.
async fn write_sliced(writer: &mut (impl AsyncWrite + Unpin), data: &[u8], cuts: &[usize]) {
    let mut pieces = Vec::new();
    let mut rest = data;
    for &cut in cuts.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (piece, after) = rest.split_at(cut.min(rest.len()));
        pieces.push(piece);
        rest = after;
    }
    let (mut index, mut offset) = (0, 0);
    while index < pieces.len() {
        let mut slices = vec![IoSlice::new(&pieces[index][offset..])];
        slices.extend(pieces[index + 1..].iter().take(3).map(|p| IoSlice::new(p)));
        let mut written = writer.write_vectored(&slices).await.unwrap();
        assert!(written > 0, "a write took nothing");
        while written > 0 {
            let left = pieces[index].len() - offset;
            if written < left {
                offset += written;
                written = 0;
            } else {
                written -= left;
                (index, offset) = (index + 1, 0);
            }
        }
    }
    writer.flush().await.unwrap();
}

/// Slices as h2 hands a stream its frames: a header, payloads of every
/// size around the record size, a byte alone.
const FRAME_CUTS: [usize; 7] = [9, 1000, 16_384, 40_000, 1, 16_385, 100_003];

/// Slices of whole records only, so that every data record on the wire is
/// 16 KiB and a 27-byte record can only be a KeyUpdate.
const RECORD_CUTS: [usize; 2] = [16_384, 3 * 16_384];

/// Reads exactly `len` bytes slowly: small reads, a pause now and then.
async fn read_slowly(reader: &mut (impl AsyncRead + Unpin), len: usize) -> Vec<u8> {
    let mut received = Vec::with_capacity(len);
    let mut chunk = [0; 3000];
    for reads in 1.. {
        if received.len() == len {
            break;
        }
        let want = chunk.len().min(len - received.len());
        let read = reader.read(&mut chunk[..want]).await.unwrap();
        assert!(
            read > 0,
            "the end of the stream after {} of {len} bytes",
            received.len()
        );
        received.extend_from_slice(&chunk[..read]);
        if reads % 64 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    received
}

/// Sends `len` bytes from `from` to `to` in slices cut at `cuts`, and
/// checks that they arrive intact.
async fn send(
    from: &mut (impl AsyncWrite + Unpin),
    to: &mut (impl AsyncRead + Unpin),
    len: usize,
    cuts: &[usize],
) {
    let data = plaintext(len, len as u8);
    let (_, received) = tokio::time::timeout(PATIENCE, async {
        tokio::join!(write_sliced(from, &data, cuts), read_slowly(to, len))
    })
    .await
    .expect("the transfer hung");
    assert!(received == data, "{len} bytes arrive intact and in order");
}

/// Sends `len` bytes each way at once, cut as h2 cuts frames, and checks
/// that they arrive intact.
async fn exchange<A, B>(a: A, b: B, len: usize) -> (A, B)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut a_read, mut a_write) = tokio::io::split(a);
    let (mut b_read, mut b_write) = tokio::io::split(b);
    tokio::join!(
        send(&mut a_write, &mut b_read, len, &FRAME_CUTS),
        send(&mut b_write, &mut a_read, len, &FRAME_CUTS),
    );
    (a_read.unsplit(a_write), b_read.unsplit(b_write))
}

/// Sizes from a byte to 4 MiB, around the record size on both sides.
const SIZES: [usize; 8] = [1, 9, 16_383, 16_384, 16_385, 100_000, 1 << 20, 4 << 20];

/// [`exchange`] of each of [`SIZES`] in turn.
async fn exchange_every_size<A, B>(a: A, b: B)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let mut pair = (a, b);
    for len in SIZES {
        pair = exchange(pair.0, pair.1, len).await;
    }
}

/// The KeyUpdate records among `wire[from..]`.
fn key_updates(wire: &Wire, from: usize) -> usize {
    let wire = wire.lock().unwrap();
    wire[from..]
        .iter()
        .filter(|&&len| len == KEY_UPDATE_RECORD)
        .count()
}

/// The record error inside an I/O error from the stream.
fn record_error(error: &io::Error) -> Option<&RecordError> {
    error.get_ref()?.downcast_ref::<RecordError>()
}

#[tokio::test]
async fn our_client_and_a_stock_server_agree_on_h2_and_move_every_byte_both_ways() {
    let (ours, negotiated, theirs, _) = ours_to_stock(server_tls()).await;
    assert_eq!(negotiated.alpn_protocol.as_deref(), Some(ALPN_H2));
    assert_eq!(negotiated.peer_identity, Some(identity(SERVER)));
    assert_eq!(peer_identity(theirs.get_ref().1), Some(identity(CLIENT)));
    exchange_every_size(ours, theirs).await;
}

#[tokio::test]
async fn a_stock_client_and_our_server_agree_on_h2_and_move_every_byte_both_ways() {
    let (ours, negotiated, theirs, _) = stock_to_ours(client_tls(), server_tls()).await;
    assert_eq!(negotiated.alpn_protocol.as_deref(), Some(ALPN_H2));
    assert_eq!(negotiated.peer_identity, Some(identity(CLIENT)));
    assert_eq!(peer_identity(theirs.get_ref().1), Some(identity(SERVER)));
    exchange_every_size(ours, theirs).await;
}

#[tokio::test]
async fn each_slice_is_cut_into_records_of_its_own_and_every_byte_arrives_in_order() {
    let (mut ours, _, mut theirs, wire) = ours_to_stock(server_tls()).await;
    // (frame header and what h2 queued before it, payload, the records
    // we send, by content length)
    let cases: &[(usize, usize, &[usize])] = &[
        (9, 40_000, &[9, 16_384, 16_384, 7232]),
        (9, 16_384, &[9, 16_384]),
        (9, 100, &[9, 100]),
        (20_000, 16_384, &[16_384, 3616, 16_384]),
        (0, 5, &[5]),
    ];
    for &(head_len, payload_len, expected) in cases {
        let bytes = plaintext(head_len + payload_len, head_len as u8);
        let (head, payload) = bytes.split_at(head_len);
        let noted = wire.lock().unwrap().len();
        let slices = [IoSlice::new(head), IoSlice::new(payload)];
        let written = ours.write_vectored(&slices).await.unwrap();
        assert_eq!(written, bytes.len(), "below the send buffer, all is taken");
        ours.flush().await.unwrap();
        let mut received = vec![0; bytes.len()];
        theirs.read_exact(&mut received).await.unwrap();
        assert!(received == bytes, "{head_len} + {payload_len} bytes intact");
        let contents: Vec<usize> = wire.lock().unwrap()[noted..]
            .iter()
            .map(|len| len - SEALING)
            .collect();
        assert_eq!(
            contents, expected,
            "records of {head_len} + {payload_len} bytes"
        );
    }
}

#[tokio::test]
async fn a_writer_waits_for_a_slow_peer_with_no_more_than_the_send_buffer_queued() {
    let (mut ours, _, mut theirs, _) = ours_to_stock(server_tls()).await;
    let data = plaintext(4 << 20, 3);
    // Nobody reads: writes are taken until the send buffer is full, then
    // one waits. A write that waits has taken nothing.
    let mut offset = 0;
    while let Ok(written) =
        tokio::time::timeout(Duration::from_millis(100), ours.write(&data[offset..])).await
    {
        offset += written.unwrap();
        assert!(offset < data.len(), "4 MiB went into pipes nobody reads");
    }
    assert!(ours.sender.buffer_capacity() <= SEND_BUFFER + 2 * MAX_RECORD);
    // A reader comes: the rest is taken and all of it arrives.
    let (_, received) = tokio::join!(
        async {
            ours.write_all(&data[offset..]).await.unwrap();
            ours.flush().await.unwrap();
        },
        read_slowly(&mut theirs, data.len()),
    );
    assert!(received == data);
}

#[tokio::test]
async fn an_idle_stream_holds_no_buffers() {
    let (ours, _, theirs, _) = ours_to_stock(server_tls()).await;
    let (mut ours, _theirs) = exchange(ours, theirs, 1 << 20).await;
    // A read that finds nothing to read gives the receive buffer back; a
    // flushed queue gives the send buffer back.
    let mut buf = [0; 16];
    let idle = tokio::time::timeout(Duration::from_millis(50), ours.read(&mut buf)).await;
    assert!(idle.is_err(), "nothing was sent");
    assert_eq!(ours.receiver.buffer_capacity(), 0);
    assert_eq!(ours.sender.buffer_capacity(), 0);
}

#[tokio::test]
async fn a_stock_peers_key_update_requests_are_answered_and_data_keeps_flowing() {
    let len = 4 * 16_384;
    // Our client, a stock server asking for key updates.
    let (mut ours, _, mut theirs, wire) = ours_to_stock(server_tls()).await;
    for _ in 0..3 {
        theirs.get_mut().1.refresh_traffic_keys().unwrap();
        let noted = wire.lock().unwrap().len();
        // The request travels with the stock side's data; ours reads it,
        // then answers with one KeyUpdate before its own data.
        send(&mut theirs, &mut ours, len, &RECORD_CUTS).await;
        send(&mut ours, &mut theirs, len, &RECORD_CUTS).await;
        assert_eq!(key_updates(&wire, noted), 1, "one answer per request");
    }
    // Our server, a stock client asking for key updates.
    let (mut ours, _, mut theirs, wire) = stock_to_ours(client_tls(), server_tls()).await;
    for _ in 0..3 {
        theirs.get_mut().1.refresh_traffic_keys().unwrap();
        let noted = wire.lock().unwrap().len();
        send(&mut theirs, &mut ours, len, &RECORD_CUTS).await;
        send(&mut ours, &mut theirs, len, &RECORD_CUTS).await;
        assert_eq!(key_updates(&wire, noted), 1, "one answer per request");
    }
    let (ours, theirs) = exchange(ours, theirs, 1 << 20).await;
    drop((ours, theirs));
}

#[tokio::test]
async fn crossing_the_confidentiality_limit_updates_our_key_and_the_stock_peer_reads_everything() {
    // 4 MiB in 16 KiB records is 256 records; a key seals 64, the last of
    // them its KeyUpdate, so data records 63, 126, 189 and 252 each come
    // after an update.
    let len = 4 << 20;
    let (mut ours, _, mut theirs, wire) = ours_to_stock(server_tls()).await;
    ours.sender.set_limit(64);
    let noted = wire.lock().unwrap().len();
    send(&mut ours, &mut theirs, len, &RECORD_CUTS).await;
    assert_eq!(key_updates(&wire, noted), 4, "our client");

    let (mut ours, _, mut theirs, wire) = stock_to_ours(client_tls(), server_tls()).await;
    ours.sender.set_limit(64);
    let noted = wire.lock().unwrap().len();
    send(&mut ours, &mut theirs, len, &RECORD_CUTS).await;
    assert_eq!(key_updates(&wire, noted), 4, "our server");
}

#[tokio::test]
async fn our_client_and_our_server_update_their_keys_across_the_limit_both_ways() {
    let (mut client, mut server) = ours_to_ours().await;
    client.sender.set_limit(16);
    server.sender.set_limit(16);
    let (client, server) = exchange(client, server, 4 << 20).await;
    drop((client, server));
}

#[tokio::test]
async fn close_notify_either_way_is_the_end_of_the_stream_on_the_other_side() {
    let (mut ours, _, mut theirs, _) = ours_to_stock(server_tls()).await;
    ours.write_all(b"last words").await.unwrap();
    ours.shutdown().await.unwrap();
    ours.shutdown().await.unwrap();
    let mut received = Vec::new();
    theirs.read_to_end(&mut received).await.unwrap();
    assert_eq!(received, b"last words", "then the end of the stream");
    let error = ours.write(b"more").await.unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::BrokenPipe);
    assert_eq!(record_error(&error), Some(&RecordError::WriteAfterShutdown));

    // The other way, on the same connection: our side still reads.
    theirs.write_all(b"goodbye").await.unwrap();
    theirs.shutdown().await.unwrap();
    let mut received = Vec::new();
    ours.read_to_end(&mut received).await.unwrap();
    assert_eq!(received, b"goodbye");
    assert_eq!(
        ours.read(&mut [0; 8]).await.unwrap(),
        0,
        "and the end stays"
    );
    assert_eq!(ours.receiver.buffer_capacity(), 0, "nothing more is read");
}

#[tokio::test]
async fn a_stock_peer_updating_its_key_32_times_between_data_is_read_and_33_times_is_cut_off() {
    // Our server, a stock client updating its key with no data between.
    let (mut ours, _, mut theirs, _) = stock_to_ours(client_tls(), server_tls()).await;
    for _ in 0..2 {
        for _ in 0..32 {
            theirs.get_mut().1.refresh_traffic_keys().unwrap();
        }
        send(&mut theirs, &mut ours, 1000, &RECORD_CUTS).await;
    }
    for _ in 0..33 {
        theirs.get_mut().1.refresh_traffic_keys().unwrap();
    }
    theirs.write_all(b"late").await.unwrap();
    theirs.flush().await.unwrap();
    let error = ours.read(&mut [0; 16]).await.unwrap_err();
    assert_eq!(record_error(&error), Some(&RecordError::TooManyKeyUpdates));
    // The stock client hears why.
    let mut rest = Vec::new();
    let stock = theirs.read_to_end(&mut rest).await.unwrap_err();
    assert!(
        stock.to_string().contains("UnexpectedMessage"),
        "the stock client was told: {stock}"
    );
}

#[tokio::test]
async fn a_stock_server_flooding_session_tickets_is_cut_off() {
    let (mut ours, _, _theirs, _) = ours_to_stock(server_tls_with_tickets(33)).await;
    let error = ours.read(&mut [0; 16]).await.unwrap_err();
    assert_eq!(
        record_error(&error),
        Some(&RecordError::TooManySessionTickets)
    );
}

#[tokio::test]
async fn our_client_takes_the_stock_servers_session_tickets_in_stride() {
    let (ours, _, theirs, _) = ours_to_stock(server_tls_with_tickets(4)).await;
    exchange(ours, theirs, 1 << 20).await;
    // A client that keeps tickets hands them to rustls's store.
    let mut config = client_config(&pki().client, vec![identity(SERVER)]).unwrap();
    config.resumption = rustls::client::Resumption::in_memory_sessions(8);
    let (ours, theirs, _) = tapped();
    let (ours, theirs) = tokio::join!(
        connect(Arc::new(config), dummy_server_name(), ours),
        TlsAcceptor::from(server_tls_with_tickets(2)).accept(theirs),
    );
    exchange(ours.unwrap().0, theirs.unwrap(), 1 << 20).await;
}

#[tokio::test]
async fn our_server_that_sent_tickets_updates_its_key_before_its_first_record() {
    // The tickets took sequence numbers 0 and 1 of the server's key, and
    // aws-lc's nonce check counts from a key's first record: without the
    // update the key would refuse records a few in.
    let (ours, _, theirs, wire) = stock_to_ours(client_tls(), server_tls_with_tickets(2)).await;
    // The tickets are in the pipe; the tap notes them when it next runs.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let noted = wire.lock().unwrap().len();
    let (ours, theirs) = exchange(ours, theirs, 1 << 20).await;
    assert_eq!(wire.lock().unwrap()[noted], KEY_UPDATE_RECORD);
    drop((ours, theirs));
}
