//! Istio's proxy config, as istio/ztunnel reads it: the mesh config file's
//! `defaultConfig` (`./etc/istio/config/mesh`, the `istio` ConfigMap's
//! `mesh` key where Istio's chart mounts it) under `PROXY_CONFIG` (YAML or
//! JSON), field by field; their `proxyMetadata` merged with the
//! `ISTIO_META_*` variables over both, each key without its `ISTIO_META_`
//! prefix. What each field sets is the other groups' business: the xDS
//! address (`discoveryAddress`), the admin and stats ports, the worker
//! count (`concurrency`), and the DNS proxy (`DNS_CAPTURE`,
//! `DNS_PROXY_ADDR` in the metadata).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{ConfigError, ValueError};

/// Where Istio's chart mounts the mesh config, from the working directory
/// `/` the image runs in.
const MESH_CONFIG_FILE: &str = "./etc/istio/config/mesh";

/// The metadata prefix the keys of `proxyMetadata` and the variables lose.
const META_PREFIX: &str = "ISTIO_META_";

/// The fields of Istio's `ProxyConfig` ztunnel uses; the others are
/// ignored, as istio/ztunnel ignores them.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProxyConfigForm {
    discovery_address: Option<String>,
    proxy_admin_port: Option<u16>,
    stats_port: Option<u16>,
    concurrency: Option<u16>,
    #[serde(default)]
    proxy_metadata: BTreeMap<String, String>,
}

impl ProxyConfigForm {
    /// `self` with each field `over` sets replacing it, the metadata merged
    /// key by key.
    fn under(mut self, over: ProxyConfigForm) -> ProxyConfigForm {
        self.discovery_address = over.discovery_address.or(self.discovery_address);
        self.proxy_admin_port = over.proxy_admin_port.or(self.proxy_admin_port);
        self.stats_port = over.stats_port.or(self.stats_port);
        self.concurrency = over.concurrency.or(self.concurrency);
        self.proxy_metadata.extend(over.proxy_metadata);
        self
    }
}

/// The mesh config: its `defaultConfig` only.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MeshConfigForm {
    default_config: Option<ProxyConfigForm>,
}

/// The proxy config in force.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ProxyConfig {
    /// The xDS server when `XDS_ADDRESS` is unset.
    pub discovery_address: Option<String>,
    /// The admin port when `ZTUNNEL_ADMIN_ADDR` is unset.
    pub proxy_admin_port: Option<u16>,
    /// The stats port when `ZTUNNEL_STATS_ADDR` is unset.
    pub stats_port: Option<u16>,
    /// The worker count when `ZTUNNEL_WORKER_THREADS` is unset (0: one per
    /// core).
    pub concurrency: Option<u16>,
    /// The proxy metadata, keys without `ISTIO_META_`.
    pub metadata: BTreeMap<String, String>,
}

/// The flags and variables, flattened into the command line.
#[derive(Debug, clap::Args)]
pub(super) struct ProxyConfigArgs {
    /// Istio's ProxyConfig, YAML or JSON, over the mesh config's
    /// defaultConfig field by field.
    #[arg(long, env = "PROXY_CONFIG")]
    proxy_config: Option<String>,
    /// Istio's mesh config file, whose defaultConfig is read; a missing
    /// file is none.
    #[arg(long, default_value = MESH_CONFIG_FILE)]
    mesh_config: PathBuf,
}

impl ProxyConfigArgs {
    /// The proxy config: the mesh config file's, `PROXY_CONFIG` over it,
    /// the `ISTIO_META_*` variables of `env` over their metadata.
    pub(super) fn parse(&self, env: &[(String, String)]) -> Result<ProxyConfig, ConfigError> {
        let mesh = mesh_default_config(&self.mesh_config)?;
        let given = match self.proxy_config.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(text) => Some(parse_form(text).map_err(|reason| ConfigError::Value {
                name: "PROXY_CONFIG",
                source: ValueError::Document(
                    "not Istio's ProxyConfig as YAML or JSON".to_owned(),
                    reason,
                ),
            })?),
        };
        let form = [mesh, given]
            .into_iter()
            .flatten()
            .fold(ProxyConfigForm::default(), ProxyConfigForm::under);
        let mut metadata: BTreeMap<String, String> = form
            .proxy_metadata
            .into_iter()
            .map(|(key, value)| (unprefixed(key), value))
            .collect();
        metadata.extend(
            env.iter()
                .filter(|(key, _)| key.starts_with(META_PREFIX))
                .map(|(key, value)| (unprefixed(key.clone()), value.clone())),
        );
        Ok(ProxyConfig {
            discovery_address: form.discovery_address.filter(|address| !address.is_empty()),
            proxy_admin_port: form.proxy_admin_port,
            stats_port: form.stats_port,
            concurrency: form.concurrency,
            metadata,
        })
    }
}

/// `key` without `ISTIO_META_`.
fn unprefixed(key: String) -> String {
    match key.strip_prefix(META_PREFIX) {
        Some(rest) => rest.to_owned(),
        None => key,
    }
}

fn parse_form(text: &str) -> Result<ProxyConfigForm, String> {
    serde_yaml_ng::from_str(text).map_err(|error| error.to_string())
}

/// The `defaultConfig` of the mesh config file at `path`; `None` when the
/// file or the field is missing.
fn mesh_default_config(path: &Path) -> Result<Option<ProxyConfigForm>, ConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(ConfigError::Value {
                name: "--mesh-config",
                source: ValueError::Document(path.display().to_string(), error.to_string()),
            });
        }
    };
    if text.trim().is_empty() {
        return Ok(None);
    }
    serde_yaml_ng::from_str::<MeshConfigForm>(&text)
        .map(|mesh| mesh.default_config)
        .map_err(|error| ConfigError::Value {
            name: "--mesh-config",
            source: ValueError::Document(path.display().to_string(), error.to_string()),
        })
}
