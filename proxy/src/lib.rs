//! The node proxy (`ztunnel`): outbound capture, HBONE tunnel, inbound
//! authorization. Built in issue 3.
//!
//! The pure core so far: `state` (workloads, services, policies and upstream
//! selection), `rbac` (L4 authorization) and `config` (the local config file).

pub mod config;
pub mod rbac;
pub mod socket;
pub mod state;
