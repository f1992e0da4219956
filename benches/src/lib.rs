//! The benchmark tools: the load generator ([`loadgen`]) that runs inside a
//! pod's network namespace, and the end-to-end harness ([`harness`]) that
//! builds the two-node topology, drives the load generator over each path
//! and reports what every proxy spent. Criterion micro-benches are in
//! `benches/`.

#![warn(missing_docs)]

pub mod harness;
pub mod loadgen;
