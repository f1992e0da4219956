//! Readiness: the proxy is ready once every start-up task (listeners bound,
//! certificates of local workloads fetched, first config loaded) has
//! released its [`BlockReady`]; `GET /healthz/ready` on 15021 says so.
//!
//! Register every task before the server starts: with nothing registered
//! the proxy reads as ready.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;

use crate::admin::{self, Body};
use crate::drain::DrainWatcher;

/// The tasks still to finish before the proxy is ready. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Ready {
    pending: Arc<Mutex<Pending>>,
}

#[derive(Debug, Default)]
struct Pending {
    next_id: u64,
    /// Keyed by a registration id, so two tasks may share a name.
    tasks: BTreeMap<u64, Arc<str>>,
}

/// Held by a start-up task until it is done; dropping it releases it.
#[derive(Debug)]
#[must_use = "the task counts as done as soon as this guard is dropped"]
pub struct BlockReady {
    ready: Ready,
    id: u64,
}

impl Ready {
    /// No task registered yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a task the proxy waits for; `name` is what the not-ready
    /// answer shows.
    pub fn register_task(&self, name: &str) -> BlockReady {
        let mut pending = self.lock();
        let id = pending.next_id;
        pending.next_id += 1;
        pending.tasks.insert(id, Arc::from(name));
        BlockReady {
            ready: self.clone(),
            id,
        }
    }

    /// Names of the tasks still pending, in registration order.
    pub fn pending(&self) -> Vec<Arc<str>> {
        self.lock().tasks.values().cloned().collect()
    }

    /// Whether every registered task is done.
    pub fn is_ready(&self) -> bool {
        self.lock().tasks.is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        // The map stays consistent under a panic (one insert or remove),
        // so a poisoned lock is still safe to use.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The readiness endpoint's answer.
    fn respond(&self, request: &Request<hyper::body::Incoming>) -> Response<Body> {
        if request.uri().path() != "/healthz/ready" {
            return admin::text(StatusCode::NOT_FOUND, "not found\n".to_owned());
        }
        if request.method() != Method::GET {
            return admin::text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n".to_owned());
        }
        let pending = self.pending();
        if pending.is_empty() {
            return admin::text(StatusCode::OK, "ready\n".to_owned());
        }
        // As istio/ztunnel answers (AMBIENT.md §6.1): 500, and each
        // pending name once, sorted.
        let names: std::collections::BTreeSet<&str> = pending.iter().map(AsRef::as_ref).collect();
        let names: Vec<&str> = names.into_iter().collect();
        admin::text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("not ready, pending: {}\n", names.join(", ")),
        )
    }
}

impl Drop for BlockReady {
    fn drop(&mut self) {
        let name = self.ready.lock().tasks.remove(&self.id);
        if let Some(name) = name {
            tracing::debug!(task = %name, "start-up task done");
        }
    }
}

/// Serves `GET /healthz/ready` on `listener` until `drain` signals.
pub async fn serve(listener: TcpListener, ready: Ready, drain: DrainWatcher) {
    admin::serve_http(listener, drain, move |request| {
        std::future::ready(ready.respond(&request))
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_once_every_guard_is_dropped() {
        let ready = Ready::new();
        assert!(ready.is_ready());
        let listeners = ready.register_task("listeners");
        let certificates = ready.register_task("certificates");
        let again = ready.register_task("certificates");
        assert_eq!(
            ready.pending(),
            vec![
                Arc::from("listeners"),
                Arc::from("certificates"),
                Arc::from("certificates")
            ]
        );
        drop(certificates);
        drop(listeners);
        assert!(!ready.is_ready());
        assert_eq!(ready.pending(), vec![Arc::from("certificates")]);
        drop(again);
        assert!(ready.is_ready());
    }
}
