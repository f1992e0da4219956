//! The plugin-event bodies the CNI plugin posts to the node agent (WIRE.md
//! §6), shared by both sides so their JSON cannot drift apart.
//!
//! Field names are Go's default encoding of istio-cni's structs
//! (`Netns`, `PodName`, `PodNamespace`, `IPs`), and an address is Go's
//! `net.IPNet` encoding: the IP as text and the mask as base64 bytes.
//! `PodUID` and `DeadlineUnixMilli` are our additions; Go's decoder
//! ignores unknown keys, so an istio-cni agent still accepts our plugin's
//! body. The HTTP exchange lives in `plugin/client.rs` and
//! `agent/server.rs`.

use std::net::IpAddr;
use std::time::SystemTime;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Where the node agent listens for plugin events unless configured
/// otherwise: istio-cni's socket (WIRE.md §6).
pub const DEFAULT_SOCKET: &str = "/var/run/istio-cni/pluginevent.sock";
/// Path of the add event.
pub const CMD_ADD_PATH: &str = "/cmdadd";
/// Path of the delete event (our extension).
pub const CMD_DEL_PATH: &str = "/cmddel";
/// Prefix of the pod lookup, `GET /pods/<namespace>/<name>` (our extension).
pub const PODS_PATH: &str = "/pods/";

/// `POST /cmdadd`: a pod's sandbox is up and should join the mesh.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmdAdd {
    /// Path of the pod's network namespace, from `CNI_NETNS`.
    #[serde(rename = "Netns")]
    pub netns: String,
    /// Pod name, from `K8S_POD_NAME`.
    #[serde(rename = "PodName")]
    pub pod_name: String,
    /// Pod namespace, from `K8S_POD_NAMESPACE`.
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    /// The pod's addresses, from the previous plugin's result.
    #[serde(rename = "IPs")]
    pub ips: Vec<IpConfig>,
    /// Pod UID, from `K8S_POD_UID`; empty when the runtime gave none. It lets
    /// the agent notice a registry entry for a different pod of the same name.
    #[serde(rename = "PodUID", default)]
    pub pod_uid: String,
    /// When the plugin stops waiting for the answer, as Unix milliseconds
    /// on the wire (plugin and agent share the node's clock); `None` from
    /// plugins that send none. The runtime has given up on a sandbox whose
    /// ADD is not answered by then and retries with a new one, so the
    /// agent refuses an add that reaches it too late rather than put a
    /// sandbox that is being torn down in the mesh.
    #[serde(
        rename = "DeadlineUnixMilli",
        default,
        skip_serializing_if = "Option::is_none",
        with = "unix_millis"
    )]
    pub deadline: Option<SystemTime>,
}

/// `POST /cmddel`: a pod's sandbox is going away.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CmdDel {
    /// Path of the pod's network namespace; empty when the runtime already
    /// removed it (DEL may be repeated after the sandbox is gone). It says
    /// which sandbox of the pod is going: a runtime that retries a pod
    /// makes a new sandbox with the same name and uid.
    #[serde(rename = "Netns", default)]
    pub netns: String,
    /// Pod name.
    #[serde(rename = "PodName")]
    pub pod_name: String,
    /// Pod namespace.
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    /// Pod UID; when given, a recorded pod with another UID is left alone
    /// (a late DEL of a replaced sandbox must not remove its successor).
    #[serde(rename = "PodUID", default)]
    pub pod_uid: String,
}

/// One address of the pod, as a CNI result's `ips[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// Index into the result's `interfaces` list; Go's `*int`, so `null`
    /// when the result names no interface.
    #[serde(rename = "Interface")]
    pub interface: Option<u32>,
    /// Address and prefix.
    #[serde(rename = "Address")]
    pub address: IpNet,
    /// Gateway; Go encodes an absent one as `""`.
    #[serde(rename = "Gateway", with = "gateway_text")]
    pub gateway: Option<IpAddr>,
}

/// An address with its prefix length, encoded like Go's `net.IPNet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    /// The pod's address (not the network address).
    pub ip: IpAddr,
    /// Prefix length; at most 32 for IPv4 and 128 for IPv6.
    pub prefix_len: u8,
}

impl IpNet {
    /// Parses `198.18.10.2/24` or `fd00::2/64`.
    pub fn parse_cidr(text: &str) -> Option<IpNet> {
        let (ip, prefix) = text.split_once('/')?;
        let ip: IpAddr = ip.parse().ok()?;
        let prefix_len: u8 = prefix.parse().ok()?;
        (prefix_len <= max_prefix(ip)).then_some(IpNet { ip, prefix_len })
    }

    /// The mask bytes: 4 for IPv4, 16 for IPv6, as Go's `ParseCIDR` makes.
    pub fn mask(&self) -> Vec<u8> {
        let bytes = usize::from(max_prefix(self.ip) / 8);
        let mut remaining = u32::from(self.prefix_len);
        let mut mask = Vec::with_capacity(bytes);
        for _ in 0..bytes {
            let ones = remaining.min(8);
            remaining -= ones;
            // The low byte of 0xff00 >> ones has its top `ones` bits set.
            mask.push((0xff00_u16 >> ones) as u8);
        }
        mask
    }

    /// The prefix length a Go mask stands for, if it is a contiguous mask of
    /// the address's length.
    fn from_mask(ip: IpAddr, mask: &[u8]) -> Option<IpNet> {
        if mask.len() != usize::from(max_prefix(ip) / 8) {
            return None;
        }
        let mut prefix_len: u8 = 0;
        let mut ended = false;
        for byte in mask {
            let ones = byte.leading_ones();
            if (ended && *byte != 0) || byte.checked_shl(ones).is_some_and(|rest| rest != 0) {
                return None;
            }
            ended |= ones < 8;
            prefix_len += ones as u8;
        }
        Some(IpNet { ip, prefix_len })
    }
}

/// Go's `net.IPNet` JSON shape.
#[derive(Serialize, Deserialize)]
struct GoIpNet {
    #[serde(rename = "IP")]
    ip: IpAddr,
    #[serde(rename = "Mask")]
    mask: String,
}

impl Serialize for IpNet {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        GoIpNet {
            ip: self.ip,
            mask: STANDARD.encode(self.mask()),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for IpNet {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let go = GoIpNet::deserialize(deserializer)?;
        let mask = STANDARD
            .decode(&go.mask)
            .map_err(|error| D::Error::custom(format!("Mask is not base64: {error}")))?;
        IpNet::from_mask(go.ip, &mask)
            .ok_or_else(|| D::Error::custom("Mask is not a contiguous mask of the IP's length"))
    }
}

/// Longest prefix of the address's family.
fn max_prefix(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// `Gateway` as Go writes a `net.IP`: text, or `""` for none.
mod gateway_text {
    use std::net::IpAddr;

    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        gateway: &Option<IpAddr>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match gateway {
            Some(ip) => serializer.collect_str(ip),
            None => serializer.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<IpAddr>, D::Error> {
        let text = Option::<String>::deserialize(deserializer)?.unwrap_or_default();
        if text.is_empty() {
            return Ok(None);
        }
        text.parse()
            .map(Some)
            .map_err(|_| D::Error::custom(format!("Gateway {text:?} is not an IP address")))
    }
}

/// `DeadlineUnixMilli`: a time as milliseconds since the Unix epoch, as
/// Go's `time.UnixMilli` gives it.
mod unix_millis {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use serde::de::Error as _;
    use serde::ser::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        time: &Option<SystemTime>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let Some(time) = time else {
            return serializer.serialize_none();
        };
        let millis = time
            .duration_since(UNIX_EPOCH)
            .map_err(|_| S::Error::custom("a deadline before 1970"))?
            .as_millis();
        serializer.serialize_u64(
            u64::try_from(millis).map_err(|_| S::Error::custom("a deadline too far ahead"))?,
        )
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<SystemTime>, D::Error> {
        let Some(millis) = Option::<u64>::deserialize(deserializer)? else {
            return Ok(None);
        };
        UNIX_EPOCH
            .checked_add(Duration::from_millis(millis))
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("DeadlineUnixMilli {millis} is out of range")))
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn add_body_uses_go_field_names() {
        let body = CmdAdd {
            netns: "/var/run/netns/cni-1".into(),
            pod_name: "web-0".into(),
            pod_namespace: "shop".into(),
            ips: vec![
                IpConfig {
                    interface: Some(2),
                    address: IpNet::parse_cidr("198.18.10.2/24").unwrap(),
                    gateway: Some("198.18.10.1".parse().unwrap()),
                },
                IpConfig {
                    interface: None,
                    address: IpNet::parse_cidr("fd00::2/64").unwrap(),
                    gateway: None,
                },
            ],
            pod_uid: "uid-1".into(),
            deadline: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_005_123)),
        };
        let json = serde_json::to_value(&body).unwrap();
        let want = serde_json::json!({
            "Netns": "/var/run/netns/cni-1",
            "PodName": "web-0",
            "PodNamespace": "shop",
            "IPs": [
                {"Interface": 2, "Address": {"IP": "198.18.10.2", "Mask": "////AA=="}, "Gateway": "198.18.10.1"},
                {"Interface": null, "Address": {"IP": "fd00::2", "Mask": "//////////8AAAAAAAAAAA=="}, "Gateway": ""}
            ],
            "PodUID": "uid-1",
            "DeadlineUnixMilli": 1_700_000_005_123_u64
        });
        assert_eq!(json, want);
        let back: CmdAdd = serde_json::from_value(json).unwrap();
        assert_eq!(back, body);
    }

    #[test]
    fn istio_bodies_without_our_keys_decode() {
        let body =
            r#"{"Netns":"/proc/1/ns/net","PodName":"a","PodNamespace":"b","IPs":[],"Extra":1}"#;
        let add: CmdAdd = serde_json::from_str(body).unwrap();
        assert_eq!((add.pod_uid.as_str(), add.deadline), ("", None));
        let sent = serde_json::to_value(&add).unwrap();
        assert!(
            sent.get("DeadlineUnixMilli").is_none(),
            "no deadline, no key: {sent}"
        );
        let far = r#"{"Netns":"","PodName":"a","PodNamespace":"b","IPs":[],"DeadlineUnixMilli":18446744073709551615}"#;
        assert!(serde_json::from_str::<CmdAdd>(far).is_ok());
        let del: CmdDel = serde_json::from_str(r#"{"PodName":"a","PodNamespace":"b"}"#).unwrap();
        assert_eq!(del.netns, "");
    }

    #[test]
    fn masks_round_trip_and_bad_ones_are_refused() {
        for cidr in [
            "10.0.0.1/0",
            "10.0.0.1/8",
            "10.0.0.1/31",
            "10.0.0.1/32",
            "::1/128",
            "fd00::1/65",
        ] {
            let net = IpNet::parse_cidr(cidr).unwrap();
            assert_eq!(IpNet::from_mask(net.ip, &net.mask()), Some(net), "{cidr}");
        }
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let refused: [&[u8]; 4] = [
            &[255, 0, 255, 0],
            &[255, 255, 0b1011_0000, 0],
            &[255; 16],
            &[255; 3],
        ];
        for mask in refused {
            assert_eq!(IpNet::from_mask(v4, mask), None, "{mask:?}");
        }
        for text in ["10.0.0.1", "10.0.0.1/33", "::1/129", "x/1", "10.0.0.1/-1"] {
            assert_eq!(IpNet::parse_cidr(text), None, "{text}");
        }
        let bad = r#"{"Interface":0,"Address":{"IP":"10.0.0.1","Mask":"%%"},"Gateway":""}"#;
        assert!(serde_json::from_str::<IpConfig>(bad).is_err());
    }
}
