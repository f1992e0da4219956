//! A pod that runs before the agent sees it: its API object with status
//! Running and its address, its netns with that address, and its pause
//! process in a cgroup named after its uid, as a runtime leaves them.

#![allow(dead_code)] // each test crate that includes this uses part of it

use std::net::IpAddr;

use tokio::runtime::Runtime;
use ztunnel_test_support::kube::objects::{PodSpecForTest, create_pod, set_pod_running};
use ztunnel_test_support::netns::NetNs;
use ztunnel_test_support::pause::{PauseError, PauseProcess};

pub struct RunningPod {
    pub name: String,
    pub uid: String,
    /// Its address, as given.
    pub ip: String,
    /// Dropped before the netns.
    _pause: PauseProcess,
    pub netns: NetNs,
}

impl RunningPod {
    /// Creates `spec` with address `ip` and starts it; `Err` with the
    /// reason when cgroup v2 cannot be used here (the one thing the test
    /// may skip for): any other failure panics.
    pub fn start(
        runtime: &Runtime,
        client: &kube::Client,
        spec: &PodSpecForTest,
        ip: &str,
    ) -> Result<RunningPod, String> {
        let uid = runtime.block_on(create_pod(client, spec)).unwrap();
        let netns = NetNs::create("run").unwrap();
        netns.exec(&["ip", "link", "set", "lo", "up"]).unwrap();
        // A veth pair inside the netns stands in for the pod's interface
        // (the kernel here has no dummy devices); only the address matters.
        netns
            .exec(&[
                "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "peer0",
            ])
            .unwrap();
        netns
            .exec(&["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"])
            .unwrap();
        netns.exec(&["ip", "link", "set", "eth0", "up"]).unwrap();
        let pause = match PauseProcess::start(&netns, &uid) {
            Ok(pause) => pause,
            Err(error @ PauseError::CgroupUnavailable(_)) => return Err(error.to_string()),
            Err(error) => panic!("{error}"),
        };
        let address: IpAddr = ip.parse().unwrap();
        runtime
            .block_on(set_pod_running(
                client,
                &spec.namespace,
                &spec.name,
                &[address],
                true,
            ))
            .unwrap();
        Ok(RunningPod {
            name: spec.name.clone(),
            uid,
            ip: ip.to_owned(),
            _pause: pause,
            netns,
        })
    }
}
