//! The plugin-event server: HTTP/1.1 on a unix stream socket (WIRE.md §6).
//!
//! | Request | Answer |
//! |---|---|
//! | `POST /cmdadd` | 200 added; 400 empty or unparsable body; 500 with the error text |
//! | `POST /cmddel` | 200 removed or unknown; 400 as above; 500 with the error text |
//! | `GET /pods/<ns>/<name>` | 200 with the pod's record as JSON; 404 when not in the mesh |
//!
//! Routing is the pure `route`; what a failure means on the wire is
//! decided here and only here. The decisions themselves are the mesh's.
//! Adds and deletes run on tasks of their own, so a plugin that hangs up
//! (or a server that stops) never cuts one off half-way. A connection from
//! a process the peer policy does not admit is closed unanswered.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use ztunnel_certs::error_chain::ErrorChain;

use crate::event::{CMD_ADD_PATH, CMD_DEL_PATH, CmdAdd, CmdDel, PODS_PATH};
use crate::plugin::client::AGENT_TIMEOUT;

use super::http_server::{self, Limits};
use super::mesh::{Mesh, MeshError};
use super::peer::PeerPolicy;
use super::socket_file::SocketFile;

/// Largest request body read: an add event is well under a kilobyte.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// How long before the plugin stops waiting the agent answers: time for
/// the answer to reach it, so the plugin hears the agent's answer (and its
/// reason) rather than its own timeout.
const ANSWER_MARGIN: Duration = Duration::from_millis(500);
/// How long after an add arrives the agent answers at the latest, for a
/// plugin that sends no deadline: as if it had sent one the moment it
/// arrived.
const ADD_ANSWER_WITHIN: Duration = AGENT_TIMEOUT.saturating_sub(ANSWER_MARGIN);

/// The plugin-event socket; its path is removed on drop while it is still
/// this socket's.
#[derive(Debug)]
pub struct PluginListener {
    listener: UnixListener,
    /// Who may post events.
    peers: PeerPolicy,
    /// Removes the path on drop, unless another agent has bound it since.
    _file: SocketFile,
}

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `POST /cmdadd`.
    Add,
    /// `POST /cmddel`.
    Del,
    /// `GET /pods/<namespace>/<name>`.
    Pod {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        name: String,
    },
    /// A known path with the wrong method.
    MethodNotAllowed,
    /// Anything else.
    NotFound,
}

/// Maps a method and path to a route.
pub fn route(method: &Method, path: &str) -> Route {
    let (wanted, route) = match path {
        CMD_ADD_PATH => (Method::POST, Route::Add),
        CMD_DEL_PATH => (Method::POST, Route::Del),
        _ => match path
            .strip_prefix(PODS_PATH)
            .and_then(|rest| rest.split_once('/'))
        {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                (
                    Method::GET,
                    Route::Pod {
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                    },
                )
            }
            _ => return Route::NotFound,
        },
    };
    if *method == wanted {
        route
    } else {
        Route::MethodNotAllowed
    }
}

/// Binds the socket at `path` (mode 0600, replacing a stale one, creating
/// the directory first), to serve the peers `peers` admits. Must be called
/// inside a tokio runtime.
pub fn bind(path: &Path, peers: PeerPolicy) -> std::io::Result<PluginListener> {
    let (listener, file) = SocketFile::bind(path, |staged| {
        let listener = std::os::unix::net::UnixListener::bind(staged)?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    })?;
    Ok(PluginListener {
        listener: UnixListener::from_std(listener)?,
        peers,
        _file: file,
    })
}

impl PluginListener {
    /// The next connection from an admitted peer; others are closed as
    /// they come. Cancel safe: between accepts no connection is held.
    async fn accept(&self) -> std::io::Result<tokio::net::UnixStream> {
        loop {
            let (stream, _) = self.listener.accept().await?;
            match self.peers.check(&stream) {
                Ok(_) => return Ok(stream),
                Err(refused) => {
                    tracing::warn!(error = %ErrorChain(&refused), "closed a plugin-event connection")
                }
            }
        }
    }
}

impl http_server::Accept for PluginListener {
    type Stream = tokio::net::UnixStream;
    async fn accept(&self) -> std::io::Result<Self::Stream> {
        PluginListener::accept(self).await
    }
}

/// Serves plugin events until `shutdown`; open connections are then
/// closed, and the adds and deletes already started are waited for.
pub async fn serve(listener: PluginListener, mesh: Arc<Mesh>, shutdown: watch::Receiver<bool>) {
    // Each started operation holds a clone of `in_flight`; `all_finished`
    // yields `None` once every clone is gone.
    let (in_flight, mut all_finished) = mpsc::channel::<()>(1);
    let service = {
        let in_flight = in_flight.clone();
        service_fn(move |request| {
            let (mesh, in_flight) = (Arc::clone(&mesh), in_flight.clone());
            async move { Ok::<_, Infallible>(handle(mesh, in_flight, request).await) }
        })
    };
    http_server::serve(listener, "plugin event", Limits::DEFAULT, service, shutdown).await;
    drop(in_flight);
    let _ = all_finished.recv().await;
}

async fn handle(
    mesh: Arc<Mesh>,
    in_flight: mpsc::Sender<()>,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    match route(request.method(), request.uri().path()) {
        Route::Add => match read_json::<CmdAdd>(request).await {
            Ok(event) => {
                let deadline = add_deadline(event.deadline, Instant::now(), SystemTime::now());
                outcome(
                    run_detached(in_flight, async move { mesh.add(event, deadline).await }).await,
                )
            }
            Err(response) => response,
        },
        Route::Del => match read_json::<CmdDel>(request).await {
            Ok(event) => {
                outcome(run_detached(in_flight, async move { mesh.del(event).await }).await)
            }
            Err(response) => response,
        },
        Route::Pod { namespace, name } => match mesh.pod(&namespace, &name) {
            Some(pod) => match serde_json::to_vec(&pod) {
                Ok(json) => reply(StatusCode::OK, json, "application/json"),
                Err(error) => text(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
            },
            None => text(
                StatusCode::NOT_FOUND,
                format!("pod {namespace}/{name} is not in the mesh"),
            ),
        },
        Route::MethodNotAllowed => {
            text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed".into())
        }
        Route::NotFound => text(StatusCode::NOT_FOUND, "not found".into()),
    }
}

/// When the agent must have answered an add that arrives at `now` (`wall`
/// on the wall clock, which the plugin's `plugin_deadline` is read
/// against): [`ANSWER_MARGIN`] before the plugin stops waiting, and never
/// later than [`ADD_ANSWER_WITHIN`] after arrival. It is in the past when
/// the add arrived too late, e.g. queued while the agent was stopped; the
/// mesh then refuses it before doing anything.
fn add_deadline(plugin_deadline: Option<SystemTime>, now: Instant, wall: SystemTime) -> Instant {
    let latest = now + ADD_ANSWER_WITHIN;
    let Some(plugin_deadline) = plugin_deadline else {
        return latest;
    };
    let answer_by = plugin_deadline
        .checked_sub(ANSWER_MARGIN)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let deadline = match answer_by.duration_since(wall) {
        Ok(left) => now + left,
        Err(late) => now.checked_sub(late.duration()).unwrap_or(now),
    };
    deadline.min(latest)
}

/// Runs an add or delete on a task of its own and waits for it. If this
/// handler is dropped (the plugin hung up, or the server is stopping), the
/// operation still runs to its end; `in_flight` lets shutdown wait for it.
async fn run_detached(
    in_flight: mpsc::Sender<()>,
    operation: impl Future<Output = Result<(), MeshError>> + Send + 'static,
) -> Result<(), MeshError> {
    tokio::spawn(async move {
        let result = operation.await;
        drop(in_flight);
        result
    })
    .await
    .unwrap_or(Err(MeshError::TaskFailed))
}

/// Reads a bounded JSON body; the error is the response to send.
async fn read_json<T: serde::de::DeserializeOwned>(
    request: Request<Incoming>,
) -> Result<T, Response<Full<Bytes>>> {
    let body = Limited::new(request.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(|error| {
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading the body: {}", ErrorChain(&*error)),
            )
        })?
        .to_bytes();
    decode_event(&body)
        .map_err(|error| text(StatusCode::BAD_REQUEST, ErrorChain(&error).to_string()))
}

/// Why a body is not an event; answered 400.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Nothing was sent.
    #[error("empty body")]
    Empty,
    /// The body is not the event's JSON.
    #[error("bad event JSON")]
    Json(#[source] serde_json::Error),
}

/// Decodes an event from a whole body.
pub fn decode_event<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, BodyError> {
    if body.is_empty() {
        return Err(BodyError::Empty);
    }
    serde_json::from_slice(body).map_err(BodyError::Json)
}

/// The one mapping from an add or delete outcome to the wire.
fn outcome<E: std::error::Error>(result: Result<(), E>) -> Response<Full<Bytes>> {
    match result {
        Ok(()) => text(StatusCode::OK, String::new()),
        Err(error) => {
            let error = ErrorChain(&error).to_string();
            tracing::warn!(%error, "plugin event failed");
            text(StatusCode::INTERNAL_SERVER_ERROR, error)
        }
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    reply(status, body.into_bytes(), "text/plain; charset=utf-8")
}

fn reply(status: StatusCode, body: Vec<u8>, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let pod = |namespace: &str, name: &str| Route::Pod {
            namespace: namespace.into(),
            name: name.into(),
        };
        let cases = [
            (Method::POST, "/cmdadd", Route::Add),
            (Method::POST, "/cmddel", Route::Del),
            (Method::GET, "/cmdadd", Route::MethodNotAllowed),
            (Method::GET, "/pods/shop/web-0", pod("shop", "web-0")),
            (Method::POST, "/pods/shop/web-0", Route::MethodNotAllowed),
            (Method::GET, "/pods/shop/", Route::NotFound),
            (Method::GET, "/pods//web-0", Route::NotFound),
            (Method::GET, "/pods/shop/web-0/x", Route::NotFound),
            (Method::GET, "/pods/shop", Route::NotFound),
            (Method::GET, "/", Route::NotFound),
        ];
        for (method, path, want) in cases {
            assert_eq!(route(&method, path), want, "{method} {path}");
        }
    }

    #[test]
    fn an_add_is_answered_before_the_plugin_stops_waiting() {
        let now = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        // (reason, plugin deadline after `wall` (+) or before it (-), the
        // agent's deadline after `now` (+) or before it (-))
        #[rustfmt::skip]
        let cases: [(&str, Option<i64>, i64); 7] = [
            ("a plugin that sends no deadline", None, 4_500),
            ("a plugin that has just sent it", Some(5_000), 4_500),
            ("an add that waited a second", Some(4_000), 3_500),
            ("a deadline further off than the plugin's timeout", Some(60_000), 4_500),
            ("too close to answer in time", Some(300), -200),
            ("at the plugin's deadline", Some(0), -500),
            ("queued while the agent was stopped", Some(-7_000), -7_500),
        ];
        for (reason, plugin, want) in cases {
            let plugin_deadline = plugin.map(|millis| shifted(wall, millis));
            assert_eq!(
                add_deadline(plugin_deadline, now, wall),
                shifted(now, want),
                "{reason}"
            );
        }
    }

    /// `base` moved by `millis`, forward or back.
    fn shifted<T>(base: T, millis: i64) -> T
    where
        T: std::ops::Add<Duration, Output = T> + std::ops::Sub<Duration, Output = T>,
    {
        let by = Duration::from_millis(millis.unsigned_abs());
        if millis >= 0 { base + by } else { base - by }
    }

    #[test]
    fn a_body_that_is_not_an_event_says_why() {
        assert!(matches!(decode_event::<CmdDel>(b""), Err(BodyError::Empty)));
        let error = decode_event::<CmdDel>(br#"{"PodName":"web-0"}"#).unwrap_err();
        let text = ErrorChain(&error).to_string();
        assert!(
            text.starts_with("bad event JSON: missing field `PodNamespace`"),
            "{text}"
        );
        let event: CmdDel = decode_event(br#"{"PodName":"web-0","PodNamespace":"shop"}"#).unwrap();
        assert_eq!(
            (event.pod_name.as_str(), event.netns.as_str()),
            ("web-0", "")
        );
    }
}
