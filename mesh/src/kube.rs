//! The Kubernetes source of the mesh: Pods, Services, EndpointSlices,
//! Nodes and Istio AuthorizationPolicies, converted to the mesh model.
pub mod convert;
pub mod policy_crd;
pub mod source;
