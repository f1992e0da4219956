#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! Our record layer (`tls::record::{connect, accept}`) against OpenSSL's
//! `s_server` and `s_client`, run as child processes on loopback: a peer
//! that shares no code with rustls or with us. Data both ways with each
//! AES-GCM suite, key updates both ways, session tickets, small and padded
//! records, and close_notify both ways. Skipped, with the reason, where
//! `openssl` is not on PATH.
//!
//! What OpenSSL prints goes to its stdout, which a thread collects; what
//! it sends comes from lines typed on its stdin. A line `k` makes it update
//! its key, `K` update and ask us to update ours, `Q` close the connection
//! with close_notify. Our side's transport is tapped, so that the records
//! each side sent can be told apart by length.

use std::io::{self, Read, Write};
use std::path::Path;
use std::pin::Pin;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use rustls_pki_types::PrivateKeyDer;
use tempfile::TempDir;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::csr::CertRequest;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::issuer::{Issuer, SigningMaterial, SigningRequest, generate_root};
use ztunnel_certs::tls::record::{RecordError, RecordStream, accept, connect};
use ztunnel_certs::tls::{ALPN_H2, client_config, dummy_server_name, server_config};
use ztunnel_test_support::skip::skip;

const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/client";
const SERVER: &str = "spiffe://cluster.local/ns/default/sa/server";

/// Generous: everything is on loopback; this only stops a hung test.
const PATIENCE: Duration = Duration::from_secs(20);

/// The TLS 1.3 suites of WIRE.md §4, by OpenSSL's names.
const SUITES: [&str; 2] = ["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384"];

/// A KeyUpdate record on the wire, unpadded: header, the 5-byte message,
/// its content type, the AES-GCM tag.
const KEY_UPDATE_RECORD: usize = 5 + 5 + 1 + 16;

/// What a record adds to its content on the wire: header, content type, tag.
const SEALING: usize = 5 + 1 + 16;

/// Certificates and keys from one root of their own, as PEM files.
struct Pki {
    dir: TempDir,
    client: WorkloadCertificate,
    server: WorkloadCertificate,
}

impl Pki {
    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let root = generate_root("cluster.local", SystemTime::now()).unwrap();
        let issuer = Issuer::new(&SigningMaterial {
            root_cert_pem: root.cert_pem.clone(),
            root_key_pem: Some(root.key_pem),
            ..SigningMaterial::default()
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("root.pem"), &root.cert_pem).unwrap();
        Pki {
            client: issue(&issuer, CLIENT, dir.path(), "client"),
            server: issue(&issuer, SERVER, dir.path(), "server"),
            dir,
        }
    })
}

/// A certificate for `uri`, also written as `<name>.pem` (the chain
/// without the root) and `<name>.key`.
fn issue(issuer: &Issuer, uri: &str, dir: &Path, name: &str) -> WorkloadCertificate {
    let identity = identity(uri);
    let request = CertRequest::generate(&identity).unwrap();
    let signing = SigningRequest::from_pem(request.csr_pem()).unwrap();
    let hour = Duration::from_secs(3600);
    let chain = issuer
        .sign_workload(&signing, &identity, hour, SystemTime::now())
        .unwrap();
    let without_root = &chain[..chain.len() - 1];
    std::fs::write(dir.join(format!("{name}.pem")), without_root.concat()).unwrap();
    let PrivateKeyDer::Pkcs8(key) = request.private_key() else {
        panic!("CSR keys are PKCS#8");
    };
    let encoded = base64::engine::general_purpose::STANDARD.encode(key.secret_pkcs8_der());
    let lines: Vec<&str> = encoded
        .as_bytes()
        .chunks(64)
        .map(|line| std::str::from_utf8(line).unwrap())
        .collect();
    let pem = format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        lines.join("\n")
    );
    std::fs::write(dir.join(format!("{name}.key")), pem).unwrap();
    WorkloadCertificate::from_ca_response(&chain, request.private_key(), Some(&identity)).unwrap()
}

fn identity(uri: &str) -> Identity {
    uri.parse().unwrap()
}

/// Whether `openssl` runs here; when not, the test skips with the reason.
fn have_openssl() -> bool {
    let found = Command::new("openssl")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        skip("`openssl` is not on PATH (apt-get install openssl)");
    }
    found
}

/// An OpenSSL child process, killed by its PID when dropped.
struct OpenSsl {
    child: Child,
    stdin: Option<ChildStdin>,
    /// Everything it printed, stdout and stderr, as it came.
    output: Arc<Mutex<Vec<u8>>>,
}

impl OpenSsl {
    fn spawn(args: &[String]) -> OpenSsl {
        let mut child = Command::new("openssl")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let output = Arc::new(Mutex::new(Vec::new()));
        collect(child.stdout.take().unwrap(), Arc::clone(&output));
        collect(child.stderr.take().unwrap(), Arc::clone(&output));
        OpenSsl {
            stdin: child.stdin.take(),
            child,
            output,
        }
    }

    /// `s_server` on an ephemeral loopback port, with our server's
    /// certificate, requiring a client certificate from our root; and the
    /// port, once it listens.
    async fn server(extra: &[&str]) -> (OpenSsl, u16) {
        let pki = pki();
        let mut args = strings(&[
            "s_server",
            "-accept",
            "127.0.0.1:0",
            "-naccept",
            "1",
            "-tls1_3",
            "-alpn",
            "h2",
            "-Verify",
            "1",
            "-verify_return_error",
        ]);
        args.extend(strings(&["-CAfile", &pki.path("root.pem")]));
        args.extend(strings(&["-cert", &pki.path("server.pem")]));
        args.extend(strings(&["-key", &pki.path("server.key")]));
        args.extend(strings(extra));
        let server = OpenSsl::spawn(&args);
        let line = server.wait_for_line("ACCEPT 127.0.0.1:").await;
        let port = line.rsplit(':').next().unwrap().trim().parse().unwrap();
        (server, port)
    }

    /// `s_client` to `port` on loopback with our client's certificate,
    /// verifying the server's chain against our root.
    fn client(port: u16, extra: &[&str]) -> OpenSsl {
        let pki = pki();
        let mut args = strings(&[
            "s_client",
            "-connect",
            &format!("127.0.0.1:{port}"),
            "-tls1_3",
            "-alpn",
            "h2",
            "-verify_return_error",
        ]);
        args.extend(strings(&["-CAfile", &pki.path("root.pem")]));
        args.extend(strings(&["-cert", &pki.path("client.pem")]));
        args.extend(strings(&["-key", &pki.path("client.key")]));
        args.extend(strings(extra));
        OpenSsl::spawn(&args)
    }

    /// Types `line` and a newline on its stdin.
    fn type_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    fn output(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// Waits until it has printed `text`.
    async fn wait_for(&self, text: &str) {
        let deadline = Instant::now() + PATIENCE;
        while !self.output().contains(text) {
            assert!(
                Instant::now() < deadline,
                "openssl never printed {text:?}; it printed:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits for a line that starts with `start`, and returns it.
    async fn wait_for_line(&self, start: &str) -> String {
        self.wait_for(start).await;
        let output = self.output();
        let line = output.lines().find(|line| line.starts_with(start));
        line.unwrap().to_owned()
    }

    /// Waits for it to exit on its own.
    async fn wait_for_exit(&mut self) {
        let deadline = Instant::now() + PATIENCE;
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "openssl did not exit");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for OpenSsl {
    fn drop(&mut self) {
        // Child::kill signals this child's PID, and only it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Appends what `from` gives to `into`, on a thread of its own, until it
/// ends (the child exits or is killed).
fn collect(mut from: impl Read + Send + 'static, into: Arc<Mutex<Vec<u8>>>) {
    std::thread::spawn(move || {
        let mut buf = [0; 16 * 1024];
        while let Ok(read @ 1..) = from.read(&mut buf) {
            into.lock().unwrap().extend_from_slice(&buf[..read]);
        }
    });
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|arg| (*arg).to_owned()).collect()
}

/// The bytes one side of a connection sent, as they went over the wire.
type Wire = Arc<Mutex<Vec<u8>>>;

/// A TCP stream whose bytes both ways are noted as they pass.
struct Tapped {
    io: TcpStream,
    sent: Wire,
    received: Wire,
}

impl AsyncRead for Tapped {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.io).poll_read(cx, buf);
        let read = &buf.filled()[before..];
        this.received.lock().unwrap().extend_from_slice(read);
        poll
    }
}

impl AsyncWrite for Tapped {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = poll {
            this.sent.lock().unwrap().extend_from_slice(&buf[..written]);
        }
        poll
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Our side of a connection to or from OpenSSL, with the tap's notes and
/// where the handshake's bytes ended in each.
struct Ours {
    stream: RecordStream<Tapped>,
    sent: Wire,
    received: Wire,
    sent_at_handshake: usize,
    received_at_handshake: usize,
}

impl Ours {
    /// Our client connected to OpenSSL's server on `port`, which must be
    /// our server's identity and agree on h2.
    async fn connect(port: u16) -> Ours {
        let io = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let config = client_config(&pki().client, vec![identity(SERVER)]).unwrap();
        let (io, sent, received) = tap(io);
        let handshake = connect(Arc::new(config), dummy_server_name(), io);
        let (stream, negotiated) = tokio::time::timeout(PATIENCE, handshake)
            .await
            .expect("the handshake hung")
            .unwrap();
        assert_eq!(negotiated.alpn_protocol.as_deref(), Some(ALPN_H2));
        assert_eq!(negotiated.peer_identity, Some(identity(SERVER)));
        Ours::new(stream, sent, received)
    }

    /// Our server, having accepted OpenSSL's client from `listener`, which
    /// must present our client's identity and agree on h2.
    async fn accept(listener: &TcpListener) -> Ours {
        let handshake = async {
            let (io, _) = listener.accept().await.unwrap();
            let config = server_config(&pki().server).unwrap();
            let (io, sent, received) = tap(io);
            let accepted = accept(Arc::new(config), io).await;
            accepted.map(|(stream, negotiated)| (stream, negotiated, sent, received))
        };
        let (stream, negotiated, sent, received) = tokio::time::timeout(PATIENCE, handshake)
            .await
            .expect("the handshake hung")
            .unwrap();
        assert_eq!(negotiated.alpn_protocol.as_deref(), Some(ALPN_H2));
        assert_eq!(negotiated.peer_identity, Some(identity(CLIENT)));
        Ours::new(stream, sent, received)
    }

    fn new(stream: RecordStream<Tapped>, sent: Wire, received: Wire) -> Ours {
        let sent_at_handshake = sent.lock().unwrap().len();
        let received_at_handshake = received.lock().unwrap().len();
        Ours {
            stream,
            sent,
            received,
            sent_at_handshake,
            received_at_handshake,
        }
    }

    /// Reads until `text` has come, and returns all that came.
    async fn read_until(&mut self, text: &str) -> String {
        let mut received = Vec::new();
        let mut buf = vec![0; 64 * 1024];
        let reading = async {
            while !String::from_utf8_lossy(&received).contains(text) {
                let read = self.stream.read(&mut buf).await.unwrap();
                assert!(read > 0, "the stream ended before {text:?}");
                received.extend_from_slice(&buf[..read]);
            }
        };
        tokio::time::timeout(PATIENCE, reading)
            .await
            .unwrap_or_else(|_| panic!("{text:?} never came"));
        String::from_utf8(received).unwrap()
    }

    /// Reads until a KeyUpdate record has come after the first `records`
    /// records since the handshake; no data may come before it.
    async fn wait_for_key_update(&mut self, records: usize) {
        let deadline = Instant::now() + PATIENCE;
        let mut buf = [0; 64];
        while !self.received_records()[records..].contains(&KEY_UPDATE_RECORD) {
            assert!(Instant::now() < deadline, "no KeyUpdate came");
            // A read that waits is dropped unfinished, having taken
            // nothing: the record layer's reads are cancel safe.
            let short = Duration::from_millis(20);
            if let Ok(read) = tokio::time::timeout(short, self.stream.read(&mut buf)).await {
                panic!("data or an end came before the KeyUpdate: {read:?}");
            }
        }
    }

    async fn write(&mut self, data: &[u8]) {
        self.stream.write_all(data).await.unwrap();
        self.stream.flush().await.unwrap();
    }

    /// The lengths of the records we sent since the handshake.
    fn sent_records(&self) -> Vec<usize> {
        records_after(&self.sent.lock().unwrap(), self.sent_at_handshake)
    }

    /// The lengths of the records OpenSSL sent since the handshake.
    fn received_records(&self) -> Vec<usize> {
        records_after(&self.received.lock().unwrap(), self.received_at_handshake)
    }
}

fn tap(io: TcpStream) -> (Tapped, Wire, Wire) {
    let (sent, received) = (Wire::default(), Wire::default());
    let tapped = Tapped {
        io,
        sent: Arc::clone(&sent),
        received: Arc::clone(&received),
    };
    (tapped, sent, received)
}

/// The lengths on the wire of the whole records in `bytes` that start at
/// or after `from`.
fn records_after(bytes: &[u8], from: usize) -> Vec<usize> {
    let mut lengths = Vec::new();
    let mut at = 0;
    while let Some(&[_, _, _, high, low]) = bytes.get(at..at + 5) {
        let len = 5 + usize::from(u16::from_be_bytes([high, low]));
        if at + len > bytes.len() {
            break;
        }
        if at >= from {
            lengths.push(len);
        }
        at += len;
    }
    lengths
}

/// `count` lines of printable text, each unique, none starting with one
/// of OpenSSL's command letters.
fn lines(tag: &str, count: usize) -> String {
    (0..count)
        .map(|i| format!("line {tag} {i:05} {}\n", "x".repeat(i % 97)))
        .collect()
}

/// Sends 50 KiB from us (full records and a shorter last one), which
/// OpenSSL prints, and 50 lines typed into OpenSSL, which we read.
async fn data_both_ways(openssl: &mut OpenSsl, ours: &mut Ours, tag: &str) {
    let sent = lines(&format!("ours-{tag}"), 600);
    ours.write(sent.as_bytes()).await;
    openssl.wait_for(&sent).await;
    let typed = lines(&format!("openssl-{tag}"), 50);
    for line in typed.lines() {
        openssl.type_line(line);
    }
    let received = ours.read_until(typed.lines().last().unwrap()).await;
    assert_eq!(received, typed);
}

/// A listener on an ephemeral loopback port, and the port.
async fn listen() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

#[tokio::test]
async fn our_client_and_openssl_s_server_move_data_both_ways_with_each_aes_gcm_suite() {
    if !have_openssl() {
        return;
    }
    for suite in SUITES {
        let (mut server, port) = OpenSsl::server(&["-ciphersuites", suite]).await;
        let mut ours = Ours::connect(port).await;
        server.wait_for(&format!("CIPHER is {suite}")).await;
        data_both_ways(&mut server, &mut ours, &suite.to_lowercase()).await;
    }
}

#[tokio::test]
async fn openssl_s_client_and_our_server_move_data_both_ways_with_each_aes_gcm_suite() {
    if !have_openssl() {
        return;
    }
    for suite in SUITES {
        let (listener, port) = listen().await;
        let mut client = OpenSsl::client(port, &["-ciphersuites", suite]);
        let mut ours = Ours::accept(&listener).await;
        client.wait_for(&format!("Cipher is {suite}")).await;
        client.wait_for("Verify return code: 0 (ok)").await;
        data_both_ways(&mut client, &mut ours, &suite.to_lowercase()).await;
    }
}

/// Has OpenSSL update its key (`k`), then update and ask us to (`K`),
/// three times each, with data after each: we read OpenSSL's records under
/// each new key, answer each request with one KeyUpdate of our own, and
/// OpenSSL reads our data under our new key.
async fn key_updates_both_ways(openssl: &mut OpenSsl, ours: &mut Ours) {
    for round in 0..3 {
        for command in ["k", "K"] {
            let before_sent = ours.sent_records().len();
            let before_received = ours.received_records().len();
            openssl.type_line(command);
            // OpenSSL drops the rest of the read that held a command: the
            // next line is typed once its KeyUpdate has come.
            ours.wait_for_key_update(before_received).await;
            let line = format!("line after {command} in round {round}");
            openssl.type_line(&line);
            ours.read_until(&line).await;
            let received = &ours.received_records()[before_received..];
            assert_eq!(
                received
                    .iter()
                    .filter(|&&len| len == KEY_UPDATE_RECORD)
                    .count(),
                1,
                "OpenSSL updated its key after {command}: {received:?}"
            );
            let answer = format!("our answer to {command} in round {round}\n");
            ours.write(answer.as_bytes()).await;
            openssl.wait_for(&answer).await;
            let sent = &ours.sent_records()[before_sent..];
            let updates = sent.iter().filter(|&&len| len == KEY_UPDATE_RECORD).count();
            let asked = usize::from(command == "K");
            assert_eq!(updates, asked, "we update when asked only: {sent:?}");
        }
    }
}

#[tokio::test]
async fn key_updates_either_way_with_openssl_keep_data_flowing() {
    if !have_openssl() {
        return;
    }
    let (mut server, port) = OpenSsl::server(&[]).await;
    let mut ours = Ours::connect(port).await;
    key_updates_both_ways(&mut server, &mut ours).await;

    let (listener, port) = listen().await;
    let mut client = OpenSsl::client(port, &[]);
    let mut ours = Ours::accept(&listener).await;
    key_updates_both_ways(&mut client, &mut ours).await;
}

#[tokio::test]
async fn our_client_takes_five_session_tickets_from_openssl() {
    if !have_openssl() {
        return;
    }
    let (mut server, port) = OpenSsl::server(&["-num_tickets", "5"]).await;
    let mut ours = Ours::connect(port).await;
    server.type_line("line after the tickets");
    ours.read_until("line after the tickets").await;
    // Tickets are sealed handshake records longer than a KeyUpdate, all
    // before the line's record.
    let received = ours.received_records();
    let (line, tickets) = received.split_last().unwrap();
    assert_eq!(*line, "line after the tickets\n".len() + SEALING);
    assert_eq!(tickets.len(), 5, "five tickets: {received:?}");
    ours.write(b"line back\n").await;
    server.wait_for("line back\n").await;
}

#[tokio::test]
async fn openssl_records_of_512_bytes_and_padded_records_are_read_intact() {
    if !have_openssl() {
        return;
    }
    let typed = lines("small", 200);
    // Up to 512 bytes of content a record.
    let (mut server, port) = OpenSsl::server(&["-max_send_frag", "512"]).await;
    let mut ours = Ours::connect(port).await;
    server.type_line(typed.trim_end());
    assert_eq!(ours.read_until("line small 00199").await, typed);
    let received = ours.received_records();
    assert!(received.len() > typed.len() / 512, "{received:?}");
    assert!(received.iter().all(|&len| len <= 512 + SEALING));

    // Every record's inner plaintext padded to a multiple of 256 bytes.
    let (mut server, port) = OpenSsl::server(&["-record_padding", "256"]).await;
    let mut ours = Ours::connect(port).await;
    server.type_line(typed.trim_end());
    assert_eq!(ours.read_until("line small 00199").await, typed);
    let received = ours.received_records();
    assert!(
        received.iter().all(|&len| (len - 5 - 16) % 256 == 0),
        "{received:?}"
    );
    ours.write(b"line back\n").await;
    server.wait_for("line back\n").await;

    // The other way: OpenSSL's client reads our full records padded by it.
    let (listener, port) = listen().await;
    let mut client = OpenSsl::client(port, &["-record_padding", "256", "-max_send_frag", "512"]);
    let mut ours = Ours::accept(&listener).await;
    client.type_line(typed.trim_end());
    assert_eq!(ours.read_until("line small 00199").await, typed);
}

#[tokio::test]
async fn close_notify_either_way_ends_the_stream_on_the_other_side() {
    if !have_openssl() {
        return;
    }
    // OpenSSL's server, told to close (`Q` or `q`), closes its socket
    // before it shuts TLS down, so no close_notify leaves: we must not
    // take that for the end of the data.
    for command in ["Q", "q"] {
        let (mut server, port) = OpenSsl::server(&[]).await;
        let mut ours = Ours::connect(port).await;
        server.type_line("last line");
        ours.read_until("last line").await;
        server.type_line(command);
        let end = tokio::time::timeout(PATIENCE, ours.stream.read(&mut [0; 64])).await;
        let error = end.expect("the end never came").unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(
            error
                .get_ref()
                .and_then(|e| e.downcast_ref::<RecordError>()),
            Some(&RecordError::NoCloseNotify)
        );
    }

    // We close to OpenSSL's server: it sees close_notify and is done.
    let (mut server, port) = OpenSsl::server(&[]).await;
    let mut ours = Ours::connect(port).await;
    ours.write(b"our last line\n").await;
    ours.stream.shutdown().await.unwrap();
    server.wait_for("our last line\n").await;
    server.wait_for("DONE").await;
    server.wait_for_exit().await;

    // OpenSSL's client closes (`Q`) with close_notify: we read the end of
    // the stream, not an error.
    let (listener, port) = listen().await;
    let mut client = OpenSsl::client(port, &[]);
    let mut ours = Ours::accept(&listener).await;
    client.type_line("last line");
    ours.read_until("last line").await;
    client.type_line("Q");
    let end = tokio::time::timeout(PATIENCE, ours.stream.read(&mut [0; 64])).await;
    assert_eq!(end.expect("the end never came").unwrap(), 0);

    // We close to OpenSSL's client: it reads close_notify and exits.
    let (listener, port) = listen().await;
    let mut client = OpenSsl::client(port, &[]);
    let mut ours = Ours::accept(&listener).await;
    ours.write(b"our last line\n").await;
    ours.stream.shutdown().await.unwrap();
    client.wait_for("our last line\n").await;
    client.wait_for("closed").await;
    client.wait_for_exit().await;
}
