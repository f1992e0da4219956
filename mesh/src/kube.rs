//! The Kubernetes source of the mesh: Pods, Services, EndpointSlices,
//! Nodes, Istio AuthorizationPolicies and Gateway API Gateways, converted
//! to the mesh model.
pub mod convert;
pub mod gateway_crd;
pub mod policy_crd;
pub mod source;
