//! Compiles `proto/` with protox (pure Rust, so no system `protoc` is needed)
//! and generates prost messages and tonic services from the descriptors.

use std::error::Error;

const PROTOS: &[&str] = &[
    "istio/v1/auth/ca.proto",
    "istio/workload/workload.proto",
    "istio/workload/zds/zds.proto",
    "istio/security/authorization.proto",
    "google/rpc/status.proto",
    "envoy/config/core/v3/base.proto",
    "envoy/service/discovery/v3/discovery.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // No `connect()` helpers: callers build their own TLS channels, and
        // this crate then needs no tonic transport.
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
