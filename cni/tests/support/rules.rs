//! What the agent's rules look like inside a pod namespace, as the
//! end-to-end tests read them back.

use ztunnel_test_support::netns::NetNs;

/// `iptables-save` lines of ours inside a pod namespace.
pub fn our_rules(pod: &NetNs) -> Vec<String> {
    let saved = pod.exec(&["iptables-save"]).unwrap();
    String::from_utf8_lossy(&saved.stdout)
        .lines()
        .filter(|line| line.contains("ISTIO"))
        .map(str::to_owned)
        .collect()
}
