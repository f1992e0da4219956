//! The node proxy (`ztunnel`): outbound capture, HBONE tunnel, inbound
//! authorization.
//!
//! The pure core: `state` (workloads, services, policies and upstream
//! selection), `rbac` (L4 authorization), `config` (the local config file)
//! and `xds/apply.rs` (an xDS response to state changes and its ACK/NACK),
//! beside the decisions of each task (`outbound/route.rs`,
//! `inbound/decision.rs`, `pool`'s `choose`, `identity/schedule.rs`,
//! `inpod/zds/session.rs`). Tasks move bytes and call these.

#![warn(missing_docs)]

pub mod accept;
pub mod access_log;
pub mod admin;
pub mod app;
pub mod backoff;
pub mod capacity;
pub mod cidr;
pub mod config;
pub mod context;
pub mod control_plane;
pub mod copy;
pub mod discovery;
pub mod dns;
pub mod drain;
pub mod hbone;
pub mod identity;
pub mod inbound;
pub mod inpod;
pub mod interner;
pub mod memory;
pub mod metrics;
pub mod outbound;
pub mod pool;
pub mod ports;
pub mod rbac;
pub mod readiness;
pub mod report;
pub mod resolve;
pub mod revocation;
pub mod serve;
pub mod socket;
pub mod splice;
pub mod state;
pub mod telemetry;
pub mod tracker;
pub mod version;
pub mod xds;
