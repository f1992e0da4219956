//! SPIFFE workload identities: `spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`.
//!
//! Parsing is strict and happens once, at the edge; everything past it holds
//! an [`Identity`], never a raw string. Where identities come from in a
//! certificate (URI SANs) is `cert.rs`'s business.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The URI scheme prefix every identity starts with.
const SCHEME: &str = "spiffe://";
/// What separates the trust domain from the namespace.
const NS: &str = "/ns/";
/// What separates the namespace from the service account.
const SA: &str = "/sa/";

/// Longest identity accepted, in bytes. Kubernetes names are at most 253
/// (namespace 63, service account 253) and trust domains are DNS names (253),
/// so 1 KiB leaves room while bounding what a hostile SAN can make us hold.
const MAX_LEN: usize = 1024;

/// A parsed SPIFFE workload identity.
///
/// Cheap to clone: the three parts share one allocation.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Identity {
    /// The full URI, kept so that `Display` and comparisons cost nothing.
    uri: Arc<str>,
    /// Where the trust domain and the namespace end inside `uri`; each
    /// part starts after the fixed text that follows the one before, so
    /// these two ends locate all three. Two bytes each: a URI is at most
    /// `MAX_LEN` long, and a workload store holds one identity per workload.
    trust_domain_end: u16,
    namespace_end: u16,
}

/// Why a string is not a workload identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The string does not start with `spiffe://`.
    #[error("identity must start with spiffe://")]
    Scheme,
    /// The identity is longer than `MAX_LEN` (1 KiB) bytes.
    #[error("identity is longer than {MAX_LEN} bytes")]
    TooLong,
    /// The path does not have the form `<td>/ns/<ns>/sa/<sa>`.
    #[error(
        "identity must have the form spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>"
    )]
    Shape,
    /// A part (trust domain, namespace or service account) is empty.
    #[error("identity has an empty {0}")]
    EmptyPart(&'static str),
    /// A part contains a NUL, control, whitespace or other forbidden character.
    #[error("identity {0} contains a forbidden character")]
    ForbiddenCharacter(&'static str),
    /// A part is `.` or `..`, or the trust domain contains `..`.
    #[error("identity {0} is a dot segment")]
    DotSegment(&'static str),
}

impl Identity {
    /// Builds an identity from its parts, validating each as [`FromStr`] does.
    pub fn new(
        trust_domain: &str,
        namespace: &str,
        service_account: &str,
    ) -> Result<Self, IdentityError> {
        format!("{SCHEME}{trust_domain}{NS}{namespace}{SA}{service_account}").parse()
    }

    /// Checks that a namespace and a service account can be parts of an
    /// identity (with any valid trust domain): what a workload store must
    /// know before it hands the pair to a proxy, which rejects a workload
    /// whose identity does not parse.
    pub fn check_parts(namespace: &str, service_account: &str) -> Result<(), IdentityError> {
        check_part("namespace", namespace)?;
        check_part("service account", service_account)
    }

    /// The trust domain, e.g. `cluster.local`.
    pub fn trust_domain(&self) -> &str {
        let end = usize::from(self.trust_domain_end);
        self.part(SCHEME.len(), end)
    }

    /// The Kubernetes namespace.
    pub fn namespace(&self) -> &str {
        let start = usize::from(self.trust_domain_end) + NS.len();
        self.part(start, usize::from(self.namespace_end))
    }

    /// The Kubernetes service account.
    pub fn service_account(&self) -> &str {
        let start = usize::from(self.namespace_end) + SA.len();
        self.part(start, self.uri.len())
    }

    /// The full URI, `spiffe://...`.
    pub fn as_str(&self) -> &str {
        &self.uri
    }

    /// The full URI as a shared string: a reference count, not a copy.
    pub fn shared_str(&self) -> Arc<str> {
        Arc::clone(&self.uri)
    }

    /// How many clones of this identity are alive (this one included): a
    /// store that shares one copy among its entries can tell which copies
    /// only it still holds.
    pub fn shared_count(&self) -> usize {
        Arc::strong_count(&self.uri)
    }

    fn part(&self, start: usize, end: usize) -> &str {
        self.uri.get(start..end).unwrap_or_default()
    }
}

impl FromStr for Identity {
    type Err = IdentityError;

    fn from_str(uri: &str) -> Result<Self, Self::Err> {
        if uri.len() > MAX_LEN {
            return Err(IdentityError::TooLong);
        }
        let path = uri.strip_prefix(SCHEME).ok_or(IdentityError::Scheme)?;
        let segments: Vec<&str> = path.split('/').collect();
        let [trust_domain, "ns", namespace, "sa", service_account] = segments[..] else {
            return Err(IdentityError::Shape);
        };
        check_part("trust domain", trust_domain)?;
        if trust_domain.contains("..") {
            return Err(IdentityError::DotSegment("trust domain"));
        }
        check_part("namespace", namespace)?;
        check_part("service account", service_account)?;

        // Both ends are below `MAX_LEN`, checked above, so they fit.
        let trust_domain_end = SCHEME.len() + trust_domain.len();
        let namespace_end = trust_domain_end + NS.len() + namespace.len();
        let (Ok(trust_domain_end), Ok(namespace_end)) = (
            u16::try_from(trust_domain_end),
            u16::try_from(namespace_end),
        ) else {
            return Err(IdentityError::TooLong);
        };
        Ok(Identity {
            uri: Arc::from(uri),
            trust_domain_end,
            namespace_end,
        })
    }
}

/// Rejects empty parts, dot segments, and characters that have no place in a
/// Kubernetes name or DNS label and could confuse logs or comparisons.
fn check_part(what: &'static str, part: &str) -> Result<(), IdentityError> {
    if part.is_empty() {
        return Err(IdentityError::EmptyPart(what));
    }
    if part == "." || part == ".." {
        return Err(IdentityError::DotSegment(what));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    if !part.chars().all(allowed) {
        return Err(IdentityError::ForbiddenCharacter(what));
    }
    Ok(())
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.uri)
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({})", self.uri)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_identities_parse_into_parts() {
        let cases = [
            (
                "spiffe://cluster.local/ns/default/sa/default",
                "cluster.local",
                "default",
                "default",
            ),
            (
                "spiffe://td/ns/istio-system/sa/ztunnel",
                "td",
                "istio-system",
                "ztunnel",
            ),
            (
                "spiffe://example.org/ns/a_b/sa/x.y-z",
                "example.org",
                "a_b",
                "x.y-z",
            ),
        ];
        for (uri, td, ns, sa) in cases {
            let id: Identity = uri.parse().unwrap_or_else(|e| panic!("{uri}: {e}"));
            assert_eq!(id.trust_domain(), td, "{uri}");
            assert_eq!(id.namespace(), ns, "{uri}");
            assert_eq!(id.service_account(), sa, "{uri}");
            assert_eq!(id.to_string(), uri);
            assert_eq!(Identity::new(td, ns, sa).unwrap(), id);
        }
    }

    #[test]
    fn bad_identities_are_rejected_with_the_reason() {
        use IdentityError::*;
        let long = format!("spiffe://td/ns/{}/sa/b", "a".repeat(MAX_LEN));
        let cases: &[(&str, IdentityError)] = &[
            ("", Scheme),
            ("http://td/ns/a/sa/b", Scheme),
            ("SPIFFE://td/ns/a/sa/b", Scheme),
            ("spiffe:/td/ns/a/sa/b", Scheme),
            ("spiffe://td/ns/a/sa", Shape),
            ("spiffe://td/ns/a/sa/b/c", Shape),
            ("spiffe://td/ns/a/sa/b/", Shape),
            ("spiffe://td/namespace/a/sa/b", Shape),
            ("spiffe://td/ns/a/serviceaccount/b", Shape),
            ("spiffe://td/sa/a/ns/b", Shape),
            ("spiffe:///ns/a/sa/b", EmptyPart("trust domain")),
            ("spiffe://td/ns//sa/b", EmptyPart("namespace")),
            ("spiffe://td/ns/a/sa/", EmptyPart("service account")),
            ("spiffe://td/ns/../sa/b", DotSegment("namespace")),
            ("spiffe://td/ns/a/sa/..", DotSegment("service account")),
            ("spiffe://td/ns/./sa/b", DotSegment("namespace")),
            ("spiffe://a..b/ns/a/sa/b", DotSegment("trust domain")),
            ("spiffe://td/ns/a\0b/sa/b", ForbiddenCharacter("namespace")),
            (
                "spiffe://td/ns/a/sa/b\n",
                ForbiddenCharacter("service account"),
            ),
            (
                "spiffe://t\x7fd/ns/a/sa/b",
                ForbiddenCharacter("trust domain"),
            ),
            ("spiffe://td/ns/a b/sa/b", ForbiddenCharacter("namespace")),
            (
                "spiffe://td:443/ns/a/sa/b",
                ForbiddenCharacter("trust domain"),
            ),
            ("spiffe://td/ns/a%2f/sa/b", ForbiddenCharacter("namespace")),
            ("spiffe://td/ns/é/sa/b", ForbiddenCharacter("namespace")),
            (
                "spiffe://td/ns/a/sa/b?x",
                ForbiddenCharacter("service account"),
            ),
            (
                "spiffe://td/ns/a/sa/b#x",
                ForbiddenCharacter("service account"),
            ),
            (&long, TooLong),
        ];
        for (uri, want) in cases {
            assert_eq!(uri.parse::<Identity>().as_ref(), Err(want), "{uri:?}");
        }
    }
}
