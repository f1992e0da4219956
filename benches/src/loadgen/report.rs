//! What `ztunnel-loadgen` prints on stdout: `{"event":...}` lines while it
//! runs and one result object per client run, always the last line. The
//! types are public so that the harness parses exactly what is printed.
//! Progress for people goes to stderr and lives in `progress.rs`.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::net::{Ipv4Addr, SocketAddr};

use serde::{Deserialize, Serialize};

use super::cli::Direction;
use super::latency::Latency;
use super::soak::SoakReport;

/// A line printed while the program runs, before any result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event {
    /// The server is bound and accepting.
    Listening {
        /// The bound address (the real port when asked for port 0).
        addr: SocketAddr,
    },
    /// The idle client has opened its connections and is holding them.
    Holding {
        /// Connections open and proven by a round trip.
        held: u64,
        /// Connections that failed to open.
        errors: u64,
    },
    /// The soak client's counts so far, once a second. Boxed: the counts are
    /// larger than every other event together.
    Soak(Box<SoakReport>),
}

/// The result of one client run, printed as the last line of stdout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "lowercase")]
pub enum Report {
    /// Bulk transfer.
    Stream(StreamReport),
    /// Request/response.
    Rr(RrReport),
    /// New connection per request.
    Connect(ConnectReport),
    /// Idle connections held open.
    Idle(IdleReport),
    /// Traffic counted through a rollout.
    Soak(SoakReport),
    /// DNS queries.
    Dns(DnsReport),
}

/// The result of `stream`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamReport {
    /// Which way the bytes went.
    pub direction: Direction,
    /// Connections asked for.
    pub connections: u64,
    /// Seconds from the start of the transfer to the last connection's end.
    pub duration_s: f64,
    /// Bytes written (up) or read (down) by the client.
    pub bytes: u64,
    /// `bytes` as gigabits per second over `duration_s`.
    pub gbit_per_s: f64,
    /// Failed connects and connections that broke during the run.
    pub errors: u64,
}

/// The result of `rr`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RrReport {
    /// Connections asked for.
    pub connections: u64,
    /// Seconds from the first request to the last response.
    pub duration_s: f64,
    /// Requests answered in full.
    pub requests: u64,
    /// `requests` over `duration_s`.
    pub requests_per_s: f64,
    /// Failed connects and connections that broke during the run.
    pub errors: u64,
    /// Time from send (at a fixed rate: from the intended send) to full response.
    pub latency_us: Latency,
}

/// The result of `connect`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnectReport {
    /// Connections that completed their request and response.
    pub connections_made: u64,
    /// `connections_made` over the run's length.
    pub connections_per_s: f64,
    /// Connections that failed at any step.
    pub errors: u64,
    /// The time connect() took.
    pub connect_us: Latency,
    /// From the start of connect() to the full first response: what a
    /// tunnel's set-up adds shows here.
    pub setup_us: Latency,
}

/// The result of `idle`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleReport {
    /// Connections opened and held.
    pub held: u64,
    /// Connections that failed to open.
    pub errors: u64,
    /// Of the held connections, those found closed or reset by the far side
    /// when the hold ended.
    pub dropped: u64,
    /// Seconds spent opening the connections.
    pub open_s: f64,
}

/// The result of `dns`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DnsReport {
    /// The nameserver asked.
    pub server: SocketAddr,
    /// Queries outstanding at once.
    pub in_flight: u64,
    /// Seconds from the first query to the end of the run.
    pub duration_s: f64,
    /// Queries sent.
    pub sent: u64,
    /// Replies that answered an open query, whatever their response code.
    pub answered: u64,
    /// Of those, the replies with at least one A record.
    pub with_address: u64,
    /// Queries with no reply within the timeout.
    pub timeouts: u64,
    /// Replies that are no DNS response, or answer another question than
    /// the one their id asked.
    pub malformed: u64,
    /// Responses to no open query: late (after their query timed out) or
    /// stray.
    pub unmatched: u64,
    /// Timeouts, malformed replies and socket errors together.
    pub errors: u64,
    /// Answered replies by response code (`NOERROR`, `NXDOMAIN`, ...).
    pub rcodes: BTreeMap<String, u64>,
    /// The distinct addresses the answers carried, the first 16 seen:
    /// whose answer it was (a DNS proxy's VIP or the nameserver's).
    pub addresses: Vec<Ipv4Addr>,
    /// `answered` over `duration_s`.
    pub queries_per_s: f64,
    /// From a query's send to its answer.
    pub latency_us: Latency,
}

impl Report {
    /// Whether anything succeeded; a run where every attempt failed exits
    /// non-zero after printing its report.
    pub fn succeeded(&self) -> bool {
        match self {
            Report::Stream(report) => report.bytes > 0,
            Report::Rr(report) => report.requests > 0,
            Report::Connect(report) => report.connections_made > 0,
            Report::Idle(report) => report.held > 0,
            Report::Soak(report) => report.succeeded(),
            Report::Dns(report) => report.answered > 0,
        }
    }

    /// The failures counted, for the exit message.
    pub fn errors(&self) -> u64 {
        match self {
            Report::Stream(report) => report.errors,
            Report::Rr(report) => report.errors,
            Report::Connect(report) => report.errors,
            Report::Idle(report) => report.errors,
            Report::Soak(report) => report.failures(),
            Report::Dns(report) => report.errors,
        }
    }
}

/// The result line: the report and what the client spent producing it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// The mode's figures (`mode` names it).
    #[serde(flatten)]
    pub report: Report,
    /// CPU seconds, user and system, this process used from its start to
    /// the report: the cost of one endpoint of the traffic, which the
    /// harness sets beside the proxies' (`null` when it could not be read).
    pub cpu_s: Option<f64>,
}

/// CPU seconds, user and system, used by this process so far.
pub fn own_cpu_seconds() -> Option<f64> {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_SELF).ok()?;
    let seconds = |time: nix::sys::time::TimeVal| {
        time.tv_sec() as f64 + f64::from(u32::try_from(time.tv_usec()).unwrap_or(0)) / 1e6
    };
    Some(seconds(usage.user_time()) + seconds(usage.system_time()))
}

/// Prints one JSON line on stdout and flushes it, so that a reader waiting
/// for the line sees it now and not when the buffer fills.
pub fn print<T: Serialize>(line: &T) -> io::Result<()> {
    let mut stdout = io::stdout().lock();
    serde_json::to_writer(&mut stdout, line)?;
    stdout.write_all(b"\n")?;
    stdout.flush()
}

/// A rate over a duration, zero when the duration is.
pub fn per_second(count: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_carry_their_mode_tag() {
        let report = Report::Stream(StreamReport {
            direction: Direction::Up,
            connections: 2,
            duration_s: 1.5,
            bytes: 10,
            gbit_per_s: 0.0,
            errors: 0,
        });
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["mode"], "stream");
        assert_eq!(json["direction"], "up");
        let back: Report = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn the_result_line_has_the_report_and_the_cpu_at_the_top_level() {
        let outcome = Outcome {
            report: Report::Idle(IdleReport {
                held: 3,
                errors: 0,
                dropped: 0,
                open_s: 0.5,
            }),
            cpu_s: own_cpu_seconds(),
        };
        let json = serde_json::to_value(&outcome).unwrap();
        assert_eq!(json["mode"], "idle");
        assert_eq!(json["held"], 3);
        // This test process has run, so it has spent some CPU.
        assert!(json["cpu_s"].as_f64().unwrap() > 0.0);
        let back: Outcome = serde_json::from_value(json).unwrap();
        assert_eq!(back, outcome);
    }

    #[test]
    fn events_carry_their_event_tag() {
        let line = serde_json::to_string(&Event::Listening {
            addr: "127.0.0.1:80".parse().unwrap(),
        })
        .unwrap();
        assert_eq!(line, r#"{"event":"listening","addr":"127.0.0.1:80"}"#);
    }
}
