//! The agent's health endpoint (KUBERNETES.md B6): plain HTTP/1.1 on TCP,
//! for the kubelet's probes.
//!
//! | Request | Answer |
//! |---|---|
//! | `GET /readyz` | 200 when ready; 503 with a one-line reason otherwise |
//! | `GET /healthz` | 200 while the agent runs |
//!
//! Ready means: the plugin is installed (when the agent installs it), both
//! sockets are bound, and the pod source has listed once. The decision is
//! the pure [`decide`]; the installation's own state is `install.rs`'s.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::http_server::{self, Limits};
use super::install::InstallState;
use super::kube::PodWatch;

/// istio-cni's readiness address.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:8000";
/// The readiness path.
pub const READY_PATH: &str = "/readyz";
/// The liveness path.
pub const HEALTH_PATH: &str = "/healthz";

/// What the readiness endpoint reads. Cheap to share; the agent marks it
/// serving once both sockets are bound.
#[derive(Default)]
pub struct Readiness {
    /// The installation's state, when the agent installs the plugin.
    install: Option<InstallState>,
    /// Set once both sockets are bound; holds the Kubernetes watch, whose
    /// first listing readiness also waits for (`None` with the registry
    /// file, which is read at start).
    serving: OnceLock<Option<Arc<PodWatch>>>,
}

impl Readiness {
    /// Readiness that also waits for `install`, when given.
    pub fn new(install: Option<InstallState>) -> Readiness {
        Readiness {
            install,
            serving: OnceLock::new(),
        }
    }

    /// Both sockets are bound; `pods` is the Kubernetes watch, if that is
    /// the source.
    pub fn serving(&self, pods: Option<Arc<PodWatch>>) {
        let _ = self.serving.set(pods);
    }

    /// Whether the agent is ready now, and if not, why.
    pub fn check(&self) -> Result<(), NotReady> {
        decide(
            self.install.as_ref().map(InstallState::is_ready),
            self.serving.get().is_some(),
            self.serving
                .get()
                .and_then(Option::as_ref)
                .is_none_or(|watch| watch.ready()),
        )
    }
}

/// Why the agent is not ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// The plugin binary or its configuration entry is not in place.
    #[error("the CNI plugin is not installed")]
    Install,
    /// The plugin-event and ZDS sockets are not bound yet.
    #[error("the agent's sockets are not bound yet")]
    Sockets,
    /// The Kubernetes watches have not listed yet.
    #[error("the pod and namespace watches have not listed yet")]
    Pods,
}

/// Readiness from its parts: `install` is `None` when the agent does not
/// install the plugin. The first missing part is the reason given.
pub fn decide(install: Option<bool>, sockets: bool, pods: bool) -> Result<(), NotReady> {
    if install == Some(false) {
        Err(NotReady::Install)
    } else if !sockets {
        Err(NotReady::Sockets)
    } else if !pods {
        Err(NotReady::Pods)
    } else {
        Ok(())
    }
}

/// Answers probes until `shutdown`; open connections are then closed.
/// Connections are bounded as the agent's other server's are
/// ([`Limits::DEFAULT`]): the port is on the host's network.
pub async fn serve(
    listener: TcpListener,
    readiness: Arc<Readiness>,
    shutdown: watch::Receiver<bool>,
) {
    let service = service_fn(move |request: Request<Incoming>| {
        let response = answer(&readiness, request.method(), request.uri().path());
        async move { Ok::<_, Infallible>(response) }
    });
    http_server::serve(listener, "health probe", Limits::DEFAULT, service, shutdown).await;
}

/// The answer to one request.
fn answer(readiness: &Readiness, method: &Method, path: &str) -> Response<Full<Bytes>> {
    let (status, body) = match (path, *method == Method::GET) {
        (READY_PATH, true) => match readiness.check() {
            Ok(()) => (StatusCode::OK, "ready".to_owned()),
            Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason.to_string()),
        },
        (HEALTH_PATH, true) => (StatusCode::OK, "ok".to_owned()),
        (READY_PATH | HEALTH_PATH, false) => (
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed".to_owned(),
        ),
        _ => (StatusCode::NOT_FOUND, "not found".to_owned()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body + "\n")));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_every_part_and_names_the_first_missing() {
        // (reason, install ready, sockets bound, watches listed, readiness)
        type Case = (&'static str, Option<bool>, bool, bool, Result<(), NotReady>);
        #[rustfmt::skip]
        let cases: &[Case] = &[
            ("everything in place", Some(true), true, true, Ok(())),
            ("not installing, agent ready", None, true, true, Ok(())),
            ("entry missing", Some(false), true, true, Err(NotReady::Install)),
            ("entry missing before the sockets", Some(false), false, false, Err(NotReady::Install)),
            ("sockets not bound", Some(true), false, true, Err(NotReady::Sockets)),
            ("watches not listed", None, true, false, Err(NotReady::Pods)),
        ];
        for (reason, install, sockets, pods, expected) in cases {
            assert_eq!(decide(*install, *sockets, *pods), *expected, "{reason}");
        }
    }

    #[test]
    fn probes_are_answered_by_path_and_method() {
        let readiness = Readiness::new(None);
        let status = |method: Method, path: &str| answer(&readiness, &method, path).status();
        assert_eq!(
            status(Method::GET, READY_PATH),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(status(Method::GET, HEALTH_PATH), StatusCode::OK);
        readiness.serving(None);
        assert_eq!(status(Method::GET, READY_PATH), StatusCode::OK);
        assert_eq!(
            status(Method::POST, READY_PATH),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(status(Method::GET, "/metrics"), StatusCode::NOT_FOUND);
    }
}
