//! The handshake: records that arrive with its end are handed over to the
//! record layer, and a refused peer is told why.

use super::*;

/// Runs a stock rustls connection's handshake over `io` by hand, with
/// `data` written before it starts: rustls sends it as soon as it may, in
/// the same write as its last flight. The last `held_back` bytes of that
/// write are sent a moment later, in a write of their own.
async fn stock_handshake_with_data(
    mut session: rustls::Connection,
    mut io: DuplexStream,
    data: &[u8],
    held_back: usize,
) -> (rustls::Connection, DuplexStream) {
    use std::io::Write;
    session.writer().write_all(data).unwrap();
    loop {
        let mut out = Vec::new();
        while session.wants_write() {
            session.write_tls(&mut out).unwrap();
        }
        if !session.is_handshaking() {
            let (now, later) = out.split_at(out.len() - held_back);
            io.write_all(now).await.unwrap();
            if !later.is_empty() {
                // Our side reads the first part alone, and ends its
                // handshake on it.
                tokio::time::sleep(Duration::from_millis(20)).await;
                io.write_all(later).await.unwrap();
            }
            return (session, io);
        }
        io.write_all(&out).await.unwrap();
        let mut buf = vec![0; 64 * 1024];
        let read = io.read(&mut buf).await.unwrap();
        assert!(read > 0, "the end of the stream during the handshake");
        session.read_tls(&mut &buf[..read]).unwrap();
        session.process_new_packets().unwrap();
    }
}

/// Checks that `ours` holds bytes read with the handshake's end, and that
/// they are the stock side's first data.
async fn reads_what_came_with_the_handshake(mut ours: RecordStream<DuplexStream>) {
    assert!(
        ours.receiver.buffer_capacity() > 0,
        "the data came with the handshake"
    );
    let mut received = [0; 10];
    ours.read_exact(&mut received).await.unwrap();
    assert_eq!(&received, b"right away");
}

#[tokio::test]
async fn records_that_come_in_the_same_read_as_the_handshakes_end_are_read() {
    records_with_the_handshakes_end(0).await;
}

/// The first data record on the wire: "right away", sealed.
const FIRST_RECORD: usize = 10 + SEALING;

#[tokio::test]
async fn a_record_cut_by_the_read_that_ends_the_handshake_is_read_once_the_rest_comes() {
    // Held back: all but its first byte, all but its header, half of it,
    // its last byte.
    for held_back in [
        FIRST_RECORD - 1,
        FIRST_RECORD - HEADER_LEN,
        FIRST_RECORD / 2,
        1,
    ] {
        records_with_the_handshakes_end(held_back).await;
    }
}

/// Both sides read the stock side's first data, sent with the end of its
/// handshake less `held_back` bytes that follow a moment later.
async fn records_with_the_handshakes_end(held_back: usize) {
    // Our client: the stock server's first data follows its Finished. A
    // server sends data before the client's Finished only if it asks for
    // no client certificate (rustls's `send_half_rtt_data`).
    let mut config = ServerConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(Arc::clone(
            pki().server.certified_key(),
        ))));
    config.send_half_rtt_data = true;
    let (ours, theirs) = tokio::io::duplex(PIPE);
    let server = rustls::ServerConnection::new(Arc::new(config)).unwrap();
    let (ours, _theirs) = tokio::join!(
        connect(client_tls(), dummy_server_name(), ours),
        stock_handshake_with_data(server.into(), theirs, b"right away", held_back),
    );
    reads_what_came_with_the_handshake(ours.unwrap().0).await;

    // Our server: the stock client's first data follows its Finished.
    let (ours, theirs) = tokio::io::duplex(PIPE);
    let client = rustls::ClientConnection::new(client_tls(), dummy_server_name()).unwrap();
    let (ours, _theirs) = tokio::join!(
        accept(server_tls(), ours),
        stock_handshake_with_data(client.into(), theirs, b"right away", held_back),
    );
    reads_what_came_with_the_handshake(ours.unwrap().0).await;
}

/// The rustls error a stock tokio-rustls stream reported.
fn stock_tls_error(error: &io::Error) -> Option<&rustls::Error> {
    error.get_ref()?.downcast_ref::<rustls::Error>()
}

#[tokio::test]
async fn a_server_of_an_unexpected_identity_is_refused_and_told_why() {
    let other = identity("spiffe://cluster.local/ns/default/sa/other");
    let config = Arc::new(client_config(&pki().client, vec![other]).unwrap());
    let (ours, theirs) = tokio::io::duplex(PIPE);
    let (ours, theirs) = tokio::join!(
        connect(config, dummy_server_name(), ours),
        TlsAcceptor::from(server_tls()).accept(theirs),
    );
    let Err(HandshakeError::Tls(rustls::Error::InvalidCertificate(_))) = ours else {
        panic!("expected a refused certificate, got {ours:?}");
    };
    let theirs = theirs.unwrap_err();
    // rustls's alert for a certificate its verifier refused for its own
    // reasons.
    assert_eq!(
        stock_tls_error(&theirs),
        Some(&rustls::Error::AlertReceived(
            AlertDescription::CertificateUnknown
        )),
        "{theirs}"
    );
}

#[tokio::test]
async fn a_client_of_another_trust_domain_is_refused_and_told_why() {
    // One root for both, so that only the trust domain differs.
    let issuer = root_issuer();
    let server = issue(&issuer, &identity(SERVER));
    let foreign = issue(
        &issuer,
        &identity("spiffe://other.domain/ns/default/sa/client"),
    );
    let client = Arc::new(client_config(&foreign, vec![identity(SERVER)]).unwrap());
    let (ours, theirs) = tokio::io::duplex(PIPE);
    let (ours, theirs) = tokio::join!(
        accept(Arc::new(server_config(&server).unwrap()), ours),
        TlsConnector::from(client).connect(dummy_server_name(), theirs),
    );
    let Err(HandshakeError::Tls(rustls::Error::InvalidCertificate(_))) = ours else {
        panic!("expected a refused certificate, got {:?}", ours.map(|_| ()));
    };
    // A TLS 1.3 client is done before the server has seen its
    // certificate: it hears of the refusal at its first read.
    let mut theirs = theirs.unwrap();
    let error = theirs.read(&mut [0; 16]).await.unwrap_err();
    assert_eq!(
        stock_tls_error(&error),
        Some(&rustls::Error::AlertReceived(
            AlertDescription::CertificateUnknown
        )),
        "{error}"
    );
}

#[tokio::test]
async fn a_peer_that_leaves_during_the_handshake_fails_it() {
    let (ours, theirs) = tokio::io::duplex(PIPE);
    drop(theirs);
    let error = accept(server_tls(), ours).await.unwrap_err();
    assert!(matches!(error, HandshakeError::Closed), "{error}");
}
