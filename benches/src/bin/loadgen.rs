//! `ztunnel-loadgen`: the load generator's entry point. Everything it does
//! lives in `ztunnel_benches::loadgen`; this file only turns the outcome
//! into an exit status.

use std::process::ExitCode;

use clap::Parser;
use ztunnel_benches::loadgen::{self, Cli};

fn main() -> ExitCode {
    match loadgen::run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("ztunnel-loadgen: {err}");
            ExitCode::FAILURE
        }
    }
}
