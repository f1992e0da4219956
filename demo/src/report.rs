//! What the demo prints: each step's outcome as it happens and the verdict
//! over all of them ([`Steps`]), how long each phase took ([`Phases`]), and
//! who talked to whom as the destination ztunnels logged it ([`Traffic`]).
//! Both modes print through these, so that the simulated nodes and the real
//! cluster show the same table. Where the log lines come from is each
//! mode's business.

use std::time::Duration;

use anyhow::bail;
use ztunnel_test_support::cluster::AccessEntry;

/// The outcome of every step, against what was expected.
#[derive(Default)]
pub struct Steps {
    steps: Vec<Step>,
}

/// One line of the scenario's outcome.
struct Step {
    what: String,
    expected: bool,
    happened: bool,
}

impl Steps {
    /// Records a step and prints its line: `works` or `refused`, marked
    /// `BAD` when that is not what was expected.
    pub fn record(&mut self, what: &str, expected: bool, happened: bool) {
        println!("demo: {}", step_line(what, expected, happened));
        self.steps.push(Step {
            what: what.to_owned(),
            expected,
            happened,
        });
    }

    /// Fails naming every step whose outcome was not the expected one.
    pub fn verdict(&self) -> anyhow::Result<()> {
        let wrong: Vec<&str> = self
            .steps
            .iter()
            .filter(|step| step.expected != step.happened)
            .map(|step| step.what.as_str())
            .collect();
        if !wrong.is_empty() {
            bail!("unexpected outcomes: {}", wrong.join("; "));
        }
        Ok(())
    }
}

/// A step's line: its mark, what it was, and what happened.
fn step_line(what: &str, expected: bool, happened: bool) -> String {
    let mark = if expected == happened { "ok " } else { "BAD" };
    let outcome = if happened { "works" } else { "refused" };
    format!("[{mark}] {what}: {outcome}")
}

/// How long each phase took, in the order they ran.
#[derive(Default)]
pub struct Phases {
    phases: Vec<(String, Duration)>,
}

impl Phases {
    /// Records that `what` took `took`.
    pub fn record(&mut self, what: &str, took: Duration) {
        self.phases.push((what.to_owned(), took));
    }

    /// Prints the phases, one a line, with their total.
    pub fn print(&self) {
        println!("\nHow long each phase took");
        for (what, took) in &self.phases {
            println!("{:>7.1} s  {what}", took.as_secs_f64());
        }
        let total: Duration = self.phases.iter().map(|(_, took)| *took).sum();
        println!("{:>7.1} s  in all", total.as_secs_f64());
    }
}

/// Who talked to whom: destination ztunnels' inbound access-log entries
/// added up by node, verified source identity, destination pod, path and
/// decision.
#[derive(Debug, Default, PartialEq)]
pub struct Traffic {
    rows: Vec<Row>,
}

/// One line of the table.
#[derive(Debug, PartialEq)]
struct Row {
    /// Node, source identity, destination pod, path, decision.
    key: [String; 5],
    connections: u64,
    received: u64,
    sent: u64,
}

impl Traffic {
    /// Adds the entries the ztunnel on `node` logged. Outbound entries are
    /// left out: every connection is counted once, where it arrived.
    pub fn add(&mut self, node: &str, entries: impl IntoIterator<Item = AccessEntry>) {
        for entry in entries {
            if entry.direction != "inbound" {
                continue;
            }
            let (received, sent) = (entry.bytes_recv, entry.bytes_sent);
            let key = row_key(node, entry);
            match self.rows.iter_mut().find(|row| row.key == key) {
                Some(row) => {
                    row.connections += 1;
                    row.received += received;
                    row.sent += sent;
                }
                None => self.rows.push(Row {
                    key,
                    connections: 1,
                    received,
                    sent,
                }),
            }
        }
    }

    /// Prints the table.
    pub fn print(&self) {
        println!("\nWho talked to whom, as each destination ztunnel logged it");
        println!(
            "{:<7} {:<42} {:<7} {:<9} {:>5} {:>6} {:>6}  decision",
            "node", "source identity (verified)", "to pod", "path", "conns", "bytes>", "bytes<"
        );
        for row in &self.rows {
            let [node, source, pod, path, outcome] = &row.key;
            println!(
                "{node:<7} {source:<42} {pod:<7} {path:<9} {:>5} {:>6} {:>6}  {outcome}",
                row.connections, row.received, row.sent
            );
        }
    }
}

/// The row an entry adds to: the path it took (`hbone` between nodes,
/// `same-node` within one, `tcp` for plain TCP) and the decision (allowed,
/// denied by policy, or closed with an error).
fn row_key(node: &str, entry: AccessEntry) -> [String; 5] {
    let path = match (entry.path, &entry.src_identity) {
        (Some(path), _) => path,
        (None, Some(_)) => "hbone".to_owned(),
        (None, None) => "tcp".to_owned(),
    };
    let decision = match entry.error {
        Some(error) if error.contains("denied") => format!("denied: {error}"),
        Some(error) => format!("closed: {error}"),
        None => "allowed".to_owned(),
    };
    [
        node.to_owned(),
        entry
            .src_identity
            .unwrap_or_else(|| "(none: plain TCP)".to_owned()),
        entry.dst_workload.unwrap_or_else(|| "?".to_owned()),
        path,
        decision,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inbound(
        identity: Option<&str>,
        to: &str,
        path: Option<&str>,
        error: Option<&str>,
    ) -> AccessEntry {
        AccessEntry {
            direction: "inbound".to_owned(),
            src_addr: "198.18.64.5:40000".to_owned(),
            src_identity: identity.map(str::to_owned),
            src_workload: None,
            dst_workload: Some(to.to_owned()),
            dst_addr: "198.18.64.6:8080".to_owned(),
            dst_hbone_addr: None,
            path: path.map(str::to_owned),
            error: error.map(str::to_owned),
            bytes_recv: 10,
            bytes_sent: 20,
        }
    }

    const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/client";

    #[test]
    fn entries_are_added_up_by_source_destination_path_and_decision() {
        let mut outbound = inbound(Some(CLIENT), "db", None, None);
        outbound.direction = "outbound".to_owned();
        let mut traffic = Traffic::default();
        traffic.add(
            "node-a",
            [
                // Two across nodes: one row.
                inbound(Some(CLIENT), "web", None, None),
                inbound(Some(CLIENT), "web", None, None),
                // Within a node: a row of its own.
                inbound(Some(CLIENT), "db", Some("same-node"), None),
                // Refused by policy: a row of its own.
                inbound(Some(CLIENT), "db", Some("same-node"), Some("policy denied")),
                // Plain TCP: no identity.
                inbound(None, "web", None, None),
                // Counted where it arrived, not where it left.
                outbound,
            ],
        );
        let keys: Vec<(&[String; 5], u64, u64)> = traffic
            .rows
            .iter()
            .map(|row| (&row.key, row.connections, row.received))
            .collect();
        let key = |identity: &str, to: &str, path: &str, decision: &str| {
            [
                "node-a".to_owned(),
                identity.to_owned(),
                to.to_owned(),
                path.to_owned(),
                decision.to_owned(),
            ]
        };
        assert_eq!(
            keys,
            [
                (&key(CLIENT, "web", "hbone", "allowed"), 2, 20),
                (&key(CLIENT, "db", "same-node", "allowed"), 1, 10),
                (
                    &key(CLIENT, "db", "same-node", "denied: policy denied"),
                    1,
                    10
                ),
                (&key("(none: plain TCP)", "web", "tcp", "allowed"), 1, 10),
            ]
        );
    }

    #[test]
    fn a_step_is_marked_bad_when_its_outcome_is_not_the_expected_one() {
        for (expected, happened, line) in [
            (true, true, "[ok ] a -> b: works"),
            (false, false, "[ok ] a -> b: refused"),
            (true, false, "[BAD] a -> b: refused"),
            (false, true, "[BAD] a -> b: works"),
        ] {
            assert_eq!(step_line("a -> b", expected, happened), line);
        }
    }
}
