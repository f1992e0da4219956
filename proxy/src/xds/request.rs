//! What the xDS client sends (WIRE.md §7): the node id and metadata, one
//! initial wildcard request per type on every (re)connect, and the ACK or
//! NACK of each response.

use std::collections::BTreeMap;

use prost_types::value::Kind;
use ztunnel_proto::envoy::config::core::v3::Node;
use ztunnel_proto::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use ztunnel_proto::google::rpc::Status;
use ztunnel_proto::xds_types::ResourceKind;

use crate::config::NodeSettings;

use super::known::{KnownVersions, Rejection};

/// The node type istiod expects of a ztunnel (the first part of the id).
const NODE_TYPE: &str = "ztunnel";

/// The `google.rpc.Code` of a NACK's `error_detail`: WIRE.md §7 says 0.
const NACK_CODE: i32 = 0;

/// Separates the rejected entries of a NACK's message.
const NACK_SEPARATOR: &str = "; ";

/// The node this proxy announces: id
/// `ztunnel~<INSTANCE_IP>~<POD_NAME>.<POD_NAMESPACE>~<POD_NAMESPACE>.svc.cluster.local`,
/// `cluster` empty, and the metadata: `ISTIO_META_*`/`ISTIO_METAJSON_*`
/// first, then `NAME`, `NAMESPACE`, `INSTANCE_IPS` and `NODE_NAME`, which
/// win over a prefixed variable of the same key.
pub fn node(settings: &NodeSettings) -> Node {
    let id = format!(
        "{NODE_TYPE}~{ip}~{name}.{namespace}~{namespace}.svc.cluster.local",
        ip = settings.instance_ip,
        name = settings.pod_name,
        namespace = settings.pod_namespace,
    );
    let mut fields: BTreeMap<String, prost_types::Value> = settings
        .metadata
        .iter()
        .map(|(key, value)| (key.clone(), json_to_value(value)))
        .collect();
    for (key, value) in [
        ("NAME", settings.pod_name.clone()),
        ("NAMESPACE", settings.pod_namespace.clone()),
        ("INSTANCE_IPS", settings.instance_ip.to_string()),
        ("NODE_NAME", settings.node_name.clone()),
    ] {
        fields.insert(key.to_owned(), string_value(value));
    }
    Node {
        id,
        cluster: String::new(),
        metadata: Some(prost_types::Struct { fields }),
        build_version: String::new(),
    }
}

/// The requests that open every stream: one per type, Address first, each
/// with `node`, empty subscribe/unsubscribe lists (a wildcard) and the
/// versions accepted so far.
pub fn initial_requests(node: &Node, known: &KnownVersions) -> Vec<DeltaDiscoveryRequest> {
    initial_requests_on_demand(node, known, None)
}

/// [`initial_requests`], with Address on demand when `demanded` is given
/// (`XDS_ON_DEMAND`): `*` both subscribed and unsubscribed, which delta
/// xDS reads as no wildcard (there is no other way to subscribe to
/// nothing), and the names demanded so far subscribed again.
pub fn initial_requests_on_demand(
    node: &Node,
    known: &KnownVersions,
    demanded: Option<Vec<String>>,
) -> Vec<DeltaDiscoveryRequest> {
    ResourceKind::ALL
        .into_iter()
        .map(|kind| {
            let mut request = DeltaDiscoveryRequest {
                node: Some(node.clone()),
                type_url: kind.type_url().to_owned(),
                initial_resource_versions: known.initial_resource_versions(kind),
                ..DeltaDiscoveryRequest::default()
            };
            if let (ResourceKind::Address, Some(names)) = (kind, &demanded) {
                request.resource_names_subscribe = std::iter::once(WILDCARD.to_owned())
                    .chain(names.iter().cloned())
                    .collect();
                request.resource_names_unsubscribe = vec![WILDCARD.to_owned()];
            }
            request
        })
        .collect()
}

/// Delta xDS's name for every resource of a type.
const WILDCARD: &str = "*";

/// The ACK of a response: its type and nonce, nothing else.
pub fn ack(type_url: &str, nonce: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.to_owned(),
        response_nonce: nonce.to_owned(),
        ..DeltaDiscoveryRequest::default()
    }
}

/// The NACK of a response: the ACK plus `error_detail` with code 0, no
/// details, and the rejected entries as `<name>: <reason>` joined by `; `.
pub fn nack(type_url: &str, nonce: &str, rejected: &[Rejection]) -> DeltaDiscoveryRequest {
    let message = rejected
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(NACK_SEPARATOR);
    DeltaDiscoveryRequest {
        error_detail: Some(Status {
            code: NACK_CODE,
            message,
            details: Vec::new(),
        }),
        ..ack(type_url, nonce)
    }
}

fn string_value(text: String) -> prost_types::Value {
    prost_types::Value {
        kind: Some(Kind::StringValue(text)),
    }
}

/// JSON as a `google.protobuf.Value`; numbers become doubles, as Struct
/// numbers are.
fn json_to_value(json: &serde_json::Value) -> prost_types::Value {
    let kind = match json {
        serde_json::Value::Null => Kind::NullValue(prost_types::NullValue::NullValue.into()),
        serde_json::Value::Bool(value) => Kind::BoolValue(*value),
        serde_json::Value::Number(number) => Kind::NumberValue(number.as_f64().unwrap_or(f64::NAN)),
        serde_json::Value::String(text) => Kind::StringValue(text.clone()),
        serde_json::Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(json_to_value).collect(),
        }),
        serde_json::Value::Object(fields) => Kind::StructValue(prost_types::Struct {
            fields: fields
                .iter()
                .map(|(key, value)| (key.clone(), json_to_value(value)))
                .collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}
