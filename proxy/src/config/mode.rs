//! Shared or dedicated: how the proxy captures traffic, the workload a
//! dedicated proxy serves, and the default SO_MARK that follows from the
//! mode. What each mode starts is `app/shared.rs`'s and `app/dedicated.rs`'s
//! business.

use super::{ConfigError, ValueError, WorkloadInfo};

/// The default SO_MARK in shared mode; istio-cni's rules hard-code 0x539.
const SHARED_MODE_PACKET_MARK: u32 = 1337;

/// How the proxy captures traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyMode {
    /// One proxy per node, opening listeners inside each pod's network
    /// namespace handed over by the node agent (ZDS).
    Shared,
    /// One proxy for one workload, with ordinary sockets in the current
    /// network namespace.
    Dedicated(WorkloadInfo),
}

impl ProxyMode {
    /// The SO_MARK of the proxy's own sockets: `PACKET_MARK` when set, else
    /// the mark istio-cni's rules skip in shared mode and none in dedicated
    /// mode.
    pub(super) fn packet_mark(&self, set: Option<u32>) -> Option<u32> {
        match (self, set) {
            (_, Some(mark)) => Some(mark),
            (ProxyMode::Shared, None) => Some(SHARED_MODE_PACKET_MARK),
            (ProxyMode::Dedicated(_), None) => None,
        }
    }
}

/// The flags and variables, flattened into the command line.
#[derive(Debug, clap::Args)]
pub(super) struct ModeArgs {
    /// `shared` (in-pod, one proxy per node) or `dedicated` (one workload).
    #[arg(long, env = "PROXY_MODE", default_value = "shared")]
    proxy_mode: String,
    /// The dedicated workload, `namespace/name/service-account`.
    #[arg(long, env = "PROXY_WORKLOAD_INFO")]
    proxy_workload_info: Option<String>,
    /// This pod's service account: with `POD_NAME` and `POD_NAMESPACE`,
    /// ztunnel's own workload, served on its own HBONE listener in shared
    /// mode.
    #[arg(long, env = "SERVICE_ACCOUNT")]
    service_account: Option<String>,
}

impl ModeArgs {
    /// The mode; dedicated mode needs its workload.
    pub(super) fn parse(&self) -> Result<ProxyMode, ConfigError> {
        match self.proxy_mode.as_str() {
            "shared" => Ok(ProxyMode::Shared),
            "dedicated" => {
                let info = self
                    .proxy_workload_info
                    .as_deref()
                    .ok_or(ValueError::Missing)
                    .and_then(str::parse)
                    .map_err(ConfigError::value("PROXY_WORKLOAD_INFO"))?;
                Ok(ProxyMode::Dedicated(info))
            }
            other => Err(ConfigError::Value {
                name: "PROXY_MODE",
                source: ValueError::Choice(other.to_owned(), "shared, dedicated"),
            }),
        }
    }

    /// ztunnel's own workload in shared mode, when its pod's namespace,
    /// name and service account are all given (Istio's chart passes them
    /// from the Downward API), as istio/ztunnel reads them: it then serves
    /// HBONE as itself, so that a meshed client (a Prometheus scraping
    /// 15020) reaches it with mTLS and its policies. Otherwise none.
    pub(super) fn own_workload(
        &self,
        mode: &ProxyMode,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Option<WorkloadInfo> {
        if *mode != ProxyMode::Shared {
            return None;
        }
        let parts = [namespace?, name?, self.service_account.as_deref()?];
        if parts.iter().any(|part| part.is_empty()) {
            return None;
        }
        let [namespace, name, service_account] = parts;
        Some(WorkloadInfo {
            namespace: namespace.into(),
            name: name.into(),
            service_account: service_account.into(),
        })
    }
}
