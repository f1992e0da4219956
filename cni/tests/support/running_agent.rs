//! The node agent in-process, on a runtime thread of its own, as the
//! agent's integration tests run it: started with an [`AgentConfig`],
//! ready once its plugin socket exists, stopped (and its result checked)
//! when dropped.

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use ztunnel_cni::agent::{self, AgentConfig, AgentError};

/// The agent, in-process on a runtime thread of its own.
pub struct Agent {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), AgentError>>>,
}

impl Agent {
    pub fn start(config: AgentConfig) -> Agent {
        let socket = config.plugin_socket.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(agent::run(config, async {
                let _ = stopped.await;
            }))
        });
        let mut agent = Agent {
            stop: Some(stop),
            thread: Some(thread),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !socket.exists() {
            if agent.thread.as_ref().is_some_and(JoinHandle::is_finished) {
                let result = agent.thread.take().unwrap().join().unwrap();
                panic!("agent stopped at start: {result:?}");
            }
            assert!(Instant::now() < deadline, "agent did not listen within 5 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        agent
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap().unwrap();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.shutdown();
        } else if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
