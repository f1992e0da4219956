//! The allocator against istiod's (`ipallocate_test.go`): who is given
//! addresses, which ones, what is kept, and who moves on a conflict.

use serde_json::{Value, json};

use super::super::tests::{merged, object};
use super::*;

fn entry(name: &str, created: &str, patch: Value) -> Arc<ServiceEntry> {
    Arc::new(object(merged(
        json!({
            "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
            "spec": {"hosts": [format!("{name}.example.com")], "resolution": "DNS"},
        }),
        patch,
    )))
}

/// `name: value@host, ...` per change.
fn lines(changes: &[StatusChange]) -> Vec<String> {
    changes
        .iter()
        .map(|change| {
            let addresses: Vec<String> = change
                .addresses
                .iter()
                .map(|address| format!("{}@{}", address.value, address.host))
                .collect();
            format!("{}: {}", change.name, addresses.join(", "))
        })
        .collect()
}

const T0: &str = "2026-01-01T00:00:00Z";
const T1: &str = "2026-01-02T00:00:00Z";

#[test]
fn service_entry_allocation_follows_istiods_allocator() {
    // (case, entries, changes)
    #[allow(clippy::type_complexity)]
    let cases: Vec<(&str, Vec<Arc<ServiceEntry>>, Vec<&str>)> = vec![
        (
            "one host: the first IPv4 and IPv6 address of istiod's ranges",
            vec![entry("a", T0, json!({}))],
            vec!["a: 240.240.0.1@a.example.com, 2001:2::1@a.example.com"],
        ),
        (
            "several hosts, several entries: one pair per host, oldest entry first",
            vec![
                entry("b", T1, json!({})),
                entry(
                    "a",
                    T0,
                    json!({"spec": {"hosts": ["x.example.com", "y.example.com"]}}),
                ),
            ],
            vec![
                "a: 240.240.0.1@x.example.com, 2001:2::1@x.example.com, 240.240.0.2@y.example.com, 2001:2::2@y.example.com",
                "b: 240.240.0.3@b.example.com, 2001:2::3@b.example.com",
            ],
        ),
        (
            "addresses already in the status are kept: nothing to write",
            vec![entry(
                "a",
                T0,
                json!({"status": {"addresses": [
                {"value": "240.240.0.9", "host": "a.example.com"}]}}),
            )],
            vec![],
        ),
        (
            "a host added keeps the others' addresses and takes a free pair",
            vec![entry(
                "a",
                T0,
                json!({"spec": {"hosts": ["a.example.com", "new.example.com"]},
                "status": {"addresses": [{"value": "240.240.0.1", "host": "a.example.com"}]}}),
            )],
            vec![
                "a: 240.240.0.1@a.example.com, 240.240.0.2@new.example.com, 2001:2::1@new.example.com",
            ],
        ),
        (
            "resolution NONE, written addresses, the opt-out label: none given",
            vec![
                entry("none", T0, json!({"spec": {"resolution": "NONE"}})),
                entry("written", T0, json!({"spec": {"addresses": ["10.0.0.1"]}})),
                entry(
                    "out",
                    T0,
                    json!({"metadata": {"labels": {
                    "networking.istio.io/enable-autoallocate-ip": "False"}}}),
                ),
            ],
            vec![],
        ),
        (
            "no longer wanting addresses clears the stale ones",
            vec![entry(
                "a",
                T0,
                json!({"spec": {"resolution": "NONE"},
                "status": {"addresses": [{"value": "240.240.0.1", "host": "a.example.com"}]}}),
            )],
            vec!["a: "],
        ),
        (
            "a wildcard host only with DYNAMIC_DNS",
            vec![
                entry("dns", T0, json!({"spec": {"hosts": ["*.dns.example.com"]}})),
                entry(
                    "dyn",
                    T0,
                    json!({"spec": {"hosts": ["*.dyn.example.com"], "resolution": "DYNAMIC_DNS"}}),
                ),
            ],
            vec!["dyn: 240.240.0.1@*.dyn.example.com, 2001:2::1@*.dyn.example.com"],
        ),
        (
            "two entries holding one address: the older keeps it, the newer moves",
            vec![
                entry(
                    "newer",
                    T1,
                    json!({"status": {"addresses": [{"value": "240.240.0.1", "host": "newer.example.com"}]}}),
                ),
                entry(
                    "older",
                    T0,
                    json!({"status": {"addresses": [{"value": "240.240.0.1", "host": "older.example.com"}]}}),
                ),
            ],
            vec!["newer: 240.240.0.2@newer.example.com, 2001:2::1@newer.example.com"],
        ),
        (
            "an address another entry writes in its spec moves the allocated one",
            vec![
                entry("user", T1, json!({"spec": {"addresses": ["240.240.0.1"]}})),
                entry(
                    "auto",
                    T0,
                    json!({"status": {"addresses": [{"value": "240.240.0.1", "host": "auto.example.com"}]}}),
                ),
            ],
            vec!["auto: 240.240.0.2@auto.example.com, 2001:2::1@auto.example.com"],
        ),
    ];
    for (case, entries, expected) in cases {
        assert_eq!(lines(&allocate(&entries)), expected, "{case}");
    }
}

#[test]
fn service_entry_allocation_is_applied_in_memory_for_the_mesh_file() {
    let entries = vec![entry("a", T0, json!({}))];
    let applied = with_allocations(&entries);
    assert_eq!(
        allocated_addresses(&applied[0]).get("a.example.com"),
        Some(&vec![
            "240.240.0.1".parse().unwrap(),
            "2001:2::1".parse().unwrap()
        ])
    );
    assert_eq!(
        allocate(&applied),
        [],
        "once applied, nothing left to change"
    );
}
