#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests: a panic is a failed test
//! Our ztunnel as a drop-in for Istio's: started exactly as Istio's ztunnel
//! chart starts its container (KUBERNETES.md G1: args `proxy ztunnel`, the
//! chart's default environment with the ambient profile's metadata and
//! nothing else, the token, root certificate, ZDS socket directory and
//! `/tmp` where the chart mounts them), in a temporary root standing in for
//! the container's `/`, against our control plane and node agent in a
//! network namespace. It must find everything at its defaults, wait with a
//! clear log line while the control plane is not up yet (as when the
//! DaemonSet starts before istiod), and become ready once it is, with the
//! control plane's workloads and certificates. Needs root, `ip`,
//! `iptables`, `unshare` and `mount`; skips with the reason otherwise.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ztunnel_test_support::ca::{PodRef, TestCa};
use ztunnel_test_support::cluster::{
    Binaries, ConfigSource, MeshFile, PodSpec, TRUST_DOMAIN, tail, ztunnel_pod,
};
use ztunnel_test_support::netns::{self, NetNs};
use ztunnel_test_support::skip::skip;
use ztunnel_test_support::wait;

/// The control plane, `istiod.istio-system.svc:15012` in a cluster: an
/// address on the namespace's loopback, which the CA's serving certificate
/// names.
const CONTROL_PLANE: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 15012);
/// The ztunnel pod's IP (`status.podIP`), on the namespace's loopback too.
const POD_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
/// The node the ztunnel pod runs on.
const NODE: &str = "node-a";
/// The chart's container args (`istio-proxy`).
const CHART_ARGS: [&str; 2] = ["proxy", "ztunnel"];
/// Where the node agent answers its readiness probe, on the namespace's
/// loopback.
const AGENT_READINESS_PORT: u16 = 8000;
/// How long a step may take: generous, for a loaded machine (a CI build
/// runs beside the tests); passing runs never wait this long. It covers
/// the xDS client's reconnect backoff after the control plane comes up.
const PATIENCE: Duration = Duration::from_secs(30);

/// Where the image holds ztunnel, relative to its root.
const IMAGE_BINARY: &str = "usr/local/bin/ztunnel";

/// What the container runtime does before it starts the entrypoint, in a
/// mount namespace of ztunnel's own so the host's mounts are untouched:
/// `/var/run` becomes an empty tmpfs holding only the hostPath
/// `/var/run/ztunnel` (`$1`), `/tmp` the pod's emptyDir (`$2`), and
/// `env -i` leaves exactly the chart's environment (`NAME=value` words
/// before the binary). The working directory, the temporary root, is kept
/// through the mounts, so ztunnel's relative defaults land in it.
const CONTAINER_SETUP: &str = r#"set -e
mount -t tmpfs -o mode=0755 chart-var-run /var/run
mkdir /var/run/ztunnel
mount --bind "$1" /var/run/ztunnel
mount --bind "$2" /tmp
shift 2
exec env -i "$@"
"#;

#[test]
fn ztunnel_started_as_istio_s_chart_starts_it_becomes_ready_on_our_control_plane() {
    if let Some(reason) = unavailable() {
        skip(reason);
        return;
    }
    let binaries = Binaries::from_target_dir().unwrap();
    let app = PodSpec::new("app", "demo", "app", NODE);
    let mut node = ChartNode::start(&binaries, &app).unwrap();
    let mut ztunnel = node.start_ztunnel(&binaries.ztunnel);
    assert_started_as_the_chart_starts_it(&ztunnel);

    // The control plane is down: ztunnel says so, waits, and is not ready.
    let said_why = wait::until(PATIENCE, || {
        let log = ztunnel.log();
        log.contains("xDS connection failed") && log.contains(&CONTROL_PLANE.to_string())
    });
    assert!(
        said_why,
        "no log line names the unreachable control plane\n{}",
        node.logs(&ztunnel)
    );
    assert!(!node.ztunnel_ready(), "ready without a control plane");
    assert!(
        ztunnel.is_running(),
        "ztunnel exited\n{}",
        node.logs(&ztunnel)
    );

    node.ca.restart(&node.ns).unwrap();
    let ready = wait::until(PATIENCE, || node.ztunnel_ready());
    assert!(ready, "ztunnel not ready\n{}", node.logs(&ztunnel));
    let (uid, identity) = (app.uid(), app.identity());
    let served = wait::until(PATIENCE, || {
        let dump = node.config_dump();
        lists(&dump, "workloads", |workload| {
            workload["uid"] == uid.as_str()
        }) && lists(&dump, "certificates", |certificate| {
            certificate["identity"] == identity.as_str() && certificate["state"] == "Available"
        })
    });
    assert!(
        served,
        "the control plane's workload and its certificate are not in /config_dump: {}\n{}",
        node.config_dump(),
        node.logs(&ztunnel)
    );
    assert!(
        !ztunnel.log().contains("panicked"),
        "{}",
        node.logs(&ztunnel)
    );
}

#[test]
fn version_and_help_answer_as_istio_s_entrypoint_does() {
    let ztunnel = Binaries::from_target_dir().unwrap().ztunnel;
    let version = format!(
        "version.BuildInfo{{Version:\"{}\"",
        env!("CARGO_PKG_VERSION")
    );
    for (command, says) in [
        ("version", version.as_str()),
        ("--version", "IstioVersion:\"1.28.0\""),
        ("help", "CA_ADDRESS"),
    ] {
        let output = Command::new(&ztunnel)
            .arg(command)
            .env_clear()
            .env("ISTIO_META_ISTIO_VERSION", "1.28.0")
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && printed.contains(says) && !printed.contains("error"),
            "ztunnel {command}: {output:?}"
        );
    }
}

/// Why the test cannot run here, if it cannot: the namespace's needs, and
/// util-linux's `unshare` and `mount` for ztunnel's own mounts.
fn unavailable() -> Option<String> {
    netns::unavailable().or_else(|| {
        ["unshare", "mount"]
            .into_iter()
            .find(|tool| !netns::installed(tool))
            .map(|tool| format!("`{tool}` is not installed (apt-get install util-linux)"))
    })
}

/// The environment the chart gives the `istio-proxy` container by default,
/// for this node's ztunnel pod, with the ambient profile's `proxyMetadata`:
/// nothing else.
fn chart_env() -> Vec<(&'static str, String)> {
    let istiod = CONTROL_PLANE.to_string();
    // `limits.cpu` with divisor 1 and no limit set: the downward API gives
    // the node's allocatable CPUs.
    let cpus = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    vec![
        ("CA_ADDRESS", istiod.clone()),
        ("XDS_ADDRESS", istiod),
        ("RUST_LOG", "info".into()),
        ("RUST_BACKTRACE", "1".into()),
        ("ISTIO_META_CLUSTER_ID", "Kubernetes".into()),
        ("INPOD_ENABLED", "true".into()),
        ("TERMINATION_GRACE_PERIOD_SECONDS", "30".into()),
        ("POD_NAME", ztunnel_pod(NODE)),
        ("POD_NAMESPACE", "istio-system".into()),
        ("NODE_NAME", NODE.into()),
        ("INSTANCE_IP", POD_IP.to_string()),
        ("SERVICE_ACCOUNT", "ztunnel".into()),
        ("ZTUNNEL_CPU_LIMIT", cpus.to_string()),
        ("ISTIO_META_ENABLE_HBONE", "true".into()),
    ]
}

/// The node the chart's ztunnel runs on: a namespace holding the control
/// plane (stopped, until the test starts it) and the node agent (ready),
/// and the chart's files under a temporary root.
struct ChartNode {
    /// Dropped first, before the files and the namespace it uses.
    agent: Started,
    ca: TestCa,
    /// The container's `/`.
    root: PathBuf,
    /// The node's own files: the agent's state, sockets and logs.
    host: PathBuf,
    _work: tempfile::TempDir,
    ns: NetNs,
}

impl ChartNode {
    /// Starts the control plane on a mesh of this node's ztunnel pod and
    /// `app` (an HBONE workload on the node), lays out the chart's files,
    /// stops the control plane, and starts the node agent.
    fn start(binaries: &Binaries, app: &PodSpec) -> anyhow::Result<ChartNode> {
        for binary in [&binaries.ztunnel, &binaries.agent] {
            anyhow::ensure!(
                binary.exists(),
                "{} is missing (cargo build -p ztunnel-proxy -p ztunnel-cni --bins)",
                binary.display()
            );
        }
        let ns = NetNs::create("chart")?;
        for ip in [*CONTROL_PLANE.ip(), POD_IP] {
            ns.exec(&["ip", "addr", "add", &format!("{ip}/32"), "dev", "lo"])?;
        }
        let work = tempfile::Builder::new().prefix("zt-chart").tempdir()?;
        let (root, host) = (work.path().join("root"), work.path().join("host"));
        std::fs::create_dir_all(&host)?;
        let mut ca = TestCa::start(&ns, SocketAddr::V4(CONTROL_PLANE), TRUST_DOMAIN, "")?;
        MeshFile::new(ca.pods_path(), ConfigSource::Xds, &[NODE], &[])?.set_workload(
            app,
            Ipv4Addr::new(198, 18, 10, 5),
            true,
        )?;
        lay_out_root(&ca, &root)?;
        // istiod is often not up yet when the DaemonSet starts.
        ca.stop();
        let agent = start_agent(&ns, &binaries.agent, &ca.pods_path(), &root, &host);
        let ready = wait::until(PATIENCE, || {
            matches!(ns.http_get(AGENT_READINESS_PORT, "/readyz"), Ok((200, _)))
        });
        anyhow::ensure!(ready, "node agent not ready; log:\n{}", agent.log_tail());
        Ok(ChartNode {
            agent,
            ca,
            root,
            host,
            _work: work,
            ns,
        })
    }

    /// Starts ztunnel as the chart does: [`CONTAINER_SETUP`], then the
    /// binary with [`CHART_ARGS`] and [`chart_env`], in the root. The shell
    /// and `env` exec, so the process started is ztunnel itself.
    fn start_ztunnel(&self, ztunnel: &Path) -> Started {
        // In the root, where an image has it: the build's own path may lie
        // under /tmp (a checkout there), which the emptyDir hides. Run by
        // its path relative to the root, the working directory.
        let in_image = self.root.join(IMAGE_BINARY);
        std::fs::create_dir_all(in_image.parent().unwrap()).unwrap();
        if std::fs::hard_link(ztunnel, &in_image).is_err() {
            std::fs::copy(ztunnel, &in_image).unwrap();
        }
        let mut command = self.ns.command("unshare");
        command
            .args(["--mount", "--propagation", "private"])
            .args(["sh", "-c", CONTAINER_SETUP, "sh"])
            .arg(self.root.join("var/run/ztunnel"))
            .arg(self.root.join("tmp"))
            .args(
                chart_env()
                    .iter()
                    .map(|(name, value)| format!("{name}={value}")),
            )
            .arg(Path::new(".").join(IMAGE_BINARY))
            .args(CHART_ARGS)
            .current_dir(&self.root);
        Started::spawn(&mut command, self.host.join("ztunnel.log"))
    }

    /// Whether ztunnel answers its readiness probe with 200.
    fn ztunnel_ready(&self) -> bool {
        matches!(self.ns.http_get(15021, "/healthz/ready"), Ok((200, _)))
    }

    /// ztunnel's `/config_dump`, `null` when it does not answer.
    fn config_dump(&self) -> serde_json::Value {
        match self.ns.http_get(15000, "/config_dump") {
            Ok((200, body)) => serde_json::from_str(&body).unwrap_or_default(),
            _ => serde_json::Value::Null,
        }
    }

    /// The ends of ztunnel's and the agent's logs, for failure messages.
    fn logs(&self, ztunnel: &Started) -> String {
        format!(
            "ztunnel log:\n{}\nnode agent log:\n{}",
            ztunnel.log_tail(),
            self.agent.log_tail()
        )
    }
}

/// Writes what the chart mounts under `root`: the projected token
/// (`/var/run/secrets/tokens/istio-token`, audience `istio-ca`, bound to the
/// ztunnel pod), the `istio-ca-root-cert` ConfigMap's `root-cert.pem` (the
/// control plane's root) at `/var/run/secrets/istio`, the hostPath
/// `/var/run/ztunnel` and the emptyDir `/tmp`.
fn lay_out_root(ca: &TestCa, root: &Path) -> anyhow::Result<()> {
    let tokens = root.join("var/run/secrets/tokens");
    let istio = root.join("var/run/secrets/istio");
    for dir in [
        &tokens,
        &istio,
        &root.join("var/run/ztunnel"),
        &root.join("tmp"),
    ] {
        std::fs::create_dir_all(dir)?;
    }
    let pod = ztunnel_pod(NODE);
    ca.write_token(
        &PodRef {
            namespace: "istio-system",
            service_account: "ztunnel",
            name: &pod,
            uid: &format!("uid-{pod}"),
            node: Some(NODE),
        },
        &tokens.join("istio-token"),
    )?;
    std::fs::copy(ca.root_cert_path(), istio.join("root-cert.pem"))?;
    Ok(())
}

/// Starts the node agent in `ns` on the pod registry `pods`, serving ZDS in
/// the root's hostPath directory, with its own files under `host`.
fn start_agent(ns: &NetNs, agent: &Path, pods: &Path, root: &Path, host: &Path) -> Started {
    let mut command = ns.command(&agent.to_string_lossy());
    command
        .env_clear()
        .env("RUST_LOG", "info")
        .arg("--pods")
        .arg(pods)
        .args(["--node-name", NODE, "--zds-socket"])
        .arg(root.join("var/run/ztunnel/ztunnel.sock"))
        .arg("--plugin-socket")
        .arg(host.join("pluginevent.sock"))
        .arg("--state-dir")
        .arg(host.join("agent-state"))
        .arg("--host-probe-rules=false")
        .arg("--readiness-listen")
        .arg(format!("127.0.0.1:{AGENT_READINESS_PORT}"));
    Started::spawn(&mut command, host.join("agent.log"))
}

/// Checks, from `/proc`, that the running ztunnel got exactly the chart's
/// args and environment: the test's claim, made true rather than assumed.
fn assert_started_as_the_chart_starts_it(ztunnel: &Started) {
    let proc = PathBuf::from(format!("/proc/{}", ztunnel.child.id()));
    let fields = |file: &str| -> Vec<String> {
        std::fs::read(proc.join(file))
            .unwrap_or_default()
            .split(|byte| *byte == 0)
            .filter(|field| !field.is_empty())
            .map(|field| String::from_utf8_lossy(field).into_owned())
            .collect()
    };
    let execed = wait::until(PATIENCE, || {
        fields("cmdline")
            .first()
            .is_some_and(|program| program.ends_with("/ztunnel"))
    });
    assert!(
        execed,
        "ztunnel not started: {:?}; its output:\n{}",
        fields("cmdline"),
        ztunnel.log_tail()
    );
    assert_eq!(fields("cmdline")[1..], CHART_ARGS);
    let mut environment = fields("environ");
    environment.sort();
    let mut wanted: Vec<String> = chart_env()
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    wanted.sort();
    assert_eq!(environment, wanted);
}

/// Whether the dump's `list` has an entry that `matches`.
fn lists(
    dump: &serde_json::Value,
    list: &str,
    matches: impl Fn(&serde_json::Value) -> bool,
) -> bool {
    dump[list]
        .as_array()
        .is_some_and(|entries| entries.iter().any(matches))
}

/// A process the test started, with its output in a log file; killed
/// (SIGKILL, by PID) and reaped on drop.
struct Started {
    child: Child,
    log: PathBuf,
}

impl Started {
    fn spawn(command: &mut Command, log: PathBuf) -> Started {
        let file = File::create(&log).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Started { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The end of the log, for failure messages.
    fn log_tail(&self) -> String {
        tail(&self.log(), 40)
    }

    fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
