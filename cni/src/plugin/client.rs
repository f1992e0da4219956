//! The plugin's side of the plugin-event exchange: one HTTP/1.1 request to
//! the node agent over its unix stream socket, bounded by a 5 s timeout
//! (WIRE.md §6). The agent's side is `agent/server.rs`.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use ztunnel_certs::error_chain::ErrorChain;

/// The whole exchange (connect, request, response) must finish in this time,
/// as istio-cni's client does; the runtime's own CNI timeout is longer.
pub const AGENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest response body read: the agent answers with an error line or one
/// pod's record.
const MAX_REPLY_BYTES: usize = 64 * 1024;

/// A client of one agent socket.
#[derive(Debug, Clone)]
pub struct AgentClient {
    /// The agent's plugin-event socket.
    socket: PathBuf,
}

/// The agent's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status; only 200 means success.
    pub status: StatusCode,
    /// The body, as text (the agent's error text on failure).
    pub body: String,
}

impl AgentClient {
    /// A client of the agent listening on `socket`.
    pub fn new(socket: PathBuf) -> AgentClient {
        AgentClient { socket }
    }

    /// `POST path` with a JSON body.
    pub async fn post_json<T: serde::Serialize>(
        &self,
        path: &str,
        body: &T,
    ) -> Result<Reply, ClientError> {
        let body = serde_json::to_vec(body).map_err(ClientError::Encode)?;
        let request = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(header::HOST, "unix")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(ClientError::Request)?;
        self.exchange(request).await
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<Reply, ClientError> {
        let request = Request::builder()
            .method(Method::GET)
            .uri(path)
            .header(header::HOST, "unix")
            .body(Full::new(Bytes::new()))
            .map_err(ClientError::Request)?;
        self.exchange(request).await
    }

    async fn exchange(&self, request: Request<Full<Bytes>>) -> Result<Reply, ClientError> {
        let exchange = async {
            let stream =
                UnixStream::connect(&self.socket)
                    .await
                    .map_err(|source| ClientError::Connect {
                        socket: self.socket.clone(),
                        source,
                    })?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(ClientError::Http)?;
            // The connection future drives the socket; it ends with the
            // exchange, when `sender` is dropped.
            let driver = tokio::spawn(connection);
            let response = sender
                .send_request(request)
                .await
                .map_err(ClientError::Http)?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_REPLY_BYTES)
                .collect()
                .await
                .map_err(|error| ClientError::Body(ErrorChain(&*error).to_string()))?
                .to_bytes();
            drop(sender);
            driver.abort();
            Ok(Reply {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            })
        };
        tokio::time::timeout(AGENT_TIMEOUT, exchange)
            .await
            .map_err(|_| ClientError::Timeout)?
    }
}

/// Why the agent could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket, or it cannot be reached.
    #[error("cannot reach the node agent at {socket}")]
    Connect {
        /// The agent's socket.
        socket: PathBuf,
        /// The connect error.
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("node agent HTTP exchange failed")]
    Http(#[source] hyper::Error),
    /// The response body could not be read.
    #[error("reading the node agent's reply: {0}")]
    Body(String),
    /// No complete answer within [`AGENT_TIMEOUT`].
    #[error("the node agent did not answer within {AGENT_TIMEOUT:?}")]
    Timeout,
    /// The request body could not be encoded.
    #[error("encoding the request: {0}")]
    Encode(serde_json::Error),
    /// The request could not be built.
    #[error("building the request: {0}")]
    Request(http::Error),
}
