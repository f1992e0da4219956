//! Where the proxy's configuration comes from: the local file
//! (`LOCAL_XDS_PATH`, whose format is `local.rs`'s) or the xDS client, and
//! the xDS client's settings (WIRE.md §7), parsed from the environment
//! once: the server address and its roots, the token source, extra headers,
//! and the node id and metadata the client announces itself with.
//!
//! Prefixed variables (`XDS_HEADER_*`, `ISTIO_META_*`, `ISTIO_METAJSON_*`)
//! come from the environment the caller hands in; clap reads the rest. The
//! token (`AUTH_TOKEN`) and node name (`NODE_NAME`) are the CA's and the
//! mesh's flags, handed in too.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use crate::control_plane::{
    ControlPlaneAddress, ExtraHeaders, LiteralToken, RootSource, TokenSource,
};

use super::ConfigError;

/// The xDS (and CA) server of an Istio install, used when `XDS_ADDRESS` is
/// unset and no local file is configured (WIRE.md §7: same default as
/// `CA_ADDRESS`).
pub const DEFAULT_XDS_ADDRESS: &str = "https://istiod.istio-system.svc:15012";

/// Where istiod's root certificate is mounted: the default root of both the
/// CA client and the xDS client.
pub const DEFAULT_ROOT_CA: &str = "./var/run/secrets/istio/root-cert.pem";

/// The projected service-account token istiod's Helm chart mounts.
pub const DEFAULT_TOKEN_PATH: &str = "./var/run/secrets/tokens/istio-token";

/// `INSTANCE_IP` when unset (WIRE.md §7).
const DEFAULT_INSTANCE_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(1, 1, 1, 1));

/// `XDS_ROOT_CA`'s and `CA_ROOT_CA`'s word for the operating system's roots.
const SYSTEM_ROOTS: &str = "SYSTEM";

const XDS_HEADER_PREFIX: &str = "XDS_HEADER_";
const META_PREFIX: &str = "ISTIO_META_";
const META_JSON_PREFIX: &str = "ISTIO_METAJSON_";

/// Where the xDS client connects and how it authenticates and announces
/// itself.
#[derive(Debug, Clone, PartialEq)]
pub struct XdsSettings {
    /// The server. An `http://` address is kept: every attempt to use it
    /// fails and is retried, as WIRE.md §7 says.
    pub address: ControlPlaneAddress,
    /// The roots the server's certificate must chain to (`XDS_ROOT_CA`);
    /// `CA_ROOT_CA` plays no part.
    pub root: RootSource,
    /// A second name the server's certificate may carry (`ALT_XDS_HOSTNAME`).
    pub alt_hostname: Option<String>,
    /// The Bearer token; `None` sends neither `authorization` nor `clusterid`.
    pub token: TokenSource,
    /// `XDS_HEADER_<NAME>` extras.
    pub headers: ExtraHeaders,
    /// Who this proxy says it is.
    pub node: NodeSettings,
    /// `XDS_ON_DEMAND`: Address resources are subscribed one by one as
    /// connections need them, not as a wildcard; Authorization stays a
    /// wildcard.
    pub on_demand: bool,
}

/// The node id's parts and the node metadata (WIRE.md §7).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSettings {
    /// `INSTANCE_IP`, `1.1.1.1` when unset.
    pub instance_ip: IpAddr,
    /// `POD_NAME`, empty when unset.
    pub pod_name: String,
    /// `POD_NAMESPACE`, empty when unset; istiod authorizes the stream
    /// against it.
    pub pod_namespace: String,
    /// `NODE_NAME`, empty when unset.
    pub node_name: String,
    /// `ISTIO_META_<K>` as strings and `ISTIO_METAJSON_<K>` as parsed JSON,
    /// keyed by `<K>`.
    pub metadata: BTreeMap<String, serde_json::Value>,
    /// `ISTIO_METAJSON_<K>` keys whose value was not JSON, with the parse
    /// error: left out of the metadata and logged when the client starts
    /// (logging is not set up while the configuration is parsed).
    pub invalid_metadata: Vec<(String, String)>,
}

/// The flags and variables, flattened into the command line.
#[derive(Debug, clap::Args)]
pub(super) struct XdsArgs {
    /// Local workloads/services/policies file (YAML), reloaded on change.
    #[arg(long, env = "LOCAL_XDS_PATH")]
    pub(super) local_xds_path: Option<PathBuf>,
    /// xDS server address; empty means no xDS [default: https://istiod.istio-system.svc:15012, or none with LOCAL_XDS_PATH].
    #[arg(long, env = "XDS_ADDRESS")]
    xds_address: Option<String>,
    /// Roots of the xDS server: a PEM file, inline PEM, or SYSTEM.
    #[arg(
        long,
        env = "XDS_ROOT_CA",
        default_value = DEFAULT_ROOT_CA
    )]
    xds_root_ca: String,
    /// A second name the xDS server's certificate may carry.
    #[arg(long, env = "ALT_XDS_HOSTNAME")]
    alt_xds_hostname: Option<String>,
    /// This pod's IP, in the xDS node id [default: 1.1.1.1].
    #[arg(long, env = "INSTANCE_IP")]
    instance_ip: Option<String>,
    /// This pod's name, in the xDS node id.
    #[arg(long, env = "POD_NAME")]
    pub(super) pod_name: Option<String>,
    /// This pod's namespace, in the xDS node id.
    #[arg(long, env = "POD_NAMESPACE")]
    pub(super) pod_namespace: Option<String>,
    /// Fetch workloads and services on demand, by the address a connection
    /// needs, rather than all of them (large meshes); the DNS proxy must be
    /// off.
    #[arg(long, env = "XDS_ON_DEMAND", default_value_t = false, action = clap::ArgAction::Set)]
    pub(super) xds_on_demand: bool,
}

impl XdsArgs {
    /// The xDS settings, or `None` when xDS is off: `XDS_ADDRESS` empty, or
    /// unset while `LOCAL_XDS_PATH` supplies the configuration. Both set,
    /// as istio/ztunnel allows, the file seeds the state once at start and
    /// xDS updates it from there.
    /// `auth_token` and `node_name` are `AUTH_TOKEN` and `NODE_NAME` as
    /// given; `discovery_address` (Istio's proxy config) replaces the
    /// default address.
    pub(super) fn parse(
        &self,
        auth_token: Option<&str>,
        node_name: Option<&str>,
        discovery_address: Option<&str>,
        env: &[(String, String)],
    ) -> Result<Option<XdsSettings>, ConfigError> {
        let address = match (self.xds_address.as_deref(), self.local_xds_path.is_some()) {
            (Some(""), _) | (None, true) => return Ok(None),
            (Some(address), _) => address,
            (None, false) => discovery_address.unwrap_or(DEFAULT_XDS_ADDRESS),
        };
        let address = address
            .parse()
            .map_err(|source| ConfigError::ControlPlane {
                name: "XDS_ADDRESS",
                source,
            })?;
        let headers = ExtraHeaders::parse(prefixed(env, XDS_HEADER_PREFIX), XDS_HEADER_PREFIX)
            .map_err(|source| ConfigError::ControlPlane {
                name: "XDS_HEADER_*",
                source,
            })?;
        let instance_ip = match self.instance_ip.as_deref().filter(|ip| !ip.is_empty()) {
            None => DEFAULT_INSTANCE_IP,
            Some(text) => text.parse().map_err(|_| ConfigError::Value {
                name: "INSTANCE_IP",
                source: super::ValueError::Address(text.to_owned()),
            })?,
        };
        let (metadata, invalid_metadata) = metadata(env);
        Ok(Some(XdsSettings {
            address,
            root: root_source(&self.xds_root_ca),
            alt_hostname: self
                .alt_xds_hostname
                .as_deref()
                .filter(|name| !name.is_empty())
                .map(str::to_owned),
            token: token_source(auth_token),
            headers,
            node: NodeSettings {
                instance_ip,
                pod_name: self.pod_name.as_deref().unwrap_or_default().to_owned(),
                pod_namespace: self.pod_namespace.as_deref().unwrap_or_default().to_owned(),
                node_name: node_name.unwrap_or_default().to_owned(),
                metadata,
                invalid_metadata,
            },
            on_demand: self.xds_on_demand,
        }))
    }
}

/// `XDS_ROOT_CA` or `CA_ROOT_CA`: a file when one exists at that path,
/// `SYSTEM` for the OS roots, else the value itself as PEM.
pub(super) fn root_source(value: &str) -> RootSource {
    if value == SYSTEM_ROOTS {
        RootSource::System
    } else if Path::new(value).is_file() || !value.contains("-----BEGIN") {
        // A path that does not exist yet (the root is mounted later) stays a
        // file, so the client keeps looking for it on each attempt.
        RootSource::File(PathBuf::from(value))
    } else {
        RootSource::Pem(value.to_owned())
    }
}

/// The token source of WIRE.md §7: the `AUTH_TOKEN` file; `AUTH_TOKEN`
/// itself as the token when no such file exists; unset, the default token
/// file when it exists; otherwise none.
pub(super) fn token_source(auth_token: Option<&str>) -> TokenSource {
    match auth_token.filter(|value| !value.is_empty()) {
        Some(value) if Path::new(value).is_file() => TokenSource::File(PathBuf::from(value)),
        Some(value) => TokenSource::Literal(LiteralToken::new(value.to_owned())),
        None if Path::new(DEFAULT_TOKEN_PATH).is_file() => {
            TokenSource::File(PathBuf::from(DEFAULT_TOKEN_PATH))
        }
        None => TokenSource::None,
    }
}

/// `(suffix, value)` of every variable named `<prefix><suffix>` with a
/// non-empty suffix, in the order given.
pub(super) fn prefixed<'a>(
    env: &'a [(String, String)],
    prefix: &'a str,
) -> impl Iterator<Item = (&'a str, &'a str)> {
    env.iter().filter_map(move |(name, value)| {
        name.strip_prefix(prefix)
            .filter(|suffix| !suffix.is_empty())
            .map(|suffix| (suffix, value.as_str()))
    })
}

/// `ISTIO_META_<K>` as strings, then `ISTIO_METAJSON_<K>` parsed as JSON
/// (which wins for the same `<K>`); the JSON values that did not parse.
fn metadata(
    env: &[(String, String)],
) -> (BTreeMap<String, serde_json::Value>, Vec<(String, String)>) {
    let mut metadata: BTreeMap<String, serde_json::Value> = prefixed(env, META_PREFIX)
        .map(|(key, value)| (key.to_owned(), serde_json::Value::String(value.to_owned())))
        .collect();
    let mut invalid = Vec::new();
    for (key, value) in prefixed(env, META_JSON_PREFIX) {
        match serde_json::from_str(value) {
            Ok(json) => {
                metadata.insert(key.to_owned(), json);
            }
            Err(error) => invalid.push((key.to_owned(), error.to_string())),
        }
    }
    (metadata, invalid)
}

#[cfg(test)]
mod tests {
    use ztunnel_certs::error_chain::ErrorChain;

    use super::*;

    fn args(address: Option<&str>, local_file: bool) -> XdsArgs {
        XdsArgs {
            local_xds_path: local_file.then(|| PathBuf::from("local.yaml")),
            xds_address: address.map(str::to_owned),
            xds_root_ca: DEFAULT_ROOT_CA.to_owned(),
            alt_xds_hostname: None,
            instance_ip: None,
            pod_name: None,
            pod_namespace: None,
            xds_on_demand: false,
        }
    }

    /// Without a token or a node name.
    fn parse(args: &XdsArgs, env: &[(String, String)]) -> Result<Option<XdsSettings>, ConfigError> {
        args.parse(None, None, None, env)
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn the_address_defaults_to_istiod_unless_a_local_file_is_used_alone() {
        let settings = parse(&args(None, false), &[]).unwrap().unwrap();
        assert_eq!(settings.address.to_string(), DEFAULT_XDS_ADDRESS);
        assert!(parse(&args(None, true), &[]).unwrap().is_none());
        assert!(parse(&args(Some(""), false), &[]).unwrap().is_none());
        assert!(parse(&args(Some(""), true), &[]).unwrap().is_none());
        // Both: the file seeds the state and xDS runs, as istio/ztunnel allows.
        let both = parse(&args(Some("https://istiod:15012"), true), &[]).unwrap();
        assert_eq!(both.unwrap().address.to_string(), "https://istiod:15012");
        // http is kept, to fail on every attempt; garbage fails at start.
        let http = parse(&args(Some("http://127.0.0.1:15010"), false), &[]).unwrap();
        assert!(http.is_some());
        let error = parse(&args(Some("grpc://x"), false), &[]).unwrap_err();
        assert!(error.to_string().starts_with("XDS_ADDRESS"), "{error}");
    }

    #[test]
    fn node_id_parts_default_as_istio_does() {
        let settings = parse(&args(None, false), &[]).unwrap().unwrap();
        assert_eq!(settings.node.instance_ip.to_string(), "1.1.1.1");
        assert_eq!(settings.node.pod_name, "");
        let mut bad_ip = args(None, false);
        bad_ip.instance_ip = Some("10.0.0".to_owned());
        let error = parse(&bad_ip, &[]).unwrap_err();
        assert!(error.to_string().starts_with("INSTANCE_IP"), "{error}");
    }

    #[test]
    fn metadata_and_headers_come_from_prefixed_variables() {
        let env = env(&[
            ("ISTIO_META_CLUSTER_ID", "east"),
            ("ISTIO_META_DNS_CAPTURE", "true"),
            ("ISTIO_METAJSON_LABELS", r#"{"app":"z","replicas":3}"#),
            ("ISTIO_METAJSON_BROKEN", "{not json"),
            ("ISTIO_META_", "ignored: no key"),
            ("XDS_HEADER_X_TENANT", "blue"),
            ("UNRELATED", "x"),
        ]);
        let settings = parse(&args(None, false), &env).unwrap().unwrap();
        let metadata = &settings.node.metadata;
        assert_eq!(metadata["CLUSTER_ID"], serde_json::json!("east"));
        assert_eq!(
            metadata["LABELS"],
            serde_json::json!({"app": "z", "replicas": 3})
        );
        assert!(!metadata.contains_key("BROKEN") && !metadata.contains_key(""));
        assert_eq!(settings.node.invalid_metadata.len(), 1);
        assert_eq!(settings.node.invalid_metadata[0].0, "BROKEN");
        assert_eq!(settings.headers.names().collect::<Vec<_>>(), ["x_tenant"]);

        let bad = self::env(&[("XDS_HEADER_BAD NAME", "x")]);
        let error = parse(&args(None, false), &bad).unwrap_err();
        let shown = ErrorChain(&error).to_string();
        assert!(shown.contains("XDS_HEADER_BAD NAME"), "{shown}");
    }

    #[test]
    fn roots_and_tokens_follow_what_exists_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("x");
        std::fs::write(&file, "token-from-file").unwrap();
        let file_text = file.to_str().unwrap();

        assert_eq!(root_source("SYSTEM"), RootSource::System);
        assert_eq!(root_source(file_text), RootSource::File(file.clone()));
        assert_eq!(
            root_source("./not/there.pem"),
            RootSource::File("./not/there.pem".into())
        );
        let pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert_eq!(root_source(pem), RootSource::Pem(pem.to_owned()));

        assert_eq!(token_source(Some(file_text)), TokenSource::File(file));
        assert_eq!(
            token_source(Some("literal-token")),
            TokenSource::Literal(LiteralToken::new("literal-token".to_owned()))
        );
        // The default file does not exist where tests run.
        assert_eq!(token_source(None), TokenSource::None);
    }
}
