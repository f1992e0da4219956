//! What a client in ns1 on network nw1 gets for each name, one row per
//! case of istio/ztunnel's lookup table (AMBIENT.md §5 "Tests") plus our
//! own, against a state with the same services.

use std::net::IpAddr;

use hickory_proto::op::Query;
use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::state::{IpFamilies, NetworkAddress, Workload};

const NW1: &str = "nw1";
const NW2: &str = "nw2";

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// A service `host` in `namespace` with VIPs on networks.
fn service(namespace: &str, host: &str, vips: &[(&str, &str)]) -> Service {
    let mut service = Service::for_test(namespace, host, &[], &[]);
    service.vips = vips
        .iter()
        .map(|(network, address)| NetworkAddress {
            network: (*network).into(),
            address: ip(address),
        })
        .collect();
    service
}

fn kube(name: &str, namespace: &str, vips: &[(&str, &str)]) -> Service {
    service(
        namespace,
        &format!("{name}.{namespace}.svc.cluster.local"),
        vips,
    )
}

fn endpoint(uid: &str, service: &str, addresses: &[&str]) -> Workload {
    let addresses: Vec<IpAddr> = addresses.iter().map(|text| ip(text)).collect();
    let mut workload = Workload::for_test(uid, "ns1", &addresses);
    workload.network = NW1.into();
    workload.services = [(service.parse().unwrap(), Default::default())]
        .into_iter()
        .collect();
    workload
}

fn state() -> State {
    let mut state = State::new();
    let canonical = |mut service: Service| {
        service.canonical = true;
        service
    };
    let mut headless_ipv6 = kube("headless-ipv6", "ns1", &[]);
    headless_ipv6.ip_families = IpFamilies::Ipv6Only;
    let mut nslocal = kube("nslocal", "ns2", &[(NW1, "10.10.10.240")]);
    nslocal.visibility = Visibility::Namespace;
    let mut nslocalsame = kube("nslocalsame", "ns1", &[(NW1, "10.10.10.241")]);
    nslocalsame.visibility = Visibility::Namespace;
    let details = service(
        "ns2",
        "details.ns2.svc.cluster.remote",
        &[
            (NW1, "11.11.11.11"),
            (NW1, "12.12.12.12"),
            (NW1, "13.13.13.13"),
            (NW1, "14.14.14.14"),
        ],
    );
    let services = [
        service("external", "www.google.com", &[(NW1, "1.1.1.1")]),
        kube("productpage", "ns1", &[(NW1, "9.9.9.9")]),
        kube("example", "ns2", &[(NW1, "10.10.10.10")]),
        nslocal,
        nslocalsame,
        service("ns2", "everywhere.io", &[(NW1, "10.10.10.110")]),
        service("ns2", "preferred.io", &[(NW1, "10.10.10.210")]),
        service("preferred", "everywhere.io", &[(NW1, "10.10.10.111")]),
        service("preferred", "preferred.io", &[(NW1, "10.10.10.211")]),
        service("ns1", "everywhere.io", &[(NW1, "10.10.10.112")]),
        service("ns2", "canonical.svc", &[(NW1, "10.10.10.140")]),
        canonical(service("ns3", "canonical.svc", &[(NW1, "10.10.10.141")])),
        service("ns1", "canonical.with.local", &[(NW1, "10.10.10.150")]),
        canonical(service(
            "ns2",
            "canonical.with.local",
            &[(NW1, "10.10.10.151")],
        )),
        details,
        service("external", "ipv4.localhost", &[(NW1, "2.2.2.2")]),
        service(
            "external",
            "ipv6.localhost",
            &[(NW1, "2001:db8::ff00:42:8329")],
        ),
        service(
            "external",
            "dual.localhost",
            &[(NW1, "2.2.2.2"), (NW1, "2001:db8::ff00:42:8329")],
        ),
        service("external", "*.wildcard", &[(NW1, "10.10.10.10")]),
        service("external", "*.b.wildcard", &[(NW1, "11.11.11.11")]),
        service("external", "*.svc.mesh.company.net", &[(NW1, "10.1.2.3")]),
        kube("nw2-only", "ns1", &[(NW2, "20.20.20.20")]),
        kube(
            "both-networks",
            "ns1",
            &[(NW1, "21.21.21.21"), (NW2, "22.22.22.22")],
        ),
        kube("headless", "ns1", &[]),
        service("ns1", "headless.example.com", &[]),
        service("ns1", "headless-no-endpoints.example.com", &[]),
        headless_ipv6,
    ];
    for service in services {
        state.insert_service(service);
    }
    let headless = "ns1/headless.ns1.svc.cluster.local";
    state.insert_workload(endpoint(
        "headless0",
        headless,
        &["30.30.30.30", "2001:db8::30"],
    ));
    state.insert_workload(endpoint(
        "headless1",
        headless,
        &["31.31.31.31", "2001:db8::31"],
    ));
    let external = "ns1/headless.example.com";
    state.insert_workload(endpoint("external0", external, &["32.32.32.32"]));
    let v6 = "ns1/headless-ipv6.ns1.svc.cluster.local";
    state.insert_workload(endpoint("headless2", v6, &["33.33.33.33", "2001:db8::33"]));
    state
}

fn settings() -> Settings {
    Settings {
        preferred_namespace: Some("preferred".into()),
        ..Settings::default()
    }
}

fn client() -> Client {
    Client {
        namespace: "ns1".into(),
        network: NW1.into(),
    }
}

fn request(host: &str, kind: RecordType) -> Message {
    let mut request = Message::query();
    request.metadata.recursion_desired = true;
    request.add_query(Query::query(Name::from_ascii(host).unwrap(), kind));
    request
}

/// The decision for `host`, its answers as sorted `owner TYPE data` lines
/// (`forward` when forwarded).
fn lookup(host: &str, kind: RecordType, settings: &Settings, state: &State) -> Vec<String> {
    let request = request(host, kind);
    let mut rng = StdRng::seed_from_u64(7);
    match decide(&request, Some(&client()), settings, state, &mut rng) {
        Decision::Forward => vec!["forward".to_owned()],
        Decision::Answer(response) => {
            assert_eq!(
                response.metadata.response_code,
                ResponseCode::NoError,
                "{host}"
            );
            assert!(response.metadata.authoritative, "{host}");
            assert!(response.metadata.recursion_available, "{host}");
            assert_eq!(response.metadata.id, request.metadata.id);
            let mut lines: Vec<String> = response
                .answers
                .iter()
                .map(|record| {
                    assert_eq!(record.ttl, TTL);
                    format!("{} {} {}", record.name, record.record_type(), record.data)
                })
                .collect();
            // Addresses come shuffled; a CNAME always comes first.
            let cname = usize::from(lines.first().is_some_and(|line| line.contains("CNAME")));
            lines[cname..].sort();
            lines
        }
    }
}

#[test]
fn each_name_gets_what_istio_ztunnel_answers() {
    use RecordType::{A, AAAA, NS};
    let state = state();
    let settings = settings();
    #[rustfmt::skip]
    let cases: &[(&str, &str, RecordType, &[&str])] = &[
        ("unsupported record type will forward", "productpage.ns1.", NS, &["forward"]),
        ("non k8s host in local cache", "www.google.com.", A, &["www.google.com. A 1.1.1.1"]),
        ("non k8s host with search namespace yields cname+A record", "www.google.com.ns1.svc.cluster.local.", A,
            &["www.google.com.ns1.svc.cluster.local. CNAME www.google.com.", "www.google.com. A 1.1.1.1"]),
        ("non k8s host not in local cache", "www.bing.com.", A, &["forward"]),
        ("k8s host - fqdn", "productpage.ns1.svc.cluster.local.", A, &["productpage.ns1.svc.cluster.local. A 9.9.9.9"]),
        ("k8s host - name.namespace", "productpage.ns1.", A, &["productpage.ns1. A 9.9.9.9"]),
        ("k8s host - shortname", "productpage.", A, &["productpage. A 9.9.9.9"]),
        ("k8s host (name.namespace) with search namespace yields cname+A record", "productpage.ns1.ns1.svc.cluster.local.", A,
            &["productpage.ns1.ns1.svc.cluster.local. CNAME productpage.ns1.", "productpage.ns1. A 9.9.9.9"]),
        ("AAAA query for IPv4 k8s host (name.namespace) with search namespace", "productpage.ns1.ns1.svc.cluster.local.", AAAA,
            &[]),
        ("k8s host - non local namespace - name.namespace", "example.ns2.", A, &["example.ns2. A 10.10.10.10"]),
        ("k8s host - non local namespace - fqdn", "example.ns2.svc.cluster.local.", A, &["example.ns2.svc.cluster.local. A 10.10.10.10"]),
        ("namespace-scoped svc in another namespace is forwarded", "nslocal.ns2.svc.cluster.local.", A, &["forward"]),
        ("namespace-scoped svc in the client namespace resolves", "nslocalsame.ns1.svc.cluster.local.", A,
            &["nslocalsame.ns1.svc.cluster.local. A 10.10.10.241"]),
        ("k8s host - non local namespace - name.namespace.svc", "example.ns2.svc.", A, &["example.ns2.svc. A 10.10.10.10"]),
        ("k8s host - non local namespace - shortname", "example.", A, &["forward"]),
        ("remote cluster k8s svc - same ns and different domain - fqdn", "details.ns2.svc.cluster.remote.", A, &[
            "details.ns2.svc.cluster.remote. A 11.11.11.11", "details.ns2.svc.cluster.remote. A 12.12.12.12",
            "details.ns2.svc.cluster.remote. A 13.13.13.13", "details.ns2.svc.cluster.remote. A 14.14.14.14"]),
        ("remote cluster k8s svc - same ns and different domain - name.namespace", "details.ns2.", A, &["forward"]),
        ("TypeA query returns A records only", "dual.localhost.", A, &["dual.localhost. A 2.2.2.2"]),
        ("TypeAAAA query returns AAAA records only", "dual.localhost.", AAAA, &["dual.localhost. AAAA 2001:db8::ff00:42:8329"]),
        ("empty response if only AAAA records exist for typeA", "ipv6.localhost.", A, &[]),
        ("empty response if only A records exist for typeAAAA", "ipv4.localhost.", AAAA, &[]),
        ("wild card returns A record correctly", "foo.wildcard.", A, &["foo.wildcard. A 10.10.10.10"]),
        ("specific wild card returns A record correctly", "a.b.wildcard.", A, &["a.b.wildcard. A 11.11.11.11"]),
        ("wild card with domain returns A record correctly", "foo.svc.mesh.company.net.", A, &["foo.svc.mesh.company.net. A 10.1.2.3"]),
        ("wild card with namespace with domain returns A record correctly", "foo.foons.svc.mesh.company.net.", A,
            &["foo.foons.svc.mesh.company.net. A 10.1.2.3"]),
        ("wild card with search domain returns A record correctly", "foo.svc.mesh.company.net.ns1.svc.cluster.local.", A,
            &["foo.svc.mesh.company.net.ns1.svc.cluster.local. A 10.1.2.3"]),
        ("no vip on client network returns no records", "nw2-only.ns1.svc.cluster.local.", A, &[]),
        ("return vip for client network only", "both-networks.ns1.svc.cluster.local.", A,
            &["both-networks.ns1.svc.cluster.local. A 21.21.21.21"]),
        ("headless service returns workload ips for A", "headless.ns1.svc.cluster.local.", A,
            &["headless.ns1.svc.cluster.local. A 30.30.30.30", "headless.ns1.svc.cluster.local. A 31.31.31.31"]),
        ("headless service returns workload ips for AAAA", "headless.ns1.svc.cluster.local.", AAAA,
            &["headless.ns1.svc.cluster.local. AAAA 2001:db8::30", "headless.ns1.svc.cluster.local. AAAA 2001:db8::31"]),
        ("headless-ipv6 service returns records for AAAA", "headless-ipv6.ns1.svc.cluster.local.", AAAA,
            &["headless-ipv6.ns1.svc.cluster.local. AAAA 2001:db8::33"]),
        ("headless-ipv6 service returns empty for A", "headless-ipv6.ns1.svc.cluster.local.", A, &[]),
        ("k8s pod - fqdn (pod names are forwarded)", "headless.pod0.ns1.svc.cluster.local.", A, &["forward"]),
        ("k8s pod - name.domain.ns", "headless.pod0.ns1.", A, &["forward"]),
        ("headless external without IPs", "headless-no-endpoints.example.com.", A, &["forward"]),
        ("headless external", "headless.example.com.", A, &["forward"]),
        ("preferred namespace is chosen if local namespace is not defined", "preferred.io.", A, &["preferred.io. A 10.10.10.211"]),
        ("external service resolves to local namespace's address", "everywhere.io.", A, &["everywhere.io. A 10.10.10.112"]),
        ("canonical services are preferred when no ns-local hostname is present", "canonical.svc.", A, &["canonical.svc. A 10.10.10.141"]),
        ("namespace-local service should be preferred over canonical", "canonical.with.local.", A, &["canonical.with.local. A 10.10.10.150"]),
        // Our own rows.
        ("case does not matter, the owner is the name as asked", "ProductPage.NS1.", A, &["ProductPage.NS1. A 9.9.9.9"]),
    ];
    for (case, host, kind, want) in cases {
        assert_eq!(lookup(host, *kind, &settings, &state), *want, "{case}");
    }
}

#[test]
fn aaaa_is_answered_empty_when_ipv6_is_off() {
    let state = state();
    let off = Settings {
        ipv6: false,
        ..settings()
    };
    assert!(lookup("dual.localhost.", RecordType::AAAA, &off, &state).is_empty());
    assert_eq!(
        lookup("dual.localhost.", RecordType::A, &off, &state),
        ["dual.localhost. A 2.2.2.2"]
    );
}

#[test]
fn another_cluster_domain_changes_the_expansions() {
    let mut state = State::new();
    state.insert_service(service(
        "ns1",
        "web.ns1.svc.corp.internal",
        &[(NW1, "10.0.0.9")],
    ));
    let corp = Settings {
        cluster_domain: "corp.internal".into(),
        ..settings()
    };
    assert_eq!(
        lookup("web.", RecordType::A, &corp, &state),
        ["web. A 10.0.0.9"]
    );
    assert_eq!(
        lookup("web.", RecordType::A, &settings(), &state),
        ["forward"]
    );
}

#[test]
fn requests_that_are_not_plain_queries_get_their_error_code() {
    let state = state();
    let answer = |request: &Message, client: Option<&Client>| {
        let mut rng = StdRng::seed_from_u64(7);
        match decide(request, client, &settings(), &state, &mut rng) {
            Decision::Answer(response) => response.metadata.response_code,
            Decision::Forward => panic!("forwarded"),
        }
    };
    let query = request("productpage.", RecordType::A);

    let mut response = query.clone();
    response.metadata.message_type = MessageType::Response;
    assert_eq!(answer(&response, Some(&client())), ResponseCode::FormErr);

    let mut notify = query.clone();
    notify.metadata.op_code = OpCode::Notify;
    assert_eq!(answer(&notify, Some(&client())), ResponseCode::NotImp);

    let mut two = query.clone();
    two.add_query(Query::query(Name::from_ascii("a.").unwrap(), RecordType::A));
    assert_eq!(answer(&two, Some(&client())), ResponseCode::FormErr);
    let mut none = query.clone();
    none.queries.clear();
    assert_eq!(answer(&none, Some(&client())), ResponseCode::FormErr);

    // A client the proxy does not know cannot be answered for.
    assert_eq!(answer(&query, None), ResponseCode::ServFail);
}

#[test]
fn the_shuffle_changes_the_order_of_addresses_but_not_the_set() {
    let state = state();
    let request = request("details.ns2.svc.cluster.remote.", RecordType::A);
    let mut orders = std::collections::BTreeSet::new();
    for seed in 0..20 {
        let mut rng = StdRng::seed_from_u64(seed);
        let Decision::Answer(response) =
            decide(&request, Some(&client()), &settings(), &state, &mut rng)
        else {
            panic!("forwarded");
        };
        let order: Vec<String> = response
            .answers
            .iter()
            .map(|record| record.data.to_string())
            .collect();
        assert_eq!(order.len(), 4);
        orders.insert(order);
    }
    assert!(orders.len() > 1, "every answer had the same order");
}
