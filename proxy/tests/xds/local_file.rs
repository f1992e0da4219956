//! A local file (`LOCAL_XDS_PATH`) beside xDS: it seeds the state, which
//! the fake server's pushes then update.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_xds_path_with_xds_address_seeds_the_state_that_xds_updates() {
    let mut harness = harness().await;
    let local = harness.dir.path().join("local.yaml");
    let seed = |uid: &str, ip: &str| {
        format!(
            "- uid: {uid}\n  name: {uid}\n  namespace: default\n  serviceAccount: {uid}\n  workloadIps: [{ip}]\n  protocol: HBONE\n  node: node-b\n  services: {{}}\n"
        )
    };
    let file = format!(
        "workloads:\n{}{}",
        seed("local-1", "10.2.0.1"),
        seed("local-2", "10.2.0.2")
    );
    std::fs::write(&local, &file).unwrap();
    let ztunnel = harness.spawn(&[("LOCAL_XDS_PATH", local.display().to_string())]);

    // Both sources at once: the file's workloads are there from the
    // start, and the stream still opens and must be ACKed for readiness.
    let mut session = harness.session().await;
    let first = session.request().await;
    let _second = session.request().await;
    assert!(
        first.initial_resource_versions.is_empty(),
        "the file's resources are not xDS versions"
    );
    eventually("the admin answers", || async {
        get(ztunnel.admin, "/config_dump").await.map(|_| ())
    })
    .await;
    assert_eq!(workload_uids(&ztunnel).await, ["local-1", "local-2"]);
    assert_eq!(
        get(ztunnel.readiness, "/healthz/ready").await.unwrap().0,
        500,
        "not ready before xDS is ACKed"
    );

    // xDS adds beside the file's, replaces one of the same name and
    // removes another by name.
    session
        .push_acked(
            ADDRESS_TYPE_URL,
            "a1",
            vec![
                workload("pushed-1", vec![10, 1, 0, 1], "1"),
                workload("local-2", vec![10, 1, 0, 2], "1"),
            ],
            &[],
        )
        .await;
    session
        .push_acked(AUTHORIZATION_TYPE_URL, "p1", vec![], &[])
        .await;
    ready_once_acked(&ztunnel).await;
    assert_eq!(
        workload_uids(&ztunnel).await,
        ["local-1", "local-2", "pushed-1"]
    );
    let (_, dump) = get(ztunnel.admin, "/config_dump").await.unwrap();
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    let local_2 = dump["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|workload| workload["uid"] == "local-2")
        .unwrap();
    assert_eq!(
        local_2["workloadIps"],
        serde_json::json!(["10.1.0.2"]),
        "local-2 is xDS's now"
    );
    session
        .push_acked(ADDRESS_TYPE_URL, "a2", vec![], &["local-1"])
        .await;
    assert_eq!(workload_uids(&ztunnel).await, ["local-2", "pushed-1"]);

    // The file is not read again: a change to it takes nothing back.
    std::fs::write(&local, "workloads: []\n").unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(workload_uids(&ztunnel).await, ["local-2", "pushed-1"]);
}
