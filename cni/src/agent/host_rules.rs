//! The node's side of kubelet probes (WIRE.md §6, "Host netns"): the
//! ipsets `istio-inpod-probes-v4` and `istio-inpod-probes-v6`, holding the
//! IPs of the ambient pods on this node, and the nat chain `ISTIO_POSTRT`,
//! jumped to first from `POSTROUTING`, that SNATs the node's own TCP
//! connections to those IPs (kubelet probes) to the probe address. Inside
//! the pod, row 8 of the in-pod rules lets that source through unproxied.
//!
//! The core is pure: [`restore_input`] turns the node's current
//! `iptables-save -t nat` text into one `iptables-restore --noflush`
//! transaction that leaves exactly one copy of ours (or none), and
//! [`sync_changes`] and [`ipset_input`] decide and spell the membership
//! changes. [`HostRules`] runs the tools in the calling thread's netns,
//! which for the agent is the node's. The in-pod rules live in rules.rs.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

use ztunnel_certs::error_chain::ErrorChain;

use super::netns::{self, NetnsError};
use super::rules::Family;

/// Our chain in the nat table.
const CHAIN: &str = "ISTIO_POSTRT";
/// The one jump to [`CHAIN`], as `iptables-save` prints it after `-A `.
const JUMP: &str = "POSTROUTING -j ISTIO_POSTRT";
/// The set of IPv4 pod IPs, WIRE.md §1.
const SET_V4: &str = "istio-inpod-probes-v4";
/// The set of IPv6 pod IPs, WIRE.md §1.
const SET_V6: &str = "istio-inpod-probes-v6";
/// Both families, in the order they are set up.
const FAMILIES: [Family; 2] = [Family::V4, Family::V6];
/// How often `ipset destroy` is tried. With the nf_tables backend the
/// kernel drops a deleted rule's reference to a set in deferred work, so
/// just after the rule goes the set can still read as in use.
const DESTROY_ATTEMPTS: usize = 10;
/// The pause between two `ipset destroy` attempts; the deferred work
/// normally finishes within milliseconds.
const DESTROY_PAUSE: Duration = Duration::from_millis(50);

/// The host-netns probe SNAT of this node. Every method is blocking (it
/// runs `ipset` and the iptables tools) and acts on the calling thread's
/// netns, or on the node's netns given to [`HostRules::in_netns`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRules {
    /// The source IPv4 probes get, which the in-pod rules let through.
    probe_snat_ipv4: Ipv4Addr,
    /// The IPv6 form of [`HostRules::probe_snat_ipv4`].
    probe_snat_ipv6: Ipv6Addr,
    /// The node's netns, entered for every change, when the agent runs in
    /// a netns of its own.
    netns: Option<PathBuf>,
}

impl HostRules {
    /// The probe SNAT to the given probe addresses (the agent's
    /// `probe_snat_ipv4` and `probe_snat_ipv6` settings).
    pub fn new(probe_snat_ipv4: Ipv4Addr, probe_snat_ipv6: Ipv6Addr) -> HostRules {
        HostRules {
            probe_snat_ipv4,
            probe_snat_ipv6,
            netns: None,
        }
    }

    /// The same rules, kept in the netns at `path` (e.g. the host's
    /// `/proc/1/ns/net`, as istio-cni does when it is not on the host's
    /// network) instead of the calling thread's.
    pub fn in_netns(mut self, path: PathBuf) -> HostRules {
        self.netns = Some(path);
        self
    }

    /// Runs `f` in the node's netns.
    fn in_node<R: Send>(
        &self,
        f: impl FnOnce() -> Result<R, HostRulesError> + Send,
    ) -> Result<R, HostRulesError> {
        match &self.netns {
            None => f(),
            Some(path) => netns::run_in(path, f)?,
        }
    }

    /// Creates both ipsets if missing, then puts `ISTIO_POSTRT` with
    /// exactly one copy of its rule and exactly one jump, first in nat
    /// `POSTROUTING`. A second call changes nothing; an earlier copy with
    /// another SNAT address is replaced. IPv6 rules are skipped, with a
    /// warning, where ip6tables does not work.
    pub fn install(&self) -> Result<(), HostRulesError> {
        self.in_node(|| {
            let existing = families_with_set()?;
            for family in FAMILIES {
                if !existing.contains(&family) {
                    // `-exist`: another agent may create it at the same time.
                    netns::command(
                        "ipset",
                        &[
                            "create",
                            set_name(family),
                            "hash:ip",
                            "family",
                            set_family(family),
                            "-exist",
                        ],
                        None,
                    )?;
                }
            }
            apply_nat(
                Family::V4,
                &nat_saved(Family::V4)?,
                Some(&snat_rule(Family::V4, self.probe_snat_ipv4.into())),
            )?;
            // Reading the current rules is also the test that ip6tables works.
            match nat_saved(Family::V6) {
                Ok(saved) => apply_nat(
                    Family::V6,
                    &saved,
                    Some(&snat_rule(Family::V6, self.probe_snat_ipv6.into())),
                )?,
                Err(error) => tracing::warn!(
                    error = %ErrorChain(&error),
                    "ip6tables does not work in the node's netns; probes of IPv6 pods are not SNATed"
                ),
            }
            Ok(())
        })
    }

    /// Adds a pod's IPs to the set of their family; IPs already there are
    /// fine. The sets must exist ([`HostRules::install`]).
    pub fn add_pod(&self, ips: &[IpAddr]) -> Result<(), HostRulesError> {
        self.in_node(|| change_members(&ipset_input(ips, &[])))
    }

    /// Removes a pod's IPs from the sets; IPs not there are fine.
    pub fn remove_pod(&self, ips: &[IpAddr]) -> Result<(), HostRulesError> {
        self.in_node(|| change_members(&ipset_input(&[], ips)))
    }

    /// Makes the two sets hold exactly `ips`, as at start-up: members not
    /// listed are removed and missing ones added. Returns what changed, so
    /// the caller can log repairs.
    pub fn sync(&self, ips: &[IpAddr]) -> Result<SyncReport, HostRulesError> {
        self.in_node(|| {
            let mut current = Vec::new();
            for family in FAMILIES {
                let set = set_name(family);
                let saved = netns::command("ipset", &["save", set], None)?;
                current.extend(parse_members(&saved, set)?);
            }
            let report = sync_changes(&current, ips);
            change_members(&ipset_input(&report.added, &report.removed))?;
            Ok(report)
        })
    }

    /// Removes the jumps, the chains and both sets; whatever is already
    /// gone is fine.
    pub fn uninstall(&self) -> Result<(), HostRulesError> {
        self.in_node(|| {
            apply_nat(Family::V4, &nat_saved(Family::V4)?, None)?;
            // Where ip6tables does not work, nothing of ours can be there.
            if let Ok(saved) = nat_saved(Family::V6) {
                apply_nat(Family::V6, &saved, None)?;
            }
            for family in families_with_set()? {
                destroy_set(set_name(family))?;
            }
            Ok(())
        })
    }
}

/// What [`HostRules::sync`] changed, each list sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// IPs that were missing from the sets.
    pub added: Vec<IpAddr>,
    /// IPs that were in the sets but belong to no enrolled pod.
    pub removed: Vec<IpAddr>,
}

impl SyncReport {
    /// True when the sets already held exactly the pods' IPs.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

/// The set holding one family's pod IPs.
fn set_name(family: Family) -> &'static str {
    match family {
        Family::V4 => SET_V4,
        Family::V6 => SET_V6,
    }
}

/// The families whose set exists in the current netns.
fn families_with_set() -> Result<Vec<Family>, NetnsError> {
    let listing = netns::command("ipset", &["list", "-n"], None)?;
    Ok(FAMILIES
        .into_iter()
        .filter(|family| listing.lines().any(|name| name.trim() == set_name(*family)))
        .collect())
}

/// The `family` argument of `ipset create`.
fn set_family(family: Family) -> &'static str {
    match family {
        Family::V4 => "inet",
        Family::V6 => "inet6",
    }
}

/// The set an IP belongs in. An IPv4-mapped IPv6 address counts as IPv4,
/// as it is on the wire.
fn set_for(ip: IpAddr) -> (&'static str, IpAddr) {
    let ip = ip.to_canonical();
    let family = if ip.is_ipv4() { Family::V4 } else { Family::V6 };
    (set_name(family), ip)
}

/// The rule of `ISTIO_POSTRT` for one family, spelled as `iptables-save`
/// prints it (after `-A `), so an installed copy compares equal.
pub fn snat_rule(family: Family, probe_address: IpAddr) -> String {
    let set = set_name(family);
    format!(
        "{CHAIN} -p tcp -m owner --socket-exists -m set --match-set {set} dst -j SNAT --to-source {probe_address}"
    )
}

/// What of ours the nat table holds now, read from `iptables-save`.
#[derive(Debug, Default, PartialEq, Eq)]
struct NatState {
    /// `ISTIO_POSTRT` exists.
    chain: bool,
    /// POSTROUTING's rules in order, each without its `-A `.
    postrouting: Vec<String>,
    /// `ISTIO_POSTRT`'s rules in order, each without its `-A `.
    chain_rules: Vec<String>,
}

impl NatState {
    /// POSTROUTING's rules that jump to our chain, whatever they match.
    fn jumps(&self) -> Vec<&str> {
        self.postrouting
            .iter()
            .map(String::as_str)
            .filter(|rule| rule.rsplit_once("-j ").map(|(_, target)| target.trim()) == Some(CHAIN))
            .collect()
    }
}

/// Reads the nat table of `iptables-save` output; other tables are
/// skipped.
fn parse_nat(saved: &str) -> NatState {
    let mut state = NatState::default();
    let mut in_nat = false;
    for line in saved.lines().map(str::trim) {
        if let Some(table) = line.strip_prefix('*') {
            in_nat = table == "nat";
        } else if !in_nat {
            continue;
        } else if let Some(declaration) = line.strip_prefix(':') {
            state.chain |= declaration.split_whitespace().next() == Some(CHAIN);
        } else if let Some(rule) = line.strip_prefix("-A ") {
            match rule.split_whitespace().next() {
                Some("POSTROUTING") => state.postrouting.push(rule.to_owned()),
                Some(CHAIN) => state.chain_rules.push(rule.to_owned()),
                _ => {}
            }
        }
    }
    state
}

/// One `iptables-restore --noflush` transaction that turns the nat table
/// in `saved` into: our chain holding only `snat_rule` (from
/// [`snat_rule`]), and one jump to it at the top of POSTROUTING; or, with
/// `None`, neither. Empty when the table is already so.
pub fn restore_input(saved: &str, snat_rule: Option<&str>) -> String {
    let state = parse_nat(saved);
    let jumps = state.jumps();
    let mut input = String::from("*nat\n");
    match snat_rule {
        Some(rule) => {
            let in_place = state.chain
                && jumps.len() == 1
                && state.postrouting.first().map(String::as_str) == Some(JUMP)
                && state.chain_rules == [rule];
            if in_place {
                return String::new();
            }
            // Declaring the chain creates it, or flushes an old copy.
            input.push_str(&format!(":{CHAIN} - [0:0]\n"));
            for jump in jumps {
                input.push_str(&format!("-D {jump}\n"));
            }
            input.push_str(&format!("-I POSTROUTING 1 -j {CHAIN}\n-A {rule}\n"));
        }
        None => {
            if !state.chain && jumps.is_empty() {
                return String::new();
            }
            for jump in jumps {
                input.push_str(&format!("-D {jump}\n"));
            }
            if state.chain {
                input.push_str(&format!("-F {CHAIN}\n-X {CHAIN}\n"));
            }
        }
    }
    input.push_str("COMMIT\n");
    input
}

/// The changes that turn the sets' `current` members into `wanted`.
pub fn sync_changes(current: &[IpAddr], wanted: &[IpAddr]) -> SyncReport {
    let current: BTreeSet<IpAddr> = current.iter().map(|ip| ip.to_canonical()).collect();
    let wanted: BTreeSet<IpAddr> = wanted.iter().map(|ip| ip.to_canonical()).collect();
    SyncReport {
        added: wanted.difference(&current).copied().collect(),
        removed: current.difference(&wanted).copied().collect(),
    }
}

/// `ipset restore` input that adds `added` and deletes `removed`, each IP
/// in the set of its family. Empty when both are.
pub fn ipset_input(added: &[IpAddr], removed: &[IpAddr]) -> String {
    let adds = added.iter().map(|ip| ("add", *ip));
    let deletes = removed.iter().map(|ip| ("del", *ip));
    adds.chain(deletes)
        .map(|(verb, ip)| {
            let (set, ip) = set_for(ip);
            format!("{verb} {set} {ip}\n")
        })
        .collect()
}

/// The members of `set` in `ipset save` output (lines `add <set> <ip>
/// [options]`); other lines are skipped.
fn parse_members(saved: &str, set: &'static str) -> Result<Vec<IpAddr>, HostRulesError> {
    let mut members = Vec::new();
    for line in saved.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("add") || words.next() != Some(set) {
            continue;
        }
        let member = words.next().unwrap_or_default();
        let ip = member.parse().map_err(|_| HostRulesError::Member {
            set,
            line: line.trim().to_owned(),
        })?;
        members.push(ip);
    }
    Ok(members)
}

/// The current netns's nat table of one family, as `iptables-save -t nat`
/// prints it; an error when the tool is missing or does not work here.
fn nat_saved(family: Family) -> Result<String, NetnsError> {
    netns::command(family.save_program(), &["-t", "nat"], None)
}

/// Brings one family's nat table from `saved` to the state
/// [`restore_input`] describes.
fn apply_nat(family: Family, saved: &str, snat_rule: Option<&str>) -> Result<(), NetnsError> {
    family.restore(&restore_input(saved, snat_rule))
}

/// Applies [`ipset_input`] text in one `ipset restore`; `-exist` makes an
/// add of a member or a delete of a non-member a no-op.
fn change_members(input: &str) -> Result<(), HostRulesError> {
    if !input.is_empty() {
        netns::command("ipset", &["-exist", "restore"], Some(input))?;
    }
    Ok(())
}

/// Destroys a set that exists, waiting out a rule's reference that the
/// kernel has yet to drop (see [`DESTROY_ATTEMPTS`]).
fn destroy_set(set: &str) -> Result<(), HostRulesError> {
    let mut attempt = 1;
    loop {
        match netns::command("ipset", &["destroy", set], None) {
            Ok(_) => return Ok(()),
            Err(error) if attempt >= DESTROY_ATTEMPTS => return Err(error.into()),
            Err(_) => {
                attempt += 1;
                std::thread::sleep(DESTROY_PAUSE);
            }
        }
    }
}

/// Why the probe SNAT could not be put in place, changed or read.
#[derive(Debug, thiserror::Error)]
pub enum HostRulesError {
    /// `ipset` or an iptables tool failed, or could not be run.
    #[error(transparent)]
    Tool(#[from] NetnsError),
    /// `ipset save` listed a member that is not an IP address.
    #[error("ipset {set} lists a member that is not an IP address: `{line}`")]
    Member {
        /// The set.
        set: &'static str,
        /// The line of `ipset save` output.
        line: String,
    },
}

#[cfg(test)]
mod tests;
