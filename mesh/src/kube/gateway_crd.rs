//! Gateway API `gateway.networking.k8s.io/v1` `Gateway` and `GatewayClass`
//! as Rust types, so that `kube::Api` can list and watch them. Their
//! schemas come from the Go module `sigs.k8s.io/gateway-api`
//! (`scripts/k8s-test-env.sh` extracts them; they are not in this
//! repository).
//!
//! Only the fields the waypoint and network-gateway conversion reads are
//! here; what they mean is `convert/waypoint.rs`'s. Everything is read
//! leniently (unknown fields ignored, every field may be absent): a field
//! added by a newer Gateway API must not stop the watch.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

/// A Gateway: metadata, spec and the addresses its status reports.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Gateway {
    /// Name, namespace, labels (`istio.io/waypoint-for`,
    /// `topology.istio.io/network`), annotations.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The class and the listeners.
    #[serde(default)]
    pub spec: GatewaySpec,
    /// Where the gateway is reachable, once its controller says so.
    #[serde(default)]
    pub status: Option<GatewayStatus>,
}

/// `spec`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GatewaySpec {
    /// The GatewayClass it is of: `istio-waypoint`, `istio-remote`, ...
    pub gateway_class_name: String,
    /// Its listeners.
    pub listeners: Vec<Listener>,
}

/// One listener of a Gateway.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Listener {
    /// The listener's name.
    pub name: String,
    /// The port.
    pub port: i32,
    /// `HBONE` for a waypoint's or an east-west gateway's mesh listener.
    pub protocol: String,
    /// Which namespaces may attach to it.
    pub allowed_routes: Option<AllowedRoutes>,
    /// TLS settings (`mode: Terminate` on an east-west gateway).
    pub tls: Option<ListenerTls>,
}

/// `allowedRoutes`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct AllowedRoutes {
    /// The namespaces.
    pub namespaces: Option<RouteNamespaces>,
}

/// `allowedRoutes.namespaces`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RouteNamespaces {
    /// `Same` (the default), `All` or `Selector`.
    pub from: Option<String>,
    /// The namespaces' labels, for `Selector`.
    pub selector: Option<LabelSelector>,
}

/// `tls` of a listener.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ListenerTls {
    /// `Terminate` or `Passthrough`.
    pub mode: Option<String>,
}

/// `status`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct GatewayStatus {
    /// Where the gateway is reachable.
    pub addresses: Vec<GatewayStatusAddress>,
}

/// One entry of `status.addresses`; written back whole by the control
/// plane's status writer, hence serializable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GatewayStatusAddress {
    /// `Hostname` or `IPAddress` (the default when absent).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The hostname or the address.
    pub value: String,
}

/// A GatewayClass: its labels and annotations are what a Gateway of the
/// class inherits (`istio.io/waypoint-for`, the inbound binding).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct GatewayClass {
    /// Name, labels, annotations.
    #[serde(default)]
    pub metadata: ObjectMeta,
}

custom_resource!(
    Gateway: "gateway.networking.k8s.io" / "v1",
    "Gateway",
    "gateways",
    NamespaceResourceScope
);
custom_resource!(
    GatewayClass: "gateway.networking.k8s.io" / "v1",
    "GatewayClass",
    "gatewayclasses",
    ClusterResourceScope
);
