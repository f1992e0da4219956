//! The proxy of the outbound path's socket tests (`tests/hostname.rs`,
//! `tests/revocation.rs`, `tunnel/tests.rs`): dedicated mode for one
//! workload of `default`, its certificates from the test's source; each
//! test varies only what this takes.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus_client::registry::Registry;
use ztunnel_certs::cert::WorkloadCertificate;
use ztunnel_certs::csr::CertRequest;
use ztunnel_certs::identity::Identity;
use ztunnel_certs::issuer::{Issuer, SigningRequest};

use crate::capacity::Capacity;
use crate::config::{Config, WorkloadInfo};
use crate::context::{LocalPods, NodeRuntime, Proxy};
use crate::drain::{self, DrainTrigger};
use crate::hbone::H2Settings;
use crate::identity::manager::{CertificateSource, IdentityManager};
use crate::metrics::Metrics;
use crate::pool::PoolConfig;
use crate::resolve::Resolver;
use crate::socket::LocalSockets;
use crate::state::{SharedState, State};

/// What a test's proxy differs by.
pub(crate) struct TestProxy<'a> {
    /// The workload's name, in `default`.
    pub name: &'a str,
    /// Its service account.
    pub service_account: &'a str,
    /// Arguments after the mode and the workload.
    pub args: &'a [&'a str],
    /// The pool's limits.
    pub pool: PoolConfig,
    /// Where hostname endpoints are looked up.
    pub resolver: Resolver,
    /// The pods of the node, for the same-node path; `None` turns it off.
    pub local_pods: Option<Arc<LocalPods<Proxy>>>,
}

impl TestProxy<'_> {
    /// The proxy over `state`, certificates from `source`, and the
    /// registry of its metrics; it drains when the trigger is dropped.
    pub(crate) fn build(
        self,
        source: impl CertificateSource,
        state: State,
    ) -> (Proxy, Registry, DrainTrigger) {
        let workload = format!("default/{}/{}", self.name, self.service_account);
        let args = [
            "ztunnel",
            "--proxy-mode",
            "dedicated",
            "--proxy-workload-info",
            &workload,
        ]
        .into_iter()
        .chain(self.args.iter().copied());
        let config = Config::from_args(args).unwrap();
        let (identities, manager) = IdentityManager::new(source, std::future::pending());
        tokio::spawn(manager);
        let (trigger, drain) = drain::channel();
        let mut registry = Registry::default();
        let node = NodeRuntime {
            config: Arc::new(config),
            state: SharedState::new(state),
            identities,
            metrics: Arc::new(Metrics::register(&mut registry, "test")),
            resolver: self.resolver,
            capacity: Arc::new(Capacity::new(64, 1)),
            dns: None,
            h2: H2Settings::default(),
            pool: self.pool,
            local_pods: self.local_pods,
            demand: None,
        };
        let workload = WorkloadInfo {
            namespace: "default".into(),
            name: self.name.into(),
            service_account: self.service_account.into(),
        };
        let sockets = Arc::new(LocalSockets::default());
        let proxy = Proxy::new(Arc::new(node), workload, sockets, drain);
        (proxy, registry, trigger)
    }
}

/// A certificate for `identity` signed by `issuer` for an hour, with a
/// fresh key, as the CA would answer the proxy.
pub(crate) fn issue(issuer: &Issuer, identity: &Identity) -> WorkloadCertificate {
    let request = CertRequest::generate(identity).unwrap();
    let signing = SigningRequest::from_pem(request.csr_pem()).unwrap();
    let ttl = Duration::from_secs(3600);
    let chain = issuer
        .sign_workload(&signing, identity, ttl, SystemTime::now())
        .unwrap();
    WorkloadCertificate::from_ca_response(&chain, request.private_key(), Some(identity)).unwrap()
}
