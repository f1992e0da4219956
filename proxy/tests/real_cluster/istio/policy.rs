//! Istio's policy, as istiod pushes it to our ztunnels: L4
//! AuthorizationPolicy (DENY, then ALLOW-only) on new and open
//! connections, istiod's validating webhook, and PeerAuthentication
//! (STRICT, PERMISSIVE) for plaintext clients outside the mesh.

use super::*;

/// An L4 DENY policy on the client's principal, then an ALLOW-only one
/// that names another service account, applied with kubectl: istiod
/// pushes each to our ztunnels, which refuse new connections and close
/// the open ones (a soak's long-lived connections) as the policy arrives;
/// once deleted, both are served again. A policy istiod's validation
/// refuses is refused by the API server through istiod's webhook.
pub(crate) fn policies_from_istiod_hold_for_new_and_open_connections(
    cluster: &RealCluster,
    app: &App,
) {
    let (_, target) = app.echo_on("node-b");
    let api = cluster.api().unwrap();
    create_service_account(cluster, ALLOWED_SA);
    let invalid = format!(
        r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: invalid, namespace: {APP_NAMESPACE}}}
spec:
  action: DENY
  rules:
    - from: [{{source: {{principals: [""]}}}}]
"#
    );
    let refused = api.kubectl(&["apply", "-f", "-"], Some(&invalid));
    let message = format!("{refused:?}");
    assert!(
        refused.is_err() && message.contains("admission webhook"),
        "istiod's validating webhook did not refuse an empty principal: {message}"
    );
    println!(
        "istiod's webhook, called by the API server: {}",
        message.lines().next().unwrap_or_default()
    );

    let held = HeldOpen::start(cluster, "held-open", "node-a", target);
    let client = Source::client("node-a");
    for (name, action, named) in [
        ("deny-client", "DENY", "client"),
        ("allow-other", "ALLOW", ALLOWED_SA),
    ] {
        apply(cluster, &echo_policy(name, action, named));
        let (took, _) = until_clients(cluster, client, target, false)
            .unwrap_or_else(|last| panic!("{name}: the client was not refused: {last}"));
        println!(
            "figure: {name} applied to every new connection refused: {:.1} s",
            took.as_secs_f64()
        );
        let closed = held.wait_closed(cluster);
        println!(
            "figure: {name} applied to the {} open connections closed: {:.1} s",
            HeldOpen::CONNECTIONS,
            closed.as_secs_f64()
        );
        if action == "ALLOW" {
            let allowed = Source {
                service_account: ALLOWED_SA,
                ..client
            };
            until_clients(cluster, allowed, target, true).unwrap_or_else(|last| {
                panic!("{name}: the service account it names was not served: {last}")
            });
        }
        delete_policy(cluster, name);
        let started = Instant::now();
        until_clients(cluster, client, target, true)
            .unwrap_or_else(|last| panic!("{name} deleted: the client was still refused: {last}"));
        held.wait_open(cluster);
        println!(
            "figure: {name} deleted to new and reopened connections served: {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    held.stop(cluster);
}

/// The service account the ALLOW-only policy names.
const ALLOWED_SA: &str = "allowed";

/// PeerAuthentication on the application's namespace, which istiod turns
/// into policy for ztunnel: a plaintext client outside the mesh reaches
/// the echo pod without it, is refused under STRICT, and is let in under
/// PERMISSIVE.
pub(crate) fn peer_authentication_strict_refuses_plaintext_and_permissive_admits_it(
    cluster: &RealCluster,
    app: &App,
) {
    let (server, target) = app.echo_on("node-b");
    let api = cluster.api().unwrap();
    api.apply_server_side(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {OUTSIDE_NAMESPACE}}}\n"
    ))
    .unwrap();
    let plaintext = Source {
        namespace: OUTSIDE_NAMESPACE,
        service_account: "default",
        node: "node-a",
    };
    // The default service account appears shortly after the namespace.
    let (_, pod) = until_clients(cluster, plaintext, target, true)
        .unwrap_or_else(|last| panic!("a plaintext client was not served at first: {last}"));
    let plain: Vec<AccessEntry> = access_log(cluster, "node-b")
        .into_iter()
        .filter(|entry| {
            entry.direction == "inbound"
                && entry.dst_workload.as_deref() == Some(server)
                && pod
                    .ip
                    .as_deref()
                    .is_some_and(|ip| entry.src_addr.starts_with(&format!("{ip}:")))
        })
        .collect();
    assert!(
        plain.len() == 5 && plain.iter().all(|entry| entry.src_identity.is_none()),
        "the plaintext client's connections in node-b's access log: {plain:?}"
    );

    for (mode, served) in [("STRICT", false), ("PERMISSIVE", true)] {
        api.kubectl(
            &["apply", "-f", "-"],
            Some(&format!(
                r#"apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: default, namespace: {APP_NAMESPACE}}}
spec: {{mtls: {{mode: {mode}}}}}
"#
            )),
        )
        .unwrap();
        let (took, _) = until_clients(cluster, plaintext, target, served).unwrap_or_else(|last| {
            panic!("PeerAuthentication {mode}: the plaintext client: {last}")
        });
        println!(
            "figure: PeerAuthentication {mode} applied to a plaintext client {}: {:.1} s",
            if served { "served" } else { "refused" },
            took.as_secs_f64()
        );
        // Meshed clients are served under either mode.
        until_clients(cluster, Source::client("node-a"), target, true)
            .unwrap_or_else(|last| panic!("PeerAuthentication {mode}: a meshed client: {last}"));
    }
    api.kubectl(
        &[
            "delete",
            "peerauthentication",
            "-n",
            APP_NAMESPACE,
            "default",
        ],
        None,
    )
    .unwrap();
}
