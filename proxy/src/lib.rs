//! The node proxy (`ztunnel`): outbound capture, HBONE tunnel, inbound
//! authorization. Built in issue 3.
//!
//! The pure core so far: `state` (workloads, services, policies and upstream
//! selection), `rbac` (L4 authorization) and `config` (the local config file).

pub mod access_log;
pub mod admin;
pub mod app;
pub mod config;
pub mod copy;
pub mod discovery;
pub mod drain;
pub mod hbone;
pub mod identity;
pub mod inbound;
pub mod inpod;
pub mod metrics;
pub mod outbound;
pub mod pool;
pub mod rbac;
pub mod readiness;
pub mod report;
pub mod socket;
pub mod state;
pub mod telemetry;
