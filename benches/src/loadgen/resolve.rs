//! `resolve`: names looked up the way a pod's application looks them up,
//! through the system resolver (getaddrinfo), so that a test sees what the
//! pod's DNS path (the search list, a DNS proxy capturing port 53) answers.

use std::net::IpAddr;

use serde::Serialize;

use super::cli::ResolveArgs;

/// What `resolve` prints.
#[derive(Debug, Serialize)]
pub struct ResolveReport {
    /// Always `resolve`.
    mode: &'static str,
    /// One per name asked, in order.
    results: Vec<Resolution>,
}

/// One name's outcome.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Resolution {
    /// The name's addresses, in the resolver's order, without repeats.
    Found {
        name: String,
        addresses: Vec<IpAddr>,
    },
    /// The resolver's error, as it words it.
    Failed { name: String, error: String },
}

/// Looks up each name once, in order.
pub async fn run(args: &ResolveArgs) -> ResolveReport {
    let mut results = Vec::with_capacity(args.names.len());
    for name in &args.names {
        let resolution = match tokio::net::lookup_host((name.as_str(), 0)).await {
            Ok(found) => {
                let mut addresses: Vec<IpAddr> = Vec::new();
                for address in found.map(|socket| socket.ip()) {
                    if !addresses.contains(&address) {
                        addresses.push(address);
                    }
                }
                Resolution::Found {
                    name: name.clone(),
                    addresses,
                }
            }
            Err(error) => Resolution::Failed {
                name: name.clone(),
                error: error.to_string(),
            },
        };
        results.push(resolution);
    }
    ResolveReport {
        mode: "resolve",
        results,
    }
}
