//! The handshake before the record layer takes over: rustls's unbuffered
//! connection driven over the transport until the handshake is complete,
//! what callers need of the session (the ALPN protocol, the peer's
//! identity) read from it, then its traffic secrets taken out
//! (`dangerous_into_kernel_connection`) for a [`RecordStream`].
//!
//! rustls is given the bytes read one whole record at a time, and none once
//! the handshake is complete: the records behind the handshake's last one
//! (session tickets, the first application data, arriving in the same read)
//! are left to the record layer, which opens them with the extracted keys
//! and sequence numbers. So rustls never holds a record the record layer
//! would need, nor one it had begun to process.

use std::io;
use std::ops::DerefMut;
use std::sync::Arc;

use rustls::client::{ClientConnectionData, UnbufferedClientConnection};
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncodeTlsData, UnbufferedConnectionCommon, UnbufferedStatus,
};
use rustls::{ClientConfig, ExtractedSecrets, ServerConfig};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{HEADER_LEN, Kernel, RecordError, RecordStream};
use crate::identity::Identity;
use crate::tls::peer_identity;
use crate::tls::revocation::{self, PeerChain};

/// What one read during the handshake asks for at least: a flight of
/// certificates takes a few.
const HANDSHAKE_READ: usize = 4096;

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// Reading or writing the transport failed.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// rustls refused the peer or the handshake: an unverified certificate,
    /// an identity not expected, no common protocol version or suite, an
    /// alert from the peer.
    #[error(transparent)]
    Tls(#[from] rustls::Error),
    /// The transport ended before the handshake did.
    #[error("the peer closed the connection during the TLS handshake")]
    Closed,
    /// rustls reached a state this driver does not expect during a
    /// handshake; named here.
    #[error("rustls asked for {0} during the TLS handshake")]
    Unexpected(&'static str),
    /// The session cannot be handed to the record layer: not TLS 1.3 with
    /// AES-GCM.
    #[error(transparent)]
    Record(#[from] RecordError),
}

/// What the handshake settled that callers act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// The ALPN protocol both sides agreed on, if any.
    pub alpn_protocol: Option<Vec<u8>>,
    /// The SPIFFE identity of the peer's verified certificate; `None` when
    /// the peer sent none (a client the server config does not require a
    /// certificate of).
    pub peer_identity: Option<Identity>,
    /// The peer's verified chain, to track the connection against the
    /// revocation lists installed later; kept only once
    /// [`revocation::track_connections`] was called, and `None` when the
    /// peer sent none.
    pub peer_chain: Option<PeerChain>,
}

/// Runs a client handshake with `config` to `name` over `io`, and returns
/// the established stream. Not bounded in time: the caller's timeout is.
pub async fn connect<IO>(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    io: IO,
) -> Result<(RecordStream<IO>, Negotiated), HandshakeError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    drive(UnbufferedClientConnection::new(config, name)?, io).await
}

/// Runs a server handshake with `config` over `io`, and returns the
/// established stream. Not bounded in time: the caller's timeout is.
pub async fn accept<IO>(
    config: Arc<ServerConfig>,
    io: IO,
) -> Result<(RecordStream<IO>, Negotiated), HandshakeError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    drive(UnbufferedServerConnection::new(config)?, io).await
}

/// A rustls unbuffered connection of either side, as [`drive`] uses it.
trait Unbuffered: DerefMut<Target = UnbufferedConnectionCommon<Self::Data>> {
    /// The side's data (client or server).
    type Data;

    /// `process_tls_records`, which each side has as its own method.
    fn process<'c, 'i>(
        &'c mut self,
        received: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;

    /// The secrets, and what rustls keeps for key updates and tickets.
    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error>;
}

impl Unbuffered for UnbufferedClientConnection {
    type Data = ClientConnectionData;

    fn process<'c, 'i>(
        &'c mut self,
        received: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ClientConnectionData> {
        self.process_tls_records(received)
    }

    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error> {
        let (secrets, kernel) = self.dangerous_into_kernel_connection()?;
        Ok((secrets, Kernel::Client(kernel)))
    }
}

impl Unbuffered for UnbufferedServerConnection {
    type Data = ServerConnectionData;

    fn process<'c, 'i>(
        &'c mut self,
        received: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, ServerConnectionData> {
        self.process_tls_records(received)
    }

    fn into_kernel(self) -> Result<(ExtractedSecrets, Kernel), rustls::Error> {
        let (secrets, kernel) = self.dangerous_into_kernel_connection()?;
        Ok((secrets, Kernel::Server(kernel)))
    }
}

/// What the driver does after rustls's latest state.
enum Step {
    /// Ask rustls again: it has more to say.
    Again,
    /// Send the records encoded so far.
    Transmit,
    /// Give rustls the next record.
    Receive,
    /// Our side may send application data: done, unless rustls still
    /// waits for the peer (a server before the client's Finished).
    Traffic,
    /// rustls failed the handshake.
    Failed(rustls::Error),
}

/// Runs the handshake of `connection` over `io` and hands the session over
/// to the record layer.
async fn drive<C, IO>(
    mut connection: C,
    mut io: IO,
) -> Result<(RecordStream<IO>, Negotiated), HandshakeError>
where
    C: Unbuffered,
    IO: AsyncRead + AsyncWrite + Unpin,
{
    // Read before the peer is verified: a list installed from here on may
    // have been missed by the verifier, and is checked when the connection
    // is tracked.
    let watch_point = revocation::watch_point();
    // Bytes read: `received[..fed]` is given to rustls, whole records
    // only; the rest is not yet.
    let mut received = Vec::new();
    let mut fed = 0;
    // Records rustls encoded, to send at its next TransmitTlsData.
    let mut outgoing = Vec::new();
    loop {
        let status = connection.process(received.get_mut(..fed).unwrap_or_default());
        let discard = status.discard;
        let step = match status.state {
            Ok(ConnectionState::EncodeTlsData(mut state)) => {
                encode(&mut state, &mut outgoing)?;
                Step::Again
            }
            Ok(ConnectionState::TransmitTlsData(state)) => {
                // Sent right below; a failure there fails the handshake.
                state.done();
                Step::Transmit
            }
            Ok(ConnectionState::BlockedHandshake) => Step::Receive,
            Ok(ConnectionState::WriteTraffic(_)) => Step::Traffic,
            Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => {
                return Err(HandshakeError::Closed);
            }
            Ok(ConnectionState::ReadTraffic(_)) => {
                return Err(HandshakeError::Unexpected("application data"));
            }
            Ok(ConnectionState::ReadEarlyData(_)) => {
                return Err(HandshakeError::Unexpected("early data"));
            }
            Ok(_) => return Err(HandshakeError::Unexpected("an unknown state")),
            Err(error) => Step::Failed(error),
        };
        // rustls is done with the first `discard` bytes it was given.
        fed = fed
            .checked_sub(discard)
            .ok_or(HandshakeError::Unexpected("more bytes than it was given"))?;
        received.drain(..discard);
        match step {
            Step::Again => {}
            Step::Transmit => {
                io.write_all(&outgoing).await?;
                io.flush().await?;
                outgoing.clear();
            }
            Step::Traffic if !connection.is_handshaking() => break,
            Step::Receive | Step::Traffic => feed_record(&mut received, &mut fed, &mut io).await?,
            Step::Failed(error) => {
                let fed_bytes = received.get_mut(..fed).unwrap_or_default();
                send_alert(&mut connection, fed_bytes, &mut io).await;
                return Err(error.into());
            }
        }
    }
    // Whatever rustls encoded after its last transmit (a server's session
    // tickets come after the client's Finished) goes out before the record
    // layer takes over, so the peer never waits for a record we dropped.
    if !outgoing.is_empty() {
        io.write_all(&outgoing).await?;
        io.flush().await?;
    }
    // The handshake's last record ends the handshake's bytes (rustls checks
    // that no message straddles the key change), so rustls holds none.
    if fed != 0 {
        return Err(HandshakeError::Unexpected("bytes kept past the handshake"));
    }
    let negotiated = Negotiated {
        alpn_protocol: connection.alpn_protocol().map(<[u8]>::to_vec),
        peer_identity: peer_identity(&connection),
        peer_chain: watch_point
            .and_then(|generation| PeerChain::capture(connection.peer_certificates(), generation)),
    };
    let (secrets, kernel) = connection.into_kernel()?;
    let stream = RecordStream::new(io, kernel, secrets, &received)?;
    Ok((stream, negotiated))
}

/// Appends the record rustls wants sent to `outgoing`.
fn encode<Data>(
    state: &mut EncodeTlsData<'_, Data>,
    outgoing: &mut Vec<u8>,
) -> Result<(), HandshakeError> {
    // Asked with no room first, rustls says how much it needs.
    let required = match state.encode(&mut []) {
        Ok(_) => return Ok(()),
        Err(EncodeError::InsufficientSize(size)) => size.required_size,
        Err(_) => return Err(HandshakeError::Unexpected("a record encoded twice")),
    };
    let start = outgoing.len();
    outgoing.resize(start + required, 0);
    let written = state
        .encode(outgoing.get_mut(start..).unwrap_or_default())
        .map_err(|_| HandshakeError::Unexpected("more room than it said"))?;
    outgoing.truncate(start + written);
    Ok(())
}

/// Extends `received[..fed]` by the next whole record, reading from `io`
/// until one is there.
async fn feed_record<IO: AsyncRead + Unpin>(
    received: &mut Vec<u8>,
    fed: &mut usize,
    io: &mut IO,
) -> Result<(), HandshakeError> {
    loop {
        if let Some(end) = record_end(received, *fed) {
            *fed = end;
            return Ok(());
        }
        received.reserve(HANDSHAKE_READ);
        if io.read_buf(received).await? == 0 {
            return Err(HandshakeError::Closed);
        }
    }
}

/// The end of the record that starts at `from`, if all of it is in
/// `received`. Its header is rustls's to check.
fn record_end(received: &[u8], from: usize) -> Option<usize> {
    let &[_, _, _, len_high, len_low] = received.get(from..from + HEADER_LEN)? else {
        return None;
    };
    let end = from + HEADER_LEN + usize::from(u16::from_be_bytes([len_high, len_low]));
    (end <= received.len()).then_some(end)
}

/// Sends the alert rustls queued when it failed the handshake, if it can:
/// the peer then learns why. `received` is what rustls was last given,
/// less what it discarded.
async fn send_alert<C, IO>(connection: &mut C, received: &mut [u8], io: &mut IO)
where
    C: Unbuffered,
    IO: AsyncWrite + Unpin,
{
    let mut alert = Vec::new();
    loop {
        let status = connection.process(&mut *received);
        let consumed = status.discard != 0;
        let encoded = match status.state {
            Ok(ConnectionState::EncodeTlsData(mut state)) => encode(&mut state, &mut alert).is_ok(),
            _ => false,
        };
        // Having taken bytes, rustls must not see them again: stop.
        if !encoded || consumed {
            break;
        }
    }
    if !alert.is_empty() {
        // The handshake's error is what counts, not this one's.
        let _ = io.write_all(&alert).await;
        let _ = io.flush().await;
    }
}
