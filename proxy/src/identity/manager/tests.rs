//! The manager's queue against a fake CA that records its calls: the
//! concurrency limit, priority order, shared fetches and backoff on failure.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Semaphore, oneshot};

use super::*;

/// A CA that refuses everything, each call held until the test releases it.
#[derive(Clone)]
struct FakeCa {
    calls: Arc<Mutex<Vec<Identity>>>,
    running: Arc<AtomicUsize>,
    most_running: Arc<AtomicUsize>,
    release: Arc<Semaphore>,
}

impl CertificateSource for FakeCa {
    fn fetch(
        &self,
        identity: &Identity,
    ) -> impl Future<Output = Result<WorkloadCertificate, CaClientError>> + Send {
        let fake = self.clone();
        let identity = identity.clone();
        async move {
            fake.calls.lock().unwrap().push(identity);
            let now = fake.running.fetch_add(1, Ordering::SeqCst) + 1;
            fake.most_running.fetch_max(now, Ordering::SeqCst);
            let _permit = fake.release.acquire().await;
            fake.running.fetch_sub(1, Ordering::SeqCst);
            Err(CaClientError::Rpc(tonic::Status::unavailable("CA down")))
        }
    }
}

impl FakeCa {
    fn new() -> FakeCa {
        FakeCa {
            calls: Arc::default(),
            running: Arc::default(),
            most_running: Arc::default(),
            release: Arc::new(Semaphore::new(0)),
        }
    }

    fn calls(&self) -> Vec<Identity> {
        self.calls.lock().unwrap().clone()
    }

    /// Waits (bounded) until the fake has seen `count` calls.
    async fn wait_for_calls(&self, count: usize) {
        for _ in 0..500 {
            if self.calls.lock().unwrap().len() >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("only {} calls of {count}", self.calls().len());
    }
}

fn identity(n: usize) -> Identity {
    Identity::new("cluster.local", "default", &format!("sa-{n}")).unwrap()
}

fn start(fake: &FakeCa) -> (IdentityManager, oneshot::Sender<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let (manager, task) = IdentityManager::new(fake.clone(), async move {
        let _ = stopped.await;
    });
    tokio::spawn(task);
    (manager, stop)
}

#[tokio::test]
async fn at_most_eight_fetches_run_at_once_and_waiting_connections_jump_the_queue() {
    let fake = FakeCa::new();
    let (manager, _stop) = start(&fake);
    for n in 0..12 {
        manager.prefetch(identity(n));
    }
    fake.wait_for_calls(MAX_CONCURRENT_FETCHES).await;
    // A connection now waits for an identity nobody prefetched.
    let waiting = tokio::spawn({
        let manager = manager.clone();
        async move { manager.fetch_certificate(&identity(99)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        fake.calls().len(),
        MAX_CONCURRENT_FETCHES,
        "the rest wait for a slot"
    );

    fake.release.add_permits(1);
    fake.wait_for_calls(MAX_CONCURRENT_FETCHES + 1).await;
    assert_eq!(
        fake.calls()[MAX_CONCURRENT_FETCHES],
        identity(99),
        "the waiting connection goes before the queued prefetches"
    );
    fake.release.add_permits(1_000);
    let error = waiting.await.unwrap().unwrap_err();
    assert!(matches!(error, FetchError::Ca(_)), "{error:?}");
    fake.wait_for_calls(13).await;
    assert_eq!(
        fake.most_running.load(Ordering::SeqCst),
        MAX_CONCURRENT_FETCHES
    );
}

#[tokio::test]
async fn concurrent_waiters_share_one_fetch_and_a_failure_schedules_a_retry() {
    let fake = FakeCa::new();
    let (manager, _stop) = start(&fake);
    let waiters: Vec<_> = (0..5)
        .map(|_| {
            let manager = manager.clone();
            tokio::spawn(async move { manager.fetch_certificate(&identity(1)).await })
        })
        .collect();
    fake.wait_for_calls(1).await;
    fake.release.add_permits(1);
    for waiter in waiters {
        assert!(matches!(waiter.await.unwrap(), Err(FetchError::Ca(_))));
    }
    assert_eq!(
        fake.calls(),
        [identity(1)],
        "one fetch for all five waiters"
    );

    let snapshot = manager.snapshot();
    let [summary] = snapshot.as_slice() else {
        panic!("{snapshot:?}");
    };
    assert!(matches!(
        summary.state,
        CertificateState::Failed { attempts: 1, .. }
    ));
    assert!(summary.refresh_at.is_some());

    // The retry comes by itself after the backoff.
    fake.release.add_permits(1);
    fake.wait_for_calls(2).await;
}

#[tokio::test]
async fn a_forgotten_identity_fails_its_waiters() {
    let fake = FakeCa::new();
    let (manager, _stop) = start(&fake);
    let waiter = tokio::spawn({
        let manager = manager.clone();
        async move { manager.fetch_certificate(&identity(1)).await }
    });
    fake.wait_for_calls(1).await;
    manager.forget(&identity(1));
    let error = waiter.await.unwrap().unwrap_err();
    assert!(matches!(error, FetchError::Forgotten(_)), "{error:?}");
    assert!(manager.snapshot().is_empty());
    fake.release.add_permits(1_000);
}
