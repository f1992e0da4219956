//! `ztunnel`: the node proxy. Configuration comes from the environment and
//! flags (`ztunnel --help` lists them with their defaults).

use std::process::ExitCode;

use ztunnel_certs::error_chain::ErrorChain;
use ztunnel_proxy::config::{Config, ConfigError};
use ztunnel_proxy::memory::sampler::{self, Sampling};

/// mimalloc keeps freed memory for reuse, where glibc malloc unmaps large
/// blocks (the h2 frames and copy buffers of bulk traffic) and faults them
/// back in on the next one: 35 % of the client proxy's CPU per GB
/// (benches/README.md). Sampled for heap profiles once the configuration
/// says how often (`ZTUNNEL_HEAP_SAMPLE_BYTES`).
#[global_allocator]
static ALLOCATOR: Sampling<mimalloc::MiMalloc> = Sampling(mimalloc::MiMalloc);

fn main() -> ExitCode {
    ztunnel_proxy::memory::no_huge_pages();
    let config = match Config::from_env_and_args() {
        Ok(config) => config,
        Err(ConfigError::Args(error)) => error.exit(),
        Err(ConfigError::Print(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("ztunnel: {}", ErrorChain(&error));
            return ExitCode::from(2);
        }
    };
    sampler::set_sample_bytes(config.heap_sample_bytes);
    // Before any TLS config is built: every one takes these groups.
    ztunnel_certs::tls::install_provider_for(config.key_exchange);
    match ztunnel_proxy::app::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let error = ErrorChain(&*error);
            eprintln!("ztunnel: {error}");
            tracing::error!("stopped: {error}");
            ExitCode::FAILURE
        }
    }
}
