//! `ztunnel-loadgen`: the load generator's entry point. Everything it does
//! lives in `ztunnel_benches::loadgen`; this file only turns the outcome
//! into an exit status.

use std::process::ExitCode;

use clap::Parser;
use ztunnel_benches::loadgen::{self, Cli};
use ztunnel_certs::error_chain;

fn main() -> ExitCode {
    error_chain::exit_code("ztunnel-loadgen", loadgen::run(Cli::parse()))
}
