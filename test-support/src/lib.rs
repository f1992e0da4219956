//! Test support: real topologies for end-to-end tests. Network namespaces
//! joined by veth pairs (198.18.0.0/15 addresses only), iptables capture
//! rules, helpers to run code or processes inside a namespace, pods' pause
//! processes in cgroups named after the pod, a real Kubernetes API
//! server (etcd and kube-apiserver), and HBONE peers that stand in for
//! Envoy (a waypoint, an east-west gateway, an echo destination). Nothing
//! here is compiled into the product.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod ca;
pub mod cluster;
pub mod cni;
pub mod egress;
pub mod helm;
pub mod kube;
pub mod netns;
pub mod pause;
pub mod ports;
pub mod quoted;
pub mod real_cluster;
pub mod wait;
pub mod waypoint;
