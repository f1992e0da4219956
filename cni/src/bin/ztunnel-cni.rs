//! `ztunnel-cni`: the chained CNI plugin. The runtime runs it with the CNI
//! environment and the network configuration on stdin; see
//! [`ztunnel_cni::plugin`] for what each command does and which
//! configuration keys it reads. This file only moves bytes.

use std::io::Write;
use std::process::ExitCode;

use ztunnel_cni::plugin;

fn main() -> ExitCode {
    // Variables that are not UTF-8 are dropped: a required one then reads
    // as missing, which is a CNI error rather than a panic.
    let vars = std::env::vars_os()
        .filter_map(|(key, value)| Some((key.into_string().ok()?, value.into_string().ok()?)));
    let output = plugin::run(vars, std::io::stdin().lock());
    for warning in &output.warnings {
        let _ = writeln!(std::io::stderr(), "{warning}");
    }
    let mut stdout = std::io::stdout();
    let _ = stdout.write_all(output.stdout.as_bytes());
    let _ = stdout.flush();
    if output.success {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
