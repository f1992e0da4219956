//! What the tests expect of our metrics' wire shape, from WIRE.md §10.

/// WIRE.md §10's traffic labels, in order: what every `istio_tcp_*`
/// counter family carries on both proxies.
pub const TRAFFIC_LABELS: [&str; 27] = [
    "reporter",
    "source_workload",
    "source_canonical_service",
    "source_canonical_revision",
    "source_workload_namespace",
    "source_principal",
    "source_app",
    "source_version",
    "source_cluster",
    "destination_service",
    "destination_service_namespace",
    "destination_service_name",
    "destination_workload",
    "destination_canonical_service",
    "destination_canonical_revision",
    "destination_workload_namespace",
    "destination_principal",
    "destination_app",
    "destination_version",
    "destination_cluster",
    "request_protocol",
    "response_flags",
    "connection_security_policy",
    "source_region",
    "source_zone",
    "destination_region",
    "destination_zone",
];
