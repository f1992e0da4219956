//! Versions, generations, shared entries, and the diff every response is
//! made of.

use super::*;
use ztunnel_mesh::MeshFile;

fn snapshot(yaml: &str) -> MeshSnapshot {
    let file: MeshFile = serde_yaml_ng::from_str(yaml).unwrap();
    MeshSnapshot::new(file).unwrap()
}

fn pods(ips: &[(&str, &str)]) -> String {
    let mut yaml = String::from("pods:\n");
    for (uid, ip) in ips {
        yaml.push_str(&format!(
            "- {{name: {uid}, namespace: n, uid: {uid}, serviceAccount: s, nodeName: a, ips: [{ip}]}}\n"
        ));
    }
    yaml
}

fn build(yaml: &str, previous: &MeshResources) -> MeshResources {
    MeshResources::build(&snapshot(yaml), "cluster.local", previous)
}

fn names(resources: &[Arc<Entry>]) -> Vec<&str> {
    resources.iter().map(|entry| &*entry.name).collect()
}

#[test]
fn versions_follow_content_and_unchanged_sets_are_kept() {
    let one = build(
        &pods(&[("a", "10.0.0.1"), ("b", "10.0.0.2")]),
        &MeshResources::empty(),
    );
    let again = build(&pods(&[("b", "10.0.0.2"), ("a", "10.0.0.1")]), &one);
    let addresses = one.get(ResourceKind::Address);
    assert_eq!(addresses.generation(), 1);
    assert!(
        Arc::ptr_eq(addresses, again.get(ResourceKind::Address)),
        "same content (in another order) is the same set"
    );
    assert!(Arc::ptr_eq(
        one.get(ResourceKind::Authorization),
        again.get(ResourceKind::Authorization)
    ));

    let fresh = build(
        &pods(&[("a", "10.0.0.1"), ("b", "10.0.0.2")]),
        &MeshResources::empty(),
    );
    let version = |set: &MeshResources, name: &str| {
        set.get(ResourceKind::Address)
            .get(name)
            .unwrap()
            .version
            .clone()
    };
    assert_eq!(
        version(&one, "a"),
        version(&fresh, "a"),
        "stable across builds from scratch"
    );
    assert_eq!(version(&one, "a").len(), 16);
    assert_ne!(version(&one, "a"), version(&one, "b"));

    let moved = build(&pods(&[("a", "10.0.0.9"), ("c", "10.0.0.3")]), &one);
    let set = moved.get(ResourceKind::Address);
    assert_eq!(set.generation(), 2);
    assert_ne!(version(&moved, "a"), version(&one, "a"));
    let changes = set.changes();
    assert_eq!(changes.from, 1);
    assert_eq!(changes.updated, [Arc::from("a"), Arc::from("c")]);
    assert_eq!(changes.removed, [Arc::from("b")]);
    let entry = set.get("c").unwrap();
    let resource = Resource::decode(entry.encoded.clone()).unwrap();
    assert_eq!(
        (resource.name.as_str(), &resource.version),
        ("c", &entry.version)
    );
    let any = resource.resource.unwrap();
    assert_eq!(any.type_url, ztunnel_proto::xds_types::ADDRESS_TYPE_URL);
    assert!(ztunnel_proto::istio::workload::Address::decode(any.value.as_slice()).is_ok());
}

#[test]
fn a_client_is_sent_what_differs_from_what_it_knows() {
    let g1 = build(
        &pods(&[("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3")]),
        &MeshResources::empty(),
    );
    let g2 = build(
        &pods(&[("a", "10.0.0.1"), ("b", "10.0.0.22"), ("d", "10.0.0.4")]),
        &g1,
    );
    let g3 = build(
        &pods(&[("a", "10.0.0.11"), ("b", "10.0.0.22"), ("d", "10.0.0.4")]),
        &g2,
    );
    let [s1, s2, s3] = [&g1, &g2, &g3].map(|g| g.get(ResourceKind::Address).as_ref());
    let version = |set: &ResourceSet, name: &str| set.get(name).unwrap().version.clone();

    let reconnect: HashMap<String, String> = [
        ("a".to_owned(), version(s1, "a")),   // current: not sent
        ("b".to_owned(), version(s1, "b")),   // stale: sent
        ("c".to_owned(), version(s1, "c")),   // gone: removed
        ("zz".to_owned(), "whatever".into()), // never existed: removed
    ]
    .into();
    // (case, what the client knows, target, updated names, removed names)
    type Case<'a> = (
        &'a str,
        Known<'a>,
        &'a ResourceSet,
        &'a [&'a str],
        &'a [&'a str],
    );
    let cases: [Case<'_>; 6] = [
        (
            "nothing known",
            Known::Versions(&HashMap::new()),
            s2,
            &["a", "b", "d"],
            &[],
        ),
        (
            "reconnect",
            Known::Versions(&reconnect),
            s2,
            &["b", "d"],
            &["c", "zz"],
        ),
        ("up to date", Known::Sent(s2), s2, &[], &[]),
        (
            "one behind (shared changes)",
            Known::Sent(s1),
            s2,
            &["b", "d"],
            &["c"],
        ),
        (
            "two behind (full diff)",
            Known::Sent(s1),
            s3,
            &["a", "b", "d"],
            &["c"],
        ),
        ("one behind again", Known::Sent(s2), s3, &["a"], &[]),
    ];
    for (case, known, target, want_updated, want_removed) in cases {
        let (updated, removed) = changes_since(known, target);
        assert_eq!(names(&updated), want_updated, "{case}");
        let removed: Vec<&str> = removed.iter().map(|name| &**name).collect();
        assert_eq!(removed, want_removed, "{case}");
    }
}
