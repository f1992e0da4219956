//! Outbound: connections a workload makes, captured on 15001. Each is routed
//! (`outbound/route.rs`) and then tunnelled over HBONE or passed through as
//! plain TCP.

pub mod route;
