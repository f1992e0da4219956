//! The interface addresses of the calling thread's netns, and whether a
//! pod's IPs are among them (KUBERNETES.md A5, step 2.5: the check that a
//! netns found through a cgroup is really the pod's).
//!
//! The addresses come from `ip -j addr show`, run in the netns with
//! [`netns::command`], the same way the rules' tools run there.

use std::net::IpAddr;

use serde::Deserialize;

use crate::agent::netns::{self, NetnsError};

/// One interface in `ip -j addr show`; other fields are not needed.
#[derive(Debug, Deserialize)]
struct Interface {
    /// The interface's addresses; an interface printed without the key has
    /// none.
    #[serde(default)]
    addr_info: Vec<AddressInfo>,
}

/// One address of an interface.
#[derive(Debug, Deserialize)]
struct AddressInfo {
    /// The address itself; optional so that an entry without one is passed
    /// over rather than failing the whole list.
    local: Option<String>,
}

/// The addresses of every interface in the calling thread's netns. Call
/// it on a thread inside the pod's netns ([`netns::run_in`]).
pub(super) fn listed_here() -> Result<Vec<IpAddr>, AddressesError> {
    let json = netns::command("ip", &["-j", "addr", "show"], None)?;
    parse(&json)
}

/// The addresses in `ip -j addr show` output; an address that does not
/// parse is an error, not skipped.
pub(super) fn parse(json: &str) -> Result<Vec<IpAddr>, AddressesError> {
    let interfaces: Vec<Interface> = serde_json::from_str(json)?;
    interfaces
        .iter()
        .flat_map(|interface| &interface.addr_info)
        .filter_map(|info| info.local.as_deref())
        .map(|text| {
            text.parse()
                .map_err(|_| AddressesError::Address(text.to_owned()))
        })
        .collect()
}

/// Whether any of `pod_ips` is among `present`, an IPv4-mapped IPv6
/// address on either side counting as its IPv4 address.
pub(super) fn includes_any(present: &[IpAddr], pod_ips: &[IpAddr]) -> bool {
    pod_ips.iter().any(|pod_ip| {
        present
            .iter()
            .any(|address| address.to_canonical() == pod_ip.to_canonical())
    })
}

/// Why the addresses of a netns could not be listed.
#[derive(Debug, thiserror::Error)]
pub(super) enum AddressesError {
    /// `ip` could not be run or failed.
    #[error(transparent)]
    Tool(#[from] NetnsError),
    /// `ip` printed something other than its JSON address list.
    #[error("`ip -j addr show` printed unexpected JSON")]
    Json(#[from] serde_json::Error),
    /// An address in the list does not parse.
    #[error("`ip -j addr show` listed a bad address: {0:?}")]
    Address(String),
}
