//! The client task's bookkeeping of demanded names, and a demand's wait.

use ztunnel_proto::envoy::service::discovery::v3::Resource;

use super::*;

fn demanded(name: &str) -> (Demanded, oneshot::Receiver<()>) {
    let (answered, arrived) = oneshot::channel();
    (
        Demanded {
            name: Arc::from(name),
            answered,
        },
        arrived,
    )
}

fn response(resources: &[(&str, &[&str])], removed: &[&str]) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: ResourceKind::Address.type_url().to_owned(),
        resources: resources
            .iter()
            .map(|(name, aliases)| Resource {
                name: (*name).to_owned(),
                aliases: aliases.iter().map(|alias| (*alias).to_owned()).collect(),
                ..Resource::default()
            })
            .collect(),
        removed_resources: removed.iter().map(|name| (*name).to_owned()).collect(),
        ..DeltaDiscoveryResponse::default()
    }
}

#[test]
fn a_name_is_subscribed_once_and_its_waiters_woken_by_an_alias_a_name_or_a_removal() {
    let mut pending = Pending::default();
    let (first, mut first_arrived) = demanded("/10.1.0.5");
    let (second, mut second_arrived) = demanded("/10.1.0.5");
    let subscribe = pending.add(first).expect("a first demand subscribes");
    assert_eq!(subscribe.type_url, ResourceKind::Address.type_url());
    assert_eq!(subscribe.resource_names_subscribe, ["/10.1.0.5"]);
    assert!(pending.add(second).is_none(), "already subscribed");

    // Another address's answer wakes nobody.
    let other = response(&[("Kubernetes//Pod/default/b", &["/10.1.0.6"])], &[]);
    let names = pending.answered_by(&other);
    assert!(names.is_empty());
    pending.answer(names);
    assert!(first_arrived.try_recv().is_err());

    // The workload named by its uid, with the address as an alias.
    let found = response(&[("Kubernetes//Pod/default/a", &["/10.1.0.5"])], &[]);
    let names = pending.answered_by(&found);
    assert_eq!(names, ["/10.1.0.5"]);
    pending.answer(names);
    assert!(first_arrived.try_recv().is_ok() && second_arrived.try_recv().is_ok());

    // Still subscribed: a new stream asks for it again; a later demand is
    // not sent again, and is answered by a removal or by the name itself.
    assert_eq!(pending.subscribed(), ["/10.1.0.5"]);
    let (third, mut third_arrived) = demanded("/10.1.0.5");
    assert!(pending.add(third).is_none());
    let names = pending.answered_by(&response(&[], &["/10.1.0.5"]));
    pending.answer(names);
    assert!(third_arrived.try_recv().is_ok());
    let (fourth, mut fourth_arrived) = demanded("default/svc.example");
    assert!(pending.add(fourth).is_some());
    let names = pending.answered_by(&response(&[("default/svc.example", &[])], &[]));
    pending.answer(names);
    assert!(fourth_arrived.try_recv().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_demand_waits_for_its_answer_and_no_longer_than_asked() {
    let (demand, mut demands) = channel();
    let asker = tokio::spawn({
        let demand = demand.clone();
        async move { demand.fetch("/10.1.0.5", WAIT).await }
    });
    let demanded = demands.recv().await.unwrap();
    let mut pending = Pending::default();
    pending.add(demanded);
    pending.answer(vec!["/10.1.0.5".to_owned()]);
    assert!(asker.await.unwrap(), "answered");

    let started = tokio::time::Instant::now();
    let unanswered = demand.fetch("/10.1.0.9", WAIT).await;
    assert!(!unanswered);
    assert_eq!(started.elapsed(), WAIT, "given up after the wait");
}
