//! The CNI side of the mesh: the chained CNI plugin ([`plugin`], binary
//! `ztunnel-cni`) and the node agent ([`agent`], binary `ztunnel-agent`).
//!
//! The plugin runs once per pod sandbox, after the node's main plugin, and
//! tells the agent about ambient pods over HTTP on a unix socket; the body
//! types are in [`event`]. The agent installs each pod's redirection rules
//! inside the pod's netns and hands the pod to ztunnel over ZDS.

// Denied, not forbidden: registering the ZDS socket with tokio's reactor
// (`agent/zds/socket.rs`) is the one unsafe call, allowed where it is made.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod agent;
pub mod event;
pub mod plugin;
