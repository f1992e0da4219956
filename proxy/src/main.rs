//! `ztunnel`: the node proxy. Configuration comes from the environment and
//! flags (`ztunnel --help` lists them with their defaults).

use std::process::ExitCode;

use ztunnel_proxy::config::Config;

fn main() -> ExitCode {
    ztunnel_certs::tls::install_provider();
    let config = match Config::from_env_and_args() {
        Ok(config) => config,
        Err(ztunnel_proxy::config::ConfigError::Args(error)) => error.exit(),
        Err(error) => {
            eprintln!("ztunnel: {error}");
            return ExitCode::from(2);
        }
    };
    match ztunnel_proxy::app::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ztunnel: {error:#}");
            tracing::error!("stopped: {error:#}");
            ExitCode::FAILURE
        }
    }
}
