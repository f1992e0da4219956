//! The previous plugin's result: passed through unchanged on ADD (only
//! `cniVersion` follows the configuration, as the spec asks of chained
//! plugins), and read for the pod's addresses.

use serde::Deserialize;

use crate::event::{IpConfig, IpNet};

/// One `ips[]` entry; the same shape in 0.3.x, 0.4.0 and 1.0.0 apart from
/// 0.3.x's `version` key, which is ignored.
#[derive(Deserialize)]
struct ResultIp {
    address: String,
    #[serde(default)]
    gateway: Option<String>,
    #[serde(default)]
    interface: Option<u32>,
}

/// The part of a result we read.
#[derive(Deserialize)]
struct ResultIps {
    #[serde(default)]
    ips: Vec<ResultIp>,
}

/// `prev_result` with `cniVersion` set to the configuration's.
pub fn passthrough(prev_result: &serde_json::Value, cni_version: &str) -> serde_json::Value {
    let mut result = prev_result.clone();
    if let Some(object) = result.as_object_mut() {
        object.insert("cniVersion".into(), cni_version.into());
    }
    result
}

/// The pod's addresses from `prev_result`.
pub fn pod_ips(prev_result: &serde_json::Value) -> Result<Vec<IpConfig>, ResultError> {
    let result = ResultIps::deserialize(prev_result)
        .map_err(|error| ResultError::Shape(error.to_string()))?;
    result
        .ips
        .into_iter()
        .map(|ip| {
            let address = IpNet::parse_cidr(&ip.address)
                .ok_or_else(|| ResultError::Address(ip.address.clone()))?;
            let gateway = match ip.gateway.as_deref() {
                None | Some("") => None,
                Some(text) => Some(
                    text.parse()
                        .map_err(|_| ResultError::Address(text.to_owned()))?,
                ),
            };
            Ok(IpConfig {
                interface: ip.interface,
                address,
                gateway,
            })
        })
        .collect()
}

/// Why `prevResult` could not be read (CNI code 7: it is part of the
/// network configuration).
#[derive(Debug, thiserror::Error)]
pub enum ResultError {
    /// `ips` is not a list of IP configurations.
    #[error("prevResult.ips: {0}")]
    Shape(String),
    /// An address or gateway that does not parse.
    #[error("prevResult.ips: {0:?} is not an address (with prefix, for `address`)")]
    Address(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_come_from_every_result_version() {
        let v1 = serde_json::json!({
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "cni0"}, {"name": "veth1"}, {"name": "eth0", "sandbox": "/run/netns/p"}],
            "ips": [
                {"interface": 2, "address": "198.18.10.2/24", "gateway": "198.18.10.1"},
                {"address": "fd00::2/64"}
            ],
            "dns": {}
        });
        let ips = pod_ips(&v1).unwrap();
        assert_eq!(ips.len(), 2);
        assert_eq!(ips[0].interface, Some(2));
        assert_eq!(ips[0].address, IpNet::parse_cidr("198.18.10.2/24").unwrap());
        assert_eq!(ips[0].gateway, Some("198.18.10.1".parse().unwrap()));
        assert_eq!(ips[1].gateway, None);

        let v031 = serde_json::json!({"cniVersion": "0.3.1", "ips": [{"version": "4", "address": "10.1.0.5/16", "gateway": ""}]});
        assert_eq!(pod_ips(&v031).unwrap()[0].address.prefix_len, 16);
        assert!(pod_ips(&serde_json::json!({})).unwrap().is_empty());
    }

    #[test]
    fn malformed_addresses_are_errors() {
        for bad in [
            serde_json::json!({"ips": [{"address": "198.18.10.2"}]}),
            serde_json::json!({"ips": [{"address": "198.18.10.2/24", "gateway": "gw"}]}),
            serde_json::json!({"ips": "none"}),
            serde_json::json!({"ips": [{"address": 5}]}),
        ] {
            assert!(pod_ips(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn passthrough_changes_only_the_version() {
        let prev = serde_json::json!({"cniVersion": "0.4.0", "ips": [{"address": "198.18.10.2/24"}], "dns": {"nameservers": ["198.18.0.10"]}});
        let mut want = prev.clone();
        want["cniVersion"] = "1.0.0".into();
        assert_eq!(passthrough(&prev, "1.0.0"), want);
    }
}
