//! Generated code for the wire contract with Istio components: the CA
//! service, ZDS, the workload and authorization APIs, and the delta xDS
//! subset, plus the contract's few named constants that both sides use (the
//! xDS type URLs in `xds_types.rs`, the HBONE port in `ports.rs`). The
//! `.proto` sources under `proto/` are written from WIRE.md; this crate holds
//! no logic. Module paths mirror the protobuf packages, because generated code
//! refers to other packages by relative path.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod ports;
pub mod xds_types;

/// Packages under `istio.*`.
pub mod istio {
    /// Package `istio.v1`.
    pub mod v1 {
        /// Package `istio.v1.auth`: the CA's `IstioCertificateService`.
        #[allow(clippy::all, clippy::pedantic, missing_docs)] // generated
        pub mod auth {
            tonic::include_proto!("istio.v1.auth");
        }
    }

    /// Package `istio.workload`: workloads and services.
    #[allow(clippy::all, clippy::pedantic, missing_docs)] // generated
    pub mod workload {
        tonic::include_proto!("istio.workload");

        /// Package `istio.workload.zds`: node agent to ztunnel messages.
        #[allow(clippy::all, clippy::pedantic, missing_docs)] // generated
        pub mod zds {
            tonic::include_proto!("istio.workload.zds");
        }
    }

    /// Package `istio.security`: L4 authorization policies.
    #[allow(clippy::all, clippy::pedantic, missing_docs)] // generated
    pub mod security {
        tonic::include_proto!("istio.security");
    }
}

/// Packages under `envoy.*`: the delta xDS subset.
pub mod envoy {
    /// Package `envoy.config`.
    pub mod config {
        /// Package `envoy.config.core`.
        pub mod core {
            /// Package `envoy.config.core.v3`: `Node`.
            #[allow(clippy::all, clippy::pedantic, missing_docs)] // generated
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }

    /// Package `envoy.service`.
    pub mod service {
        /// Package `envoy.service.discovery`.
        pub mod discovery {
            /// Package `envoy.service.discovery.v3`: delta ADS.
            #[allow(clippy::all, clippy::pedantic, missing_docs)] // generated
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
    }
}

/// Packages under `google.*` that are not well-known types.
pub mod google {
    /// Package `google.rpc`: `Status`.
    #[allow(clippy::all, clippy::pedantic, missing_docs)] // generated
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}
