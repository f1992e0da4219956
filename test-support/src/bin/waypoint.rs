//! `ztunnel-test-waypoint`: the test-support waypoint as a pod's process.
//! Everything it does lives in `ztunnel_test_support::waypoint::pod`; this
//! file only turns the outcome into an exit status.

use std::process::ExitCode;

use clap::Parser;
use ztunnel_certs::error_chain;
use ztunnel_test_support::waypoint::pod::{self, Cli};

fn main() -> ExitCode {
    error_chain::exit_code("ztunnel-test-waypoint", pod::run(Cli::parse()))
}
