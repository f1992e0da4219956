//! The load generator `ztunnel-loadgen`: a server that answers every mode on
//! one port, and five client modes (stream, rr, connect, idle, soak) that
//! print one JSON result each; `resolve`, which looks names up; and `dns`,
//! a closed loop of DNS queries, with `dns-server`, a nameserver for it.
//! The benchmark harness runs the server in one pod's network namespace
//! and a client in another, and parses the result with the [`Report`]
//! type; the cluster tests run soak, which prints its counts every second,
//! through a rollout. What goes over the wire is decided here alone.
//!
//! Layout: `cli` parses the command line, `protocol` is the wire header and
//! messages, `server` serves, `dial` opens client connections, one module
//! per client mode (`dns` with its nameserver and DNS messages),
//! `latency` holds the histograms, `report` the JSON lines, `progress` the
//! shared counters and stderr progress, `limits` the open-file check,
//! `shutdown` the stop signals.

use std::io;
use std::sync::Arc;

mod cli;
mod connect;
mod dial;
mod dns;
mod idle;
mod latency;
mod limits;
mod progress;
mod protocol;
mod report;
mod resolve;
mod rr;
mod server;
mod shutdown;
mod soak;
mod stream;

pub use cli::{Cli, Close, Command, Direction};
pub use latency::Latency;
pub use report::{
    ConnectReport, DnsReport, Event, IdleReport, Outcome, Report, RrReport, StreamReport,
};
pub use soak::{
    Attempt, Break, FailureCounts, FailureKind, LATE_RESOLVE, ListedFailure, LongLived,
    MAX_BREAKS_LISTED, MAX_FAILURES_LISTED, NewConnections, Resolves, SoakReport, Step,
};

use progress::Counters;

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The async runtime could not be started.
    #[error("starting the runtime")]
    Runtime(#[source] io::Error),
    /// The server could not run.
    #[error(transparent)]
    Serve(#[from] server::ServeError),
    /// The idle mode could not run.
    #[error(transparent)]
    Idle(#[from] idle::IdleError),
    /// The soak mode could not run.
    #[error(transparent)]
    Soak(#[from] soak::SoakError),
    /// A latency histogram could not be built or merged.
    #[error(transparent)]
    Latency(#[from] latency::LatencyError),
    /// The dns mode could not run.
    #[error(transparent)]
    Dns(#[from] dns::DnsError),
    /// The DNS nameserver could not run.
    #[error(transparent)]
    Nameserver(#[from] dns::nameserver::NameserverError),
    /// The result could not be written to stdout.
    #[error("writing the result to stdout")]
    Output(#[source] io::Error),
    /// The run finished but nothing succeeded; its report was printed.
    #[error("nothing succeeded: {errors} errors; first: {first}")]
    NothingSucceeded {
        /// Failures counted.
        errors: u64,
        /// The first failure, or why there was none.
        first: String,
    },
}

/// Runs the command on a runtime with `--threads` workers.
pub fn run(cli: Cli) -> Result<(), Error> {
    // One thread runs everything on the calling thread, with no work
    // stealing: the least CPU taken from the proxies sharing the machine.
    let runtime = if cli.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(usize::from(cli.threads))
            .enable_all()
            .build()
    }
    .map_err(Error::Runtime)?;
    runtime.block_on(dispatch(cli))
}

/// Runs the command and prints the client's result.
async fn dispatch(cli: Cli) -> Result<(), Error> {
    let counters = Arc::new(Counters::default());
    let quiet = cli.quiet;
    let report = match &cli.command {
        Command::Serve(args) => return Ok(server::serve(args).await?),
        Command::Stream(args) => Report::Stream(stream::run(args, quiet, &counters).await),
        Command::Rr(args) => Report::Rr(rr::run(args, quiet, &counters).await?),
        Command::Connect(args) => Report::Connect(connect::run(args, quiet, &counters).await?),
        Command::Idle(args) => Report::Idle(idle::run(args, quiet, &counters).await?),
        Command::Soak(args) => return finish_soak(soak::run(args, &counters).await?, &counters),
        Command::Resolve(args) => {
            return report::print(&resolve::run(args).await).map_err(Error::Output);
        }
        Command::Dns(args) => Report::Dns(dns::run(args, quiet, &counters).await?),
        Command::DnsServer(args) => return Ok(dns::nameserver::serve(args).await?),
    };
    let outcome = report::Outcome {
        report,
        cpu_s: report::own_cpu_seconds(),
    };
    report::print(&outcome).map_err(Error::Output)?;
    conclude(&outcome.report, &counters)
}

/// Prints a soak run's counts as its result, after the first failure's
/// message on stderr: the result must be the last line of all output, where
/// `kubectl logs --tail=1` finds it. The counts are the run's outcome, so
/// failures in them are not an error of the program.
fn finish_soak(counts: SoakReport, counters: &Counters) -> Result<(), Error> {
    if let Some(first) = counters.first_error() {
        eprintln!(
            "ztunnel-loadgen soak: {} failures; first: {first}",
            counts.failures()
        );
    }
    let outcome = report::Outcome {
        report: Report::Soak(counts),
        cpu_s: report::own_cpu_seconds(),
    };
    report::print(&outcome).map_err(Error::Output)
}

/// Turns a run where nothing succeeded into an error (after its report was
/// printed), and mentions failures of a run that otherwise worked.
fn conclude(report: &Report, counters: &Counters) -> Result<(), Error> {
    let first = counters.first_error();
    if !report.succeeded() {
        return Err(Error::NothingSucceeded {
            errors: report.errors(),
            first: first
                .unwrap_or("none; nothing completed before the run ended")
                .to_owned(),
        });
    }
    if let Some(first) = first {
        eprintln!(
            "ztunnel-loadgen: {} errors; first: {first}",
            report.errors()
        );
    }
    Ok(())
}
