//! What every one of our processes does besides its job: waiting for the
//! signal that asks it to stop (`shutdown`), and replacing the files it
//! keeps its state in so that a reader never sees half of one
//! (`state_file`). The control plane, the node agent and the proxy share
//! these through this crate rather than through each other: the node
//! agent does not link the control plane for its pod set's file.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod shutdown;
pub mod state_file;
