//! What the proxy does with one parsed query (AMBIENT.md §5.3–5.4): answer
//! it from the mesh's services, or leave it to the upstream. A plain
//! function of the request, the client, the settings and the state; the
//! names tried are `name.rs`'s, putting the answer on the wire (EDNS,
//! truncation) is `wire.rs`'s, and moving bytes is `server.rs`'s.

use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use rand::Rng;
use rand::seq::SliceRandom;

use super::name::{self, Alias};
use crate::state::{Service, State, Visibility};

/// TTL of every locally answered record, as istio/ztunnel sets it: short
/// enough that a changed VIP reaches clients quickly, long enough that a
/// client's cache takes the repeated lookups of one connection burst.
pub const TTL: u32 = 30;

/// What the proxy knows about the settings that shape its answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `CLUSTER_DOMAIN`: the suffix of Kubernetes service names.
    pub cluster_domain: Arc<str>,
    /// `IPV6_ENABLED`: AAAA questions get IPv6 VIPs only when on.
    pub ipv6: bool,
    /// `PREFERED_SERVICE_NAMESPACE`: which namespace wins, after the
    /// client's own and the canonical service, when several namespaces
    /// have a service of one hostname.
    pub preferred_namespace: Option<Arc<str>>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            cluster_domain: Arc::from("cluster.local"),
            ipv6: true,
            preferred_namespace: None,
        }
    }
}

/// The workload that asked, as far as answers depend on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    /// Its namespace: the search list, and which services it may see.
    pub namespace: Arc<str>,
    /// Its network: which VIPs it is given.
    pub network: Arc<str>,
}

/// What happens to a query.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Send this response (before EDNS and truncation).
    Answer(Message),
    /// Ask the upstream resolver and relay its response.
    Forward,
}

/// Decides what to do with `request` from `client` (`None`: the asking
/// workload is unknown). `rng` shuffles the answered addresses.
pub fn decide(
    request: &Message,
    client: Option<&Client>,
    settings: &Settings,
    state: &State,
    rng: &mut impl Rng,
) -> Decision {
    let reject = |code| Decision::Answer(response(request, code));
    if request.metadata.message_type != MessageType::Query {
        return reject(ResponseCode::FormErr);
    }
    if request.metadata.op_code != OpCode::Query {
        return reject(ResponseCode::NotImp);
    }
    let [query] = request.queries.as_slice() else {
        return reject(ResponseCode::FormErr);
    };
    let Some(client) = client else {
        return reject(ResponseCode::ServFail);
    };
    let family = match query.query_type() {
        RecordType::A => Family::V4,
        RecordType::AAAA => Family::V6,
        _ => return Decision::Forward,
    };
    let asked = query.name();
    let lower = asked.to_lowercase().to_ascii();
    let lower = lower.strip_suffix('.').unwrap_or(&lower);
    let Some(found) = find(lower, client, settings, state) else {
        return Decision::Forward;
    };

    let mut answer = response(request, ResponseCode::NoError);
    answer.metadata.authoritative = true;
    let mut addresses = if family == Family::V6 && !settings.ipv6 {
        Vec::new()
    } else {
        addresses(found.service, family, client, state)
    };
    // A known name without records of the type is an empty NOERROR: no
    // CNAME either, as istio/ztunnel answers it.
    if addresses.is_empty() {
        return Decision::Answer(answer);
    }
    let mut owner = asked.clone();
    if let Some(stripped) = &found.alias.stripped
        && !found.wildcard
        && let Ok(target) = Name::from_ascii(format!("{stripped}."))
    {
        answer.add_answer(Record::from_rdata(
            asked.clone(),
            TTL,
            RData::CNAME(CNAME(target.clone())),
        ));
        owner = target;
    }
    addresses.shuffle(rng);
    for address in addresses {
        let data = match address {
            IpAddr::V4(v4) => RData::A(A(v4)),
            IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
        };
        answer.add_answer(Record::from_rdata(owner.clone(), TTL, data));
    }
    Decision::Answer(answer)
}

/// A response to `request` with `code` and no records: the request's id,
/// opcode, question and RD flag, RA set. The skeleton of every local
/// response.
pub fn response(request: &Message, code: ResponseCode) -> Message {
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata.response_code = code;
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.recursion_available = true;
    response.add_queries(request.queries.iter().cloned());
    response
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

impl Family {
    fn holds(self, ip: IpAddr) -> bool {
        match self {
            Family::V4 => ip.is_ipv4(),
            Family::V6 => ip.is_ipv6(),
        }
    }
}

/// A service found for a query, and under which name.
struct Found<'a> {
    service: &'a Service,
    alias: Alias,
    /// Whether it was found through a wildcard of the alias.
    wildcard: bool,
}

/// The first service found under the aliases of `asked`, each tried
/// exactly, then by its wildcards.
fn find<'a>(
    asked: &str,
    client: &Client,
    settings: &Settings,
    state: &'a State,
) -> Option<Found<'a>> {
    let domain = &*settings.cluster_domain;
    for alias in name::aliases(asked, &client.namespace, domain) {
        if let Some(service) = pick(&alias.name, client, settings, state) {
            return Some(Found {
                service,
                alias,
                wildcard: false,
            });
        }
        for wildcard in name::wildcards(&alias.name) {
            if let Some(service) = pick(&wildcard, client, settings, state) {
                return Some(Found {
                    service,
                    alias,
                    wildcard: true,
                });
            }
        }
    }
    None
}

/// Of the services named `hostname` that the client may see and that can
/// be answered, the one it gets: its own namespace's, else the canonical
/// one, else the preferred namespace's, else the first by namespace.
fn pick<'a>(
    hostname: &str,
    client: &Client,
    settings: &Settings,
    state: &'a State,
) -> Option<&'a Service> {
    let headless_suffix = format!(".svc.{}", settings.cluster_domain);
    let mut candidates = state.services_by_hostname(hostname).filter(|service| {
        let visible =
            service.visibility == Visibility::Public || service.namespace == client.namespace;
        // A service without a VIP is answered only when it is a headless
        // Kubernetes service (its endpoints' addresses); a ServiceEntry
        // without addresses is left to the upstream.
        let answerable = !service.vips.is_empty() || service.hostname.ends_with(&headless_suffix);
        visible && answerable
    });
    let first = candidates.next()?;
    let rest: Vec<&Arc<Service>> = candidates.collect();
    let all = || std::iter::once(first).chain(rest.iter().copied());
    let chosen = all()
        .find(|service| service.namespace == client.namespace)
        .or_else(|| all().find(|service| service.canonical))
        .or_else(|| {
            let preferred = settings.preferred_namespace.as_deref()?;
            all().find(|service| &*service.namespace == preferred)
        })
        .unwrap_or(first);
    Some(chosen)
}

/// The addresses of `service` in `family` for `client`: its VIPs on the
/// client's network, or for a headless service, the first address of that
/// family of each endpoint; never a family its `ip_families` excludes.
fn addresses(service: &Service, family: Family, client: &Client, state: &State) -> Vec<IpAddr> {
    let admitted = |ip: IpAddr| family.holds(ip) && service.ip_families.accepts(ip);
    if !service.vips.is_empty() {
        return service
            .vips
            .iter()
            .filter(|vip| vip.network == client.network && admitted(vip.address))
            .map(|vip| vip.address)
            .collect();
    }
    state
        .endpoints(&service.key())
        .filter_map(|workload| workload.addresses.iter().copied().find(|ip| admitted(*ip)))
        .collect()
}

#[cfg(test)]
mod tests;
