//! The drain's phases, deadlines and child scopes.

use super::*;

const DEADLINE: Duration = Duration::from_secs(30);

/// How long a test waits for what must happen: a drain that never ends
/// fails the test with what it waited for, rather than hanging it. Twice
/// the deadline, so that a test on paused time waits out a forced drain.
const PATIENCE: Duration = Duration::from_secs(60);

/// `future`'s output, or a failure naming `what` after [`PATIENCE`].
async fn within<F: Future>(what: &str, future: F) -> F::Output {
    match tokio::time::timeout(PATIENCE, future).await {
        Ok(output) => output,
        Err(_) => panic!("{what}: still waiting after {PATIENCE:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn graceful_when_every_watcher_is_released_before_the_deadline() {
    let (trigger, watcher) = channel();
    let task = tokio::spawn({
        let watcher = watcher.clone();
        async move {
            watcher.signaled().await;
            // Finishing its work after the signal, then releasing.
            tokio::time::sleep(Duration::from_secs(1)).await;
            drop(watcher);
        }
    });
    drop(watcher);
    assert_eq!(trigger.drain(DEADLINE).await, DrainOutcome::Graceful);
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn forced_after_the_deadline_when_a_watcher_is_still_held() {
    let (trigger, watcher) = channel();
    let start = tokio::time::Instant::now();
    let task = tokio::spawn(async move {
        watcher.signaled().await;
        // Ignores the graceful signal and only stops when forced.
        watcher.forced().await;
        tokio::time::Instant::now()
    });
    assert_eq!(trigger.drain(DEADLINE).await, DrainOutcome::Forced);
    let forced_at = task.await.unwrap();
    assert!(forced_at >= start + DEADLINE);
}

#[tokio::test(start_paused = true)]
async fn forced_does_not_resolve_during_the_graceful_phase() {
    let (trigger, watcher) = channel();
    let drain = tokio::spawn(async move { trigger.drain(DEADLINE).await });
    watcher.signaled().await;
    assert!(watcher.is_draining());
    tokio::select! {
        () = watcher.forced() => panic!("forced before the deadline"),
        () = tokio::time::sleep(DEADLINE / 2) => {}
    }
    watcher.forced().await;
    assert_eq!(drain.await.unwrap(), DrainOutcome::Forced);
}

#[tokio::test]
async fn signaled_resolves_for_watchers_cloned_after_the_drain_started() {
    let (trigger, watcher) = channel();
    let holder = watcher.clone();
    drop(watcher);
    let drain = tokio::spawn({
        let trigger = trigger.clone();
        async move { trigger.drain(DEADLINE).await }
    });
    within("the drain signal", holder.signaled()).await;
    let late = holder.clone();
    within("the signal of a watcher cloned after it", late.signaled()).await;
    assert!(trigger.is_draining());
    assert_eq!(trigger.watchers(), 2);
    drop((holder, late));
    let outcome = within("the drain's end", drain).await.unwrap();
    assert_eq!(outcome, DrainOutcome::Graceful);
}

#[tokio::test]
async fn dropping_every_trigger_forces_the_watchers() {
    let (trigger, watcher) = channel();
    drop(trigger);
    within("the signal", watcher.signaled()).await;
    within("the forced end", watcher.forced()).await;
}

#[tokio::test(start_paused = true)]
async fn a_second_drain_waits_for_the_same_end() {
    let (trigger, watcher) = channel();
    let first = tokio::spawn({
        let trigger = trigger.clone();
        async move { trigger.drain(DEADLINE).await }
    });
    watcher.signaled().await;
    let second = tokio::spawn({
        let trigger = trigger.clone();
        async move { trigger.drain(DEADLINE).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(watcher);
    assert_eq!(first.await.unwrap(), DrainOutcome::Graceful);
    assert_eq!(second.await.unwrap(), DrainOutcome::Graceful);
}

#[tokio::test(start_paused = true)]
async fn a_child_drains_alone_or_with_its_parent() {
    let (parent, parent_watcher) = channel();
    // Draining the child alone leaves the parent running.
    let (child, child_watcher) = parent.child();
    let held = child_watcher.clone();
    drop(child_watcher);
    let alone = tokio::spawn(async move { child.drain(Duration::ZERO).await });
    // No grace: the task still holding a watcher is forced at once.
    held.forced().await;
    assert!(!parent_watcher.is_draining());
    drop(held);
    assert_eq!(alone.await.unwrap(), DrainOutcome::Forced);

    // A parent's drain reaches its children's tasks and waits for them;
    // the trigger of the parent is no watcher and holds nothing up.
    let (_child, child_watcher) = parent.child();
    let task = tokio::spawn(async move {
        child_watcher.signaled().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(child_watcher);
    });
    drop(parent_watcher);
    assert_eq!(parent.drain(DEADLINE).await, DrainOutcome::Graceful);
    task.await.unwrap();

    // Once the parent is forced, so is a child still held.
    let (parent, parent_watcher) = channel();
    let (_child, child_watcher) = parent.child();
    drop(parent_watcher);
    let drain = tokio::spawn(async move { parent.drain(DEADLINE).await });
    child_watcher.forced().await;
    drop(child_watcher);
    assert_eq!(drain.await.unwrap(), DrainOutcome::Forced);
}
