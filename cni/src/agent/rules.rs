//! The in-pod redirection of WIRE.md §6, REDIRECT mode: iptables rules in
//! the mangle, nat and raw tables, and the policy
//! routing (`ip rule` fwmark 0x111/0xfff pref 32764 → table 100, whose
//! `local` default route sends the app's replies back to ztunnel).
//!
//! The core is pure: [`desired_rules`] turns settings into rules,
//! [`restore_input`] turns the netns's current `iptables-save` text and the
//! desired rules into one `iptables-restore --noflush` transaction that
//! leaves exactly one copy of ours (or none, for removal), and
//! [`routing_steps`] lists the `ip` commands. [`install`] and [`remove`]
//! run them inside the pod's netns.
//!
//! Only in-pod state is handled here. The node's side of kubelet probes
//! (the `ISTIO_POSTRT` SNAT and the `istio-inpod-probes-v4/v6` ipsets) is
//! `host_rules.rs`'s; the probe exemption rows (8 and 9) here keep the
//! SNATed probes unproxied.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_proto::ports::HBONE_PORT;

use super::netns::{self, NetnsError};

/// ztunnel's socket mark, WIRE.md §1.
const ZTUNNEL_MARK: &str = "0x539/0xfff";
/// The connmark of connections ztunnel dialled into the pod, WIRE.md §1.
const CONNMARK: &str = "0x111/0xfff";
/// Policy-routing table of the connmarked replies.
const ROUTE_TABLE: &str = "100";
/// Preference of the `ip rule` that selects [`ROUTE_TABLE`].
const RULE_PREFERENCE: &str = "32764";
/// The conntrack zone of the original direction of ztunnel's dials into
/// the pod (see [`desired_rules`]); DNS uses zone 1 (WIRE.md §6 row 14).
const DIAL_ZONE: &str = "2";
/// Our chain on the way in.
const PREROUTING_CHAIN: &str = "ISTIO_PRERT";
/// Our chain on the way out.
const OUTPUT_CHAIN: &str = "ISTIO_OUTPUT";
/// At most how many `ip ... del` remove copies of one rule or route: the
/// duplicates earlier runs may have left; one is the normal case.
const MAX_DUPLICATE_DELETES: usize = 8;

/// Settings that shape the rules, from the agent's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSettings {
    /// Source of kubelet health probes after host SNAT (rows 8, 9).
    pub probe_snat_ipv4: Ipv4Addr,
    /// The IPv6 form of [`RuleSettings::probe_snat_ipv4`].
    pub probe_snat_ipv6: Ipv6Addr,
    /// Adds the DNS capture rows (4, 12–15): UDP and TCP port 53 to 15053.
    pub dns_capture: bool,
    /// Interfaces whose inbound TCP is treated as outbound (row 6), e.g.
    /// a KubeVirt VM's tap device. Usually none.
    pub virtual_interfaces: Vec<String>,
}

impl RuleSettings {
    /// The settings for one pod: its own DNS capture choice, when it made
    /// one, over the agent's.
    pub fn for_pod(&self, dns_capture: Option<bool>) -> RuleSettings {
        RuleSettings {
            dns_capture: dns_capture.unwrap_or(self.dns_capture),
            ..self.clone()
        }
    }
}

/// An address family: the rules are the same for both but for loopback and
/// the probe address, and each has its own tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// iptables, `ip -4`.
    V4,
    /// ip6tables, `ip -6`.
    V6,
}

impl Family {
    /// The loopback address the rules exempt.
    fn loopback(self) -> &'static str {
        match self {
            Family::V4 => "127.0.0.1/32",
            Family::V6 => "::1/128",
        }
    }

    /// The whole address space, for the `local` route.
    fn everything(self) -> &'static str {
        match self {
            Family::V4 => "0.0.0.0/0",
            Family::V6 => "::/0",
        }
    }

    fn ip_flag(self) -> &'static str {
        match self {
            Family::V4 => "-4",
            Family::V6 => "-6",
        }
    }

    /// `iptables-save` or `ip6tables-save`.
    pub(crate) fn save_program(self) -> &'static str {
        match self {
            Family::V4 => "iptables-save",
            Family::V6 => "ip6tables-save",
        }
    }

    /// `iptables-restore` or `ip6tables-restore`.
    fn restore_program(self) -> &'static str {
        match self {
            Family::V4 => "iptables-restore",
            Family::V6 => "ip6tables-restore",
        }
    }

    /// Applies `input` in the current netns as one `iptables-restore
    /// --noflush` transaction (waiting up to 5 s for the xtables lock);
    /// empty input runs nothing.
    pub(crate) fn restore(self, input: &str) -> Result<(), NetnsError> {
        if !input.is_empty() {
            netns::command(
                self.restore_program(),
                &["--noflush", "--wait=5"],
                Some(input),
            )?;
        }
        Ok(())
    }
}

/// The rules of one table, each an `-A CHAIN ...` line, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRules {
    /// `mangle`, `nat` or `raw`.
    pub table: &'static str,
    /// Appended in this order (the WIRE.md row order within each chain).
    pub rules: Vec<String>,
}

/// The rules for one family. Row numbers refer to WIRE.md §6.
pub fn desired_rules(family: Family, settings: &RuleSettings) -> Vec<TableRules> {
    let loopback = family.loopback();
    let probe: IpAddr = match family {
        Family::V4 => settings.probe_snat_ipv4.into(),
        Family::V6 => settings.probe_snat_ipv6.into(),
    };
    // Written with the prefix, as iptables-save prints a host address, so
    // that `is_current` can compare the two.
    let host_prefix = match family {
        Family::V4 => 32,
        Family::V6 => 128,
    };
    let jumps = [
        format!("-A PREROUTING -j {PREROUTING_CHAIN}"),
        format!("-A OUTPUT -j {OUTPUT_CHAIN}"),
    ];
    let mangle = vec![
        jumps[0].clone(), // row 1
        jumps[1].clone(), // row 2
        format!(
            "-A {PREROUTING_CHAIN} -m mark --mark {ZTUNNEL_MARK} -j CONNMARK --set-xmark {CONNMARK}"
        ), // row 7
        format!(
            "-A {OUTPUT_CHAIN} -m connmark --mark {CONNMARK} -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff"
        ), // row 11
    ];
    let mut nat = vec![jumps[1].clone(), jumps[0].clone()]; // rows 3, 5
    // Not a WIRE.md row: connections that were open before the rules went
    // in are left alone. Until a table needs it, a netns tracks no
    // connections; once our rules are in, the next packet of such a
    // connection is picked up mid-stream as a new one, and only new ones
    // reach the nat table. Such a packet is never a SYN, while every
    // connection the rules should capture starts with one.
    for chain in [PREROUTING_CHAIN, OUTPUT_CHAIN] {
        nat.push(format!(
            "-A {chain} -p tcp -m tcp ! --tcp-flags FIN,SYN,RST,ACK SYN -j ACCEPT"
        ));
    }
    for interface in &settings.virtual_interfaces {
        // Row 6: traffic entering from a virtual interface is the VM's own
        // outbound traffic.
        nat.push(format!(
            "-A {PREROUTING_CHAIN} -i {interface} -p tcp -j REDIRECT --to-ports 15001"
        ));
        nat.push(format!(
            "-A {PREROUTING_CHAIN} -i {interface} -p tcp -j RETURN"
        ));
    }
    nat.push(format!(
        "-A {PREROUTING_CHAIN} -s {probe}/{host_prefix} -p tcp -m tcp -j ACCEPT"
    )); // row 8
    nat.push(format!(
        "-A {OUTPUT_CHAIN} -d {probe}/{host_prefix} -p tcp -m tcp -j ACCEPT"
    )); // row 9
    nat.push(format!(
        "-A {PREROUTING_CHAIN} ! -d {loopback} -p tcp -m tcp ! --dport {HBONE_PORT} -m mark ! --mark {ZTUNNEL_MARK} -j REDIRECT --to-ports 15006"
    )); // row 10
    if settings.dns_capture {
        nat.push(format!(
            "-A {OUTPUT_CHAIN} ! -o lo -p udp -m mark ! --mark {ZTUNNEL_MARK} -m udp --dport 53 -j REDIRECT --to-ports 15053"
        )); // row 12
        nat.push(format!(
            "-A {OUTPUT_CHAIN} ! -d {loopback} -p tcp -m tcp --dport 53 -m mark ! --mark {ZTUNNEL_MARK} -j REDIRECT --to-ports 15053"
        )); // row 13
    }
    nat.push(format!(
        "-A {OUTPUT_CHAIN} -p tcp -m mark --mark {CONNMARK} -j ACCEPT"
    )); // row 16
    nat.push(format!("-A {OUTPUT_CHAIN} ! -d {loopback} -o lo -j ACCEPT")); // row 17
    nat.push(format!(
        "-A {OUTPUT_CHAIN} ! -d {loopback} -p tcp -m mark ! --mark {ZTUNNEL_MARK} -j REDIRECT --to-ports 15001"
    )); // row 18
    let mut tables = vec![
        TableRules {
            table: "mangle",
            rules: mangle,
        },
        TableRules {
            table: "nat",
            rules: nat,
        },
    ];
    // Not a WIRE.md row: ztunnel's own dials into the pod (to the app,
    // from the client's IP) get a conntrack zone of their own for their
    // original direction. Without it a dial's entry (clientIP:port →
    // podIP:appPort) is the very tuple a later connection of the client
    // from that port has: its SYN would match the dial's entry, skip row
    // 10 and never be answered. The dial's reply direction stays in the
    // default zone, where the app's replies find it (and row 11 its
    // connmark). Looped-back packets keep the entry of their way out.
    let mut raw = vec![jumps[0].clone(), jumps[1].clone()]; // row 4
    raw.push(format!(
        "-A {OUTPUT_CHAIN} -o lo -p tcp -m mark --mark {ZTUNNEL_MARK} -j CT --zone-orig {DIAL_ZONE}"
    ));
    if settings.dns_capture {
        raw.push(format!("-A {OUTPUT_CHAIN} -p udp -m mark --mark {ZTUNNEL_MARK} -m udp --dport 53 -j CT --zone 1")); // row 14
        raw.push(format!(
            "-A {PREROUTING_CHAIN} -p udp -m mark ! --mark {ZTUNNEL_MARK} -m udp --sport 53 -j CT --zone 1"
        )); // row 15
    }
    tables.push(TableRules {
        table: "raw",
        rules: raw,
    });
    tables
}

/// What of ours one table holds now, read from `iptables-save`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Present {
    /// Our chains that exist.
    chains: Vec<String>,
    /// Rules in PREROUTING or OUTPUT that jump to our chains, without `-A`.
    jumps: Vec<String>,
}

/// Reads our chains and jumps, per table, from `iptables-save` output.
fn parse_saved(saved: &str) -> BTreeMap<String, Present> {
    let ours = |chain: &str| chain == PREROUTING_CHAIN || chain == OUTPUT_CHAIN;
    let mut tables: BTreeMap<String, Present> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in saved.lines().map(str::trim) {
        if let Some(table) = line.strip_prefix('*') {
            current = Some(table.to_owned());
            continue;
        }
        let Some(table) = &current else { continue };
        if let Some(declaration) = line.strip_prefix(':') {
            let chain = declaration.split_whitespace().next().unwrap_or_default();
            if ours(chain) {
                tables
                    .entry(table.clone())
                    .or_default()
                    .chains
                    .push(chain.to_owned());
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let mut words = rule.split_whitespace();
            let chain = words.next().unwrap_or_default();
            let target = rule.rsplit_once("-j ").map(|(_, target)| target.trim());
            if (chain == "PREROUTING" || chain == "OUTPUT") && target.is_some_and(ours) {
                tables
                    .entry(table.clone())
                    .or_default()
                    .jumps
                    .push(rule.to_owned());
            }
        }
    }
    tables
}

/// The chain an `-A CHAIN ...` line appends to.
fn chain_of(rule: &str) -> Option<&str> {
    rule.strip_prefix("-A ")?.split_whitespace().next()
}

/// Whether `saved` (`iptables-save` text) holds exactly the `desired`
/// rules: in each desired table, every chain's rules of ours (the rules of
/// our chains and the jumps to them) are the desired ones, in order, once
/// each. Chains are compared one by one because `iptables-save` lists a
/// table chain by chain. Other tables are not looked at.
pub fn is_current(saved: &str, desired: &[TableRules]) -> bool {
    let ours = |chain: &str| chain == PREROUTING_CHAIN || chain == OUTPUT_CHAIN;
    let mut present: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    let mut current: Option<&str> = None;
    for line in saved.lines().map(str::trim) {
        if let Some(table) = line.strip_prefix('*') {
            current = Some(table);
            continue;
        }
        let (Some(table), Some(chain)) = (current, chain_of(line)) else {
            continue;
        };
        let target = line.rsplit_once("-j ").map(|(_, target)| target.trim());
        if ours(chain) || target.is_some_and(ours) {
            present.entry((table, chain)).or_default().push(line);
        }
    }
    let mut wanted: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for table in desired {
        for rule in &table.rules {
            let chain = chain_of(rule).unwrap_or_default();
            wanted.entry((table.table, chain)).or_default().push(rule);
        }
    }
    present.retain(|(table, _), _| desired.iter().any(|wanted| wanted.table == *table));
    present == wanted
}

/// One `iptables-restore --noflush` transaction that turns the state in
/// `saved` into `desired`: our chains are declared (which creates or
/// flushes them), old jumps deleted, then every rule appended. Tables that
/// hold our chains but are not desired (all of them, for removal) lose
/// their jumps and chains. Empty when there is nothing to do.
pub fn restore_input(saved: &str, desired: &[TableRules]) -> String {
    let present = parse_saved(saved);
    let mut input = String::new();
    for table in desired {
        let old = present.get(table.table);
        input.push_str(&format!("*{}\n", table.table));
        for chain in [PREROUTING_CHAIN, OUTPUT_CHAIN] {
            input.push_str(&format!(":{chain} - [0:0]\n"));
        }
        for jump in old.map(|old| old.jumps.as_slice()).unwrap_or_default() {
            input.push_str(&format!("-D {jump}\n"));
        }
        for rule in &table.rules {
            input.push_str(rule);
            input.push('\n');
        }
        input.push_str("COMMIT\n");
    }
    for (table, old) in &present {
        if desired.iter().any(|wanted| wanted.table == table) {
            continue;
        }
        input.push_str(&format!("*{table}\n"));
        for jump in &old.jumps {
            input.push_str(&format!("-D {jump}\n"));
        }
        for chain in &old.chains {
            input.push_str(&format!("-F {chain}\n-X {chain}\n"));
        }
        input.push_str("COMMIT\n");
    }
    input
}

/// One `ip` command of the policy routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteStep {
    /// Must succeed.
    Run(Vec<&'static str>),
    /// Repeated until it fails (at most 8 times):
    /// a delete that removes every copy, and none is fine.
    RepeatUntilFails(Vec<&'static str>),
}

/// The words of our `ip rule`, as `ip rule add` takes them and as
/// `ip rule show` prints them after `from all`.
const REPLY_RULE: [&str; 6] = [
    "fwmark",
    CONNMARK,
    "pref",
    RULE_PREFERENCE,
    "lookup",
    ROUTE_TABLE,
];

/// How many copies of our `ip rule` the `ip rule show` text `shown` holds.
/// A line reads `32764:\tfrom all fwmark 0x111/0xfff lookup 100`.
pub fn reply_rule_copies(shown: &str) -> usize {
    let ours = [
        "from",
        "all",
        REPLY_RULE[0],
        REPLY_RULE[1],
        REPLY_RULE[4],
        REPLY_RULE[5],
    ];
    shown
        .lines()
        .filter(|line| {
            let mut words = line.split_whitespace();
            let preference = words.next().and_then(|word| word.strip_suffix(':'));
            preference == Some(RULE_PREFERENCE) && words.eq(ours)
        })
        .count()
}

/// The `ip` commands that install (or, with `install` false, remove) the
/// policy routing of one family, where the netns holds `present` copies
/// of our rule now ([`reply_rule_copies`]).
///
/// Installing leaves exactly one copy and never removes the last one, not
/// even for a moment: the rule is what brings the application's replies
/// back to ztunnel's connections from the client's address, and a reply
/// sent while it is missing leaves the pod for the client's real address,
/// whose reset ends the connection. A re-install over intact routing (the
/// agent's start-up repair of every pod) is then a no-op for open
/// connections. The route goes in before the rule, so that the rule never
/// points at an empty table.
pub fn routing_steps(family: Family, install: bool, present: usize) -> Vec<RouteStep> {
    let args = |words: &[&[&'static str]]| -> Vec<&'static str> {
        std::iter::once(family.ip_flag())
            .chain(words.iter().flat_map(|part| part.iter().copied()))
            .collect()
    };
    let route = [
        "local",
        family.everything(),
        "dev",
        "lo",
        "table",
        ROUTE_TABLE,
    ];
    if !install {
        return vec![
            RouteStep::RepeatUntilFails(args(&[&["rule", "del"], &REPLY_RULE])),
            RouteStep::RepeatUntilFails(args(&[&["route", "del"], &route])),
        ];
    }
    let mut steps = vec![RouteStep::Run(args(&[&["route", "replace"], &route]))];
    match present {
        0 => steps.push(RouteStep::Run(args(&[&["rule", "add"], &REPLY_RULE]))),
        // Each delete removes one copy: the extras an older kernel let
        // earlier runs add.
        copies => steps.extend(
            (1..copies.min(MAX_DUPLICATE_DELETES + 1))
                .map(|_| RouteStep::Run(args(&[&["rule", "del"], &REPLY_RULE]))),
        ),
    }
    steps
}

/// Installs the rules and routing in the netns at `netns_path`, replacing
/// any earlier copy. IPv6 is set up only when the pod has an IPv6 address
/// and ip6tables works there. Returns whether the iptables rules were not
/// all in place before (a new pod, or rules someone removed), so a
/// reconciliation can tell a repair from a no-op.
pub fn install(
    netns_path: &Path,
    pod_ips: &[IpAddr],
    settings: &RuleSettings,
) -> Result<bool, NetnsError> {
    let has_ipv6 = pod_ips.iter().any(IpAddr::is_ipv6);
    netns::run_in(netns_path, || {
        let current = saved(Family::V4)?;
        let mut changed = !is_current(&current, &desired_rules(Family::V4, settings));
        apply(Family::V4, &current, Some(settings))?;
        if has_ipv6 {
            // Reading the current rules is also the test that ip6tables
            // works here.
            match saved(Family::V6) {
                Ok(current) => {
                    changed |= !is_current(&current, &desired_rules(Family::V6, settings));
                    apply(Family::V6, &current, Some(settings))?;
                }
                Err(error) => {
                    tracing::warn!(error = %ErrorChain(&error), "pod has IPv6 but ip6tables does not work; IPv6 is not captured")
                }
            }
        }
        Ok(changed)
    })?
}

/// Removes every rule and route [`install`] adds; nothing there is fine.
pub fn remove(netns_path: &Path) -> Result<(), NetnsError> {
    netns::run_in(netns_path, || {
        apply(Family::V4, &saved(Family::V4)?, None)?;
        // ip6tables may be missing or unusable in this netns; then nothing
        // of ours can be there either.
        if let Ok(current) = saved(Family::V6) {
            apply(Family::V6, &current, None)?;
        }
        Ok(())
    })?
}

/// The `iptables-save` text of one family in the current netns; an error
/// when the tool is missing or does not work here.
fn saved(family: Family) -> Result<String, NetnsError> {
    netns::command(family.save_program(), &[], None)
}

/// Brings one family of the current netns from `saved` (its
/// `iptables-save` text) to the desired state (`None`: none of ours).
fn apply(family: Family, saved: &str, settings: Option<&RuleSettings>) -> Result<(), NetnsError> {
    let desired = settings
        .map(|settings| desired_rules(family, settings))
        .unwrap_or_default();
    family.restore(&restore_input(saved, &desired))?;
    let shown = netns::command("ip", &[family.ip_flag(), "rule", "show"], None)?;
    for step in routing_steps(family, settings.is_some(), reply_rule_copies(&shown)) {
        match step {
            RouteStep::Run(args) => {
                netns::command("ip", &args, None)?;
            }
            RouteStep::RepeatUntilFails(args) => {
                for _ in 0..MAX_DUPLICATE_DELETES {
                    if netns::command("ip", &args, None).is_err() {
                        break;
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
