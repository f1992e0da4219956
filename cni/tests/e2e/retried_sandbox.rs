//! A sandbox the runtime gave up on, and the one it made instead. When the
//! agent does not answer an ADD in time (stopped, overloaded), the plugin
//! fails the ADD, the runtime tears that sandbox down (a DEL naming its
//! netns) and retries the pod in a new sandbox: same name and uid, another
//! netns. The agent may then see the old sandbox's ADD and DEL after the
//! new sandbox's ADD; neither may take the new sandbox out of the mesh.

use std::io::Read;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::SystemTime;

use super::*;

/// The agent's budget as the plugin counts it (`AGENT_TIMEOUT`).
const PLUGIN_WAITS: Duration = Duration::from_secs(5);

/// A `/cmdadd` body for shop/web-0 in `netns`, with `deadline` (Unix
/// milliseconds) when given.
fn add_body(netns: &Path, deadline: Option<SystemTime>) -> Vec<u8> {
    let mut body = serde_json::json!({
        "Netns": netns,
        "PodName": "web-0",
        "PodNamespace": "shop",
        "PodUID": "uid-web-0",
        "IPs": [{"Interface": 0, "Address": {"IP": "198.18.19.2", "Mask": "////AA=="}, "Gateway": ""}],
    });
    if let Some(deadline) = deadline {
        let millis = deadline
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        body["DeadlineUnixMilli"] = serde_json::json!(u64::try_from(millis).unwrap());
    }
    serde_json::to_vec(&body).unwrap()
}

/// A `/cmddel` body for shop/web-0 naming `netns` ("" for none).
fn del_body(netns: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "Netns": netns,
        "PodName": "web-0",
        "PodNamespace": "shop",
        "PodUID": "uid-web-0",
    }))
    .unwrap()
}

/// The netns the agent holds for shop/web-0, or `None` when it holds none.
fn recorded_netns(node: &Node) -> Option<String> {
    let (status, body) = http(&node.plugin_socket(), "GET", "/pods/shop/web-0", b"");
    if status == 404 {
        return None;
    }
    assert_eq!(status, 200, "{body}");
    let record: Value = serde_json::from_str(&body).unwrap();
    Some(record["netns"].as_str().unwrap().to_owned())
}

/// The first connection to `listener`, with reads bounded as long; panics
/// when none comes in time, so a plugin that never connects fails the test
/// instead of hanging it.
fn accept_within(listener: &UnixListener, timeout: Duration) -> UnixStream {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                stream.set_read_timeout(Some(timeout)).unwrap();
                return stream;
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "the plugin never connected");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => panic!("accepting the plugin: {error}"),
        }
    }
}

#[test]
fn the_del_of_a_sandbox_the_runtime_gave_up_on_leaves_its_successor_in_the_mesh() {
    skip_unless_available!();
    let node = Node::new(PODS);
    let _agent = Agent::start(node.config());
    let network = node.network("198.18.19.0/24");
    let ztunnel = FakeZtunnel::connect(&node.zds_socket());
    assert!(ztunnel.read_snapshot().is_empty());
    let first_ns = NetNs::create("pod").unwrap();
    let first = PodSandbox::new(&first_ns, "shop", "web-0", "uid-web-0");
    let second_ns = NetNs::create("pod").unwrap();
    let second = PodSandbox::new(&second_ns, "shop", "web-0", "uid-web-0");

    // The first sandbox's ADD reaches the agent after its plugin gave up.
    let late = SystemTime::now() - Duration::from_secs(7);
    let (status, text) = http(
        &node.plugin_socket(),
        "POST",
        "/cmdadd",
        &add_body(&first.netns_path(), Some(late)),
    );
    assert_eq!(status, 500, "{text}");
    assert_eq!(our_rules(&first_ns), Vec::<String>::new());
    assert_eq!(recorded_netns(&node), None);

    // The runtime's retry joins the mesh.
    let received = std::thread::scope(|scope| {
        let plugin = scope.spawn(|| network.add(&second).unwrap());
        let received = ztunnel.receive_and_ack();
        let added = plugin.join().unwrap();
        assert!(added.plugin.success, "{}", added.plugin.stdout);
        received
    });
    assert!(matches!(received.payload, Payload::Add(_)));
    assert_eq!(fd_identity(&received.fds[0]), netns_identity(&second));
    let second_path = second.netns_path().display().to_string();
    let rules = our_rules(&second_ns);
    assert!(!rules.is_empty());

    // The first sandbox's DEL, with rules of its own there (as an agent
    // without the deadline check would have left): they go, the second
    // sandbox stays.
    let settings = AgentConfig::with_registry(PathBuf::new()).rules;
    let ips = ["198.18.19.99".parse().unwrap()];
    agent::rules::install(&first.netns_path(), &ips, &settings).unwrap();
    let deleted = network.del(&first).unwrap();
    assert!(deleted.success, "{}", deleted.stdout);
    assert_eq!(our_rules(&first_ns), Vec::<String>::new());
    assert_eq!(recorded_netns(&node).as_deref(), Some(second_path.as_str()));
    assert_eq!(our_rules(&second_ns), rules);

    // Repeated once the first netns is gone, and with no netns at all.
    let first_path = first.netns_path().display().to_string();
    drop(first_ns);
    for netns in [first_path.as_str(), ""] {
        let (status, text) = http(&node.plugin_socket(), "POST", "/cmddel", &del_body(netns));
        assert_eq!(status, 200, "{netns:?}: {text}");
        assert_eq!(
            recorded_netns(&node).as_deref(),
            Some(second_path.as_str()),
            "{netns:?}"
        );
    }
    assert_eq!(our_rules(&second_ns), rules);

    // ztunnel was told nothing meanwhile: the next request it gets is
    // another pod's add, not a del of this one.
    let other_ns = NetNs::create("pod").unwrap();
    let other = PodSandbox::new(&other_ns, "shop", "web-1", "uid-web-1");
    let next = std::thread::scope(|scope| {
        let plugin = scope.spawn(|| network.add(&other).unwrap());
        let received = ztunnel.receive_and_ack();
        assert!(plugin.join().unwrap().plugin.success);
        received
    });
    let Payload::Add(add) = &next.payload else {
        panic!("expected web-1's add, got {:?}", next.payload)
    };
    assert_eq!(add.uid, "uid-web-1");

    // The second sandbox's own DEL takes the pod out.
    let deleted = std::thread::scope(|scope| {
        let plugin = scope.spawn(|| network.del(&second).unwrap());
        let received = ztunnel.receive_and_ack();
        assert!(plugin.join().unwrap().success);
        received
    });
    let Payload::Del(del) = &deleted.payload else {
        panic!("expected a del, got {:?}", deleted.payload)
    };
    assert_eq!(del.uid, "uid-web-0");
    assert_eq!(recorded_netns(&node), None);
}

#[test]
fn an_add_that_comes_after_its_deadline_is_refused_and_installs_nothing() {
    skip_unless_available!();
    let node = Node::new(PODS);
    let _agent = Agent::start(node.config());
    let pod_ns = NetNs::create("pod").unwrap();
    let socket = node.plugin_socket();

    let now = SystemTime::now();
    for (why, deadline) in [
        ("long past", now - Duration::from_secs(30)),
        ("just past", now - Duration::from_millis(1)),
        ("too close to answer", now + Duration::from_millis(100)),
    ] {
        let (status, text) = http(
            &socket,
            "POST",
            "/cmdadd",
            &add_body(&pod_ns.path(), Some(deadline)),
        );
        assert_eq!(status, 500, "{why}: {text}");
        assert!(
            text.contains("ADD of shop/web-0 refused") && text.contains("after its deadline"),
            "{why}: {text}"
        );
        assert_eq!(our_rules(&pod_ns), Vec::<String>::new(), "{why}");
        assert_eq!(recorded_netns(&node), None, "{why}");
    }

    // In time, or from a plugin that sends no deadline, the same add goes in.
    for deadline in [Some(SystemTime::now() + PLUGIN_WAITS), None] {
        let (status, text) = http(
            &socket,
            "POST",
            "/cmdadd",
            &add_body(&pod_ns.path(), deadline),
        );
        assert_eq!(status, 200, "{deadline:?}: {text}");
        assert!(!our_rules(&pod_ns).is_empty());
        assert_eq!(
            recorded_netns(&node),
            Some(pod_ns.path().display().to_string())
        );
    }
}

#[test]
fn a_silent_agent_fails_the_add_once_the_deadline_it_was_sent_has_passed() {
    skip_unless_available!();
    let node = Node::new(PODS);
    std::fs::create_dir_all(node.plugin_socket().parent().unwrap()).unwrap();
    let listener = UnixListener::bind(node.plugin_socket()).unwrap();
    let network = node.network("198.18.20.0/24");
    let pod_ns = NetNs::create("pod").unwrap();
    let pod = PodSandbox::new(&pod_ns, "shop", "web-0", "uid-web-0");

    let started = SystemTime::now();
    let (added, request) = std::thread::scope(|scope| {
        // Reads the request and never answers, until the plugin hangs up.
        let agent = scope.spawn(|| {
            let mut stream = accept_within(&listener, Duration::from_secs(20));
            let mut request = Vec::new();
            let mut buf = [0; 4096];
            loop {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => return String::from_utf8(request).unwrap(),
                    Ok(read) => request.extend_from_slice(&buf[..read]),
                }
            }
        });
        let added = network.add(&pod).unwrap();
        (added, agent.join().unwrap())
    });
    let finished = SystemTime::now();

    assert!(!added.plugin.success, "the ADD fails without an answer");
    let error = added.plugin.json().unwrap();
    assert_eq!(error["code"], 11, "{error}");
    assert!(
        error["details"]
            .as_str()
            .unwrap()
            .contains("did not answer"),
        "{error}"
    );
    let (_, body) = request.split_once("\r\n\r\n").unwrap();
    let sent: Value = serde_json::from_str(body).unwrap();
    let deadline =
        SystemTime::UNIX_EPOCH + Duration::from_millis(sent["DeadlineUnixMilli"].as_u64().unwrap());
    assert!(
        started + PLUGIN_WAITS <= deadline + Duration::from_millis(1) && deadline <= finished,
        "the deadline sent ({deadline:?}) is when the plugin gave up: started {started:?}, finished {finished:?}"
    );
}
