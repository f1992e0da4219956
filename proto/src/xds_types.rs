//! The xDS resource types of the wire contract (WIRE.md §7): their type URLs
//! and the one enum by which the proxy's client and the control plane's
//! server both name them. The messages the resources carry are the generated
//! `istio::workload` and `istio::security` modules.

/// Type URL of workloads and services (WIRE.md §7).
pub const ADDRESS_TYPE_URL: &str = "type.googleapis.com/istio.workload.Address";

/// Type URL of authorization policies (WIRE.md §7).
pub const AUTHORIZATION_TYPE_URL: &str = "type.googleapis.com/istio.security.Authorization";

/// The xDS resource types ztunnel subscribes to and the control plane serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    /// `istio.workload.Address`: a workload (named by its uid) or a service
    /// (named `namespace/hostname`).
    Address,
    /// `istio.security.Authorization`: a policy, named `namespace/name`.
    Authorization,
}

impl ResourceKind {
    /// Every type, in the order ztunnel subscribes to them (Address first).
    pub const ALL: [ResourceKind; 2] = [ResourceKind::Address, ResourceKind::Authorization];

    /// The type URL on the wire.
    pub fn type_url(self) -> &'static str {
        match self {
            ResourceKind::Address => ADDRESS_TYPE_URL,
            ResourceKind::Authorization => AUTHORIZATION_TYPE_URL,
        }
    }

    /// The type a message's `type_url` names; `None` for one outside the
    /// contract.
    pub fn from_type_url(type_url: &str) -> Option<ResourceKind> {
        match type_url {
            ADDRESS_TYPE_URL => Some(ResourceKind::Address),
            AUTHORIZATION_TYPE_URL => Some(ResourceKind::Authorization),
            _ => None,
        }
    }

    /// A short stable name for metric labels and logs.
    pub fn label(self) -> &'static str {
        match self {
            ResourceKind::Address => "address",
            ResourceKind::Authorization => "authorization",
        }
    }

    /// Position in [`ResourceKind::ALL`], for per-type arrays.
    pub fn index(self) -> usize {
        match self {
            ResourceKind::Address => 0,
            ResourceKind::Authorization => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_found_by_its_own_type_url_and_no_other_url_names_one() {
        for kind in ResourceKind::ALL {
            assert_eq!(ResourceKind::from_type_url(kind.type_url()), Some(kind));
        }
        for other in [
            "type.googleapis.com/istio.workload.Workload",
            "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            "",
        ] {
            assert_eq!(ResourceKind::from_type_url(other), None, "{other}");
        }
    }

    #[test]
    fn each_kind_sits_at_its_index_in_all() {
        for (position, kind) in ResourceKind::ALL.into_iter().enumerate() {
            assert_eq!(kind.index(), position);
        }
    }
}
