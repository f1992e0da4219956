//! Test support: real topologies for end-to-end tests. Network namespaces
//! joined by veth pairs (198.18.0.0/15 addresses only), iptables capture
//! rules, helpers to run code or processes inside a namespace, pods' pause
//! processes in cgroups named after the pod, a real Kubernetes API
//! server (etcd and kube-apiserver), and HBONE peers that stand in for
//! Envoy (a waypoint, an east-west gateway, an echo destination). Nothing
//! here is compiled into the product.
//!
//! # Which cluster to use
//!
//! Three harnesses build a mesh, each for a different question:
//!
//! | harness | what runs | use it for | start-up |
//! |---|---|---|---|
//! | [`cluster`] | our processes (control plane, node agents, shared-mode ztunnels) on two nodes of network namespaces; pods are namespaces added through the real CNI chain | the data path, capture, xDS and the CA between our own components, with the mesh from a file or from [`kube`]'s API server | seconds |
//! | [`kube`] | etcd and kube-apiserver only, no kubelet: tests write pod status themselves | what a component reads from or writes to the Kubernetes API (watches, RBAC, TokenReview, the chart's objects) | seconds |
//! | [`real_cluster`] | a real two-node Kubernetes cluster (kubelet, containerd, runc, kube-proxy, CoreDNS) running the images; the mesh installed by `helm install` (our chart, or Istio's charts with our ztunnel, [`real_cluster::istio`]) | what users do: installs, rollouts, pods' lifecycles, Istio's own components driving ours | about a minute, root, one at a time |
//!
//! Prefer the cheapest that can show the behaviour: a [`real_cluster`]
//! phase costs a minute of CI per cluster, a [`cluster`] test seconds.
//!
//! # Where a test cannot run
//!
//! A test that lacks root, a tool, the built Kubernetes binaries or a
//! usable cgroup hierarchy returns early through [`skip::skip`], with the
//! reason; harnesses that find the lack themselves ([`kube::KubeApi::start`],
//! [`helm::Helm::find_or_skip`]) call it for their callers. `cargo test`
//! shows such a test as passed, so `.ci/run`, where everything is present,
//! sets `ZTUNNEL_NO_SKIPS`, under which a skip fails the test with its
//! reason. Only a missing capability is a skip: any other error of a
//! harness fails the test.

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
pub mod process;
pub mod quoted;
pub mod real_cluster;
pub mod skip;
pub mod wait;
pub mod waypoint;
