//! The names a query is tried under (AMBIENT.md §5.2): the name as asked,
//! its Kubernetes expansions from the client's namespace, the forms with a
//! search domain stripped, and the wildcards of each. Pure string work on
//! lower-case names without the final dot; which service a name finds is
//! `answer.rs`'s business.

/// The search list of a client in `namespace`: `<ns>.svc.<d>`, `svc.<d>`,
/// `<d>`. Fixed, as istio/ztunnel has it, rather than read from the pod's
/// resolv.conf: a pod with a custom `dnsConfig` search list gets its own
/// suffixes stripped only where they coincide with these.
pub fn search_domains(namespace: &str, cluster_domain: &str) -> [String; 3] {
    [
        format!("{namespace}.svc.{cluster_domain}"),
        format!("svc.{cluster_domain}"),
        cluster_domain.to_owned(),
    ]
}

/// The Kubernetes names `name` may be short for, from a client in
/// `namespace`, by its number of labels:
/// - `svc` → `svc.<ns>.svc.<d>`;
/// - `svc.ns` → `svc.ns.svc.<d>`, `svc.ns.<ns>.svc.<d>`;
/// - `a.b.c` → `a.b.c.<d>` when `c` is `svc`, and `a.b.c.svc.<d>`;
/// - `a.b.svc.d` (four labels ending in `svc`) → `a.b.svc.d.<d>`.
pub fn kube_fqdns(name: &str, namespace: &str, cluster_domain: &str) -> Vec<String> {
    let labels = name.split('.').count();
    let ends_in_svc = name.rsplit('.').next() == Some("svc");
    match labels {
        1 => vec![format!("{name}.{namespace}.svc.{cluster_domain}")],
        2 => vec![
            format!("{name}.svc.{cluster_domain}"),
            format!("{name}.{namespace}.svc.{cluster_domain}"),
        ],
        3 if ends_in_svc => vec![
            format!("{name}.{cluster_domain}"),
            format!("{name}.svc.{cluster_domain}"),
        ],
        3 => vec![format!("{name}.svc.{cluster_domain}")],
        4 if ends_in_svc => vec![format!("{name}.{cluster_domain}")],
        _ => Vec::new(),
    }
}

/// One name a query is tried under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    /// The name, lower case, without the final dot.
    pub name: String,
    /// The asked name with a search domain stripped, when this alias is
    /// it or one of its expansions: an exact match on the alias is
    /// answered with a CNAME from the asked name to this one.
    pub stripped: Option<String>,
}

/// Every name `asked` is tried under, in order, without repeats: the name
/// itself, its [`kube_fqdns`], then for each search domain it ends in, the
/// name without it and that name's expansions.
pub fn aliases(asked: &str, namespace: &str, cluster_domain: &str) -> Vec<Alias> {
    let mut out: Vec<Alias> = Vec::new();
    let mut add = |name: String, stripped: Option<&str>| {
        if !out.iter().any(|alias| alias.name == name) {
            let stripped = stripped.map(str::to_owned);
            out.push(Alias { name, stripped });
        }
    };
    add(asked.to_owned(), None);
    for name in kube_fqdns(asked, namespace, cluster_domain) {
        add(name, None);
    }
    for domain in search_domains(namespace, cluster_domain) {
        let Some(stripped) = asked
            .strip_suffix(domain.as_str())
            .and_then(|rest| rest.strip_suffix('.'))
            .filter(|rest| !rest.is_empty())
        else {
            continue;
        };
        add(stripped.to_owned(), Some(stripped));
        for name in kube_fqdns(stripped, namespace, cluster_domain) {
            add(name, Some(stripped));
        }
    }
    out
}

/// The wildcard names that cover `name`, most specific first:
/// `a.b.c` → `*.b.c`, `*.c`. A single label has none.
pub fn wildcards(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = name;
    while let Some((_, parent)) = rest.split_once('.') {
        out.push(format!("*.{parent}"));
        rest = parent;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOMAIN: &str = "cluster.local";

    #[test]
    fn short_names_expand_to_the_kubernetes_names_they_may_stand_for() {
        let cases: &[(&str, &[&str])] = &[
            ("name", &["name.ns1.svc.cluster.local"]),
            (
                "name.ns2",
                &[
                    "name.ns2.svc.cluster.local",
                    "name.ns2.ns1.svc.cluster.local",
                ],
            ),
            (
                "name.ns2.svc",
                &[
                    "name.ns2.svc.cluster.local",
                    "name.ns2.svc.svc.cluster.local",
                ],
            ),
            ("a.b.c", &["a.b.c.svc.cluster.local"]),
            ("name.ns2.svc.cluster", &[]),
            ("a.b.svc.d", &[]),
            ("a.b.c.svc", &["a.b.c.svc.cluster.local"]),
            ("name.ns2.svc.cluster.local", &[]),
        ];
        for (name, want) in cases {
            assert_eq!(kube_fqdns(name, "ns1", DOMAIN), *want, "{name}");
        }
    }

    #[test]
    fn wildcards_cover_every_parent_domain_most_specific_first() {
        assert_eq!(
            wildcards("foo.bar.example.com"),
            ["*.bar.example.com", "*.example.com", "*.com"]
        );
        assert_eq!(wildcards("a.b"), ["*.b"]);
        assert!(wildcards("single").is_empty());
    }

    #[test]
    fn a_name_with_a_search_domain_is_also_tried_without_it() {
        let names = |asked: &str| -> Vec<(String, Option<String>)> {
            aliases(asked, "ns1", DOMAIN)
                .into_iter()
                .map(|alias| (alias.name, alias.stripped))
                .collect()
        };
        let alias =
            |name: &str, stripped: Option<&str>| (name.to_owned(), stripped.map(str::to_owned));
        assert_eq!(
            names("www.example.com.ns1.svc.cluster.local"),
            [
                alias("www.example.com.ns1.svc.cluster.local", None),
                alias("www.example.com", Some("www.example.com")),
                alias("www.example.com.svc.cluster.local", Some("www.example.com")),
                alias("www.example.com.ns1", Some("www.example.com.ns1")),
                alias("www.example.com.ns1.svc", Some("www.example.com.ns1.svc")),
            ]
        );
        // The full name of a service is its own first alias; a stripped
        // form that expands back to it is not repeated.
        assert_eq!(
            names("svc.ns1.svc.cluster.local"),
            [
                alias("svc.ns1.svc.cluster.local", None),
                alias("svc", Some("svc")),
                alias("svc.ns1", Some("svc.ns1")),
                alias("svc.ns1.ns1.svc.cluster.local", Some("svc.ns1")),
                alias("svc.ns1.svc", Some("svc.ns1.svc")),
                alias("svc.ns1.svc.svc.cluster.local", Some("svc.ns1.svc")),
            ]
        );
        assert_eq!(
            names("svc"),
            [alias("svc", None), alias("svc.ns1.svc.cluster.local", None),]
        );
    }

    #[test]
    fn the_search_list_is_the_namespace_then_svc_then_the_domain() {
        assert_eq!(
            search_domains("ns1", "corp.internal"),
            [
                "ns1.svc.corp.internal",
                "svc.corp.internal",
                "corp.internal"
            ]
        );
    }
}
