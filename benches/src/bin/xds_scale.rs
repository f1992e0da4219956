//! `ztunnel-xds-scale`: the control plane's delta xDS at scale (not in CI):
//!
//! ```text
//! cargo run --release -p ztunnel-benches --bin ztunnel-xds-scale [pods] [clients] [rounds]
//! ```
//!
//! Writes a mesh file of `pods` pods (default 10,000) over 100 nodes and
//! 100 namespaces, 1,000 services and 1,000 policies; serves it with the
//! real server on 127.0.0.1 with real TLS; connects `clients` subscribers
//! (default 100, each a real tonic client on its own connection with a
//! node agent's token) in a child process, so that the RSS read from
//! `/proc/self/status` is the server's alone; waits for the full initial
//! sync; then `rounds` times (default 5) changes one pod in the file and
//! measures the push latency from the snapshot swap (the end of
//! `FileRegistry::reload`) to each client's receipt of the one-resource
//! response, and its size. Every wait is bounded.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail};
use hyper_util::rt::TokioIo;
use prost::Message;
use rustls::pki_types::ServerName;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Request;
use tonic::transport::{Channel, Endpoint, Uri};
use ztunnel_certs::error_chain;
use ztunnel_certs::issuer::{Issuer, SigningMaterial, TtlPolicy, generate_root};
use ztunnel_control_plane::ca::authenticator::Authenticator;
use ztunnel_control_plane::ca::authn::{DEFAULT_AUDIENCE, DEFAULT_ISSUER, TokenPolicy};
use ztunnel_control_plane::ca::metrics::CaMetrics;
use ztunnel_control_plane::ca::token::{PodToken, TokenSigner};
use ztunnel_control_plane::ca::{CaConfig, server};
use ztunnel_control_plane::xds::cache::MeshResources;
use ztunnel_mesh::{FileRegistry, PodRegistry};
use ztunnel_proto::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use ztunnel_proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use ztunnel_proto::xds_types::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

/// Nodes, each with one node agent pod.
const NODES: usize = 100;
/// Namespaces the pods, services and policies are spread over.
const NAMESPACES: usize = 100;
/// Services; each selects `pods / SERVICES` pods.
const SERVICES: usize = 1000;
/// Policies; half select workloads, half cover a namespace.
const POLICIES: usize = 1000;
/// The longest the initial sync of every client may take.
const SYNC_TIMEOUT: Duration = Duration::from_secs(600);
/// The longest one push round may take.
const ROUND_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest the client process lives (it also ends when its stdin closes).
const CLIENT_LIFETIME: Duration = Duration::from_secs(1800);
/// Client decode limit, as ztunnel's (WIRE.md §7): the first response of a
/// type holds all of it.
const MAX_RESPONSE_BYTES: usize = 200 * 1024 * 1024;

/// What the server process tells the client process on its stdin.
#[derive(Serialize, Deserialize)]
struct ClientPlan {
    addr: SocketAddr,
    clients: usize,
    root_pem: String,
    token_key_pem: String,
}

fn main() -> ExitCode {
    error_chain::exit_code("ztunnel-xds-scale", run())
}

fn run() -> anyhow::Result<()> {
    ztunnel_certs::tls::install_provider();
    let args: Vec<String> = std::env::args().collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if args.get(1).map(String::as_str) == Some("--clients") {
        return runtime.block_on(clients_main());
    }
    let number = |at: usize, default: usize| -> anyhow::Result<usize> {
        args.get(at)
            .map_or(Ok(default), |text| text.parse().context("a count"))
    };
    let (pods, clients, rounds) = (number(1, 10_000)?, number(2, 100)?, number(3, 5)?);
    runtime.block_on(server_main(pods, clients, rounds))
}

async fn server_main(pods: usize, clients: usize, rounds: usize) -> anyhow::Result<()> {
    let baseline = memory("self")?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("mesh.yaml");
    std::fs::write(&path, mesh(pods, 0))?;
    let file_bytes = std::fs::metadata(&path)?.len();

    let root = generate_root("cluster.local", SystemTime::now())?;
    let root_pem = root.cert_pem.clone();
    let issuer = Arc::new(Issuer::new(&SigningMaterial {
        root_cert_pem: root.cert_pem,
        root_key_pem: Some(root.key_pem),
        ..SigningMaterial::default()
    })?);
    let signer = TokenSigner::generate()?;
    let started = Instant::now();
    let registry = Arc::new(FileRegistry::load(&path)?);
    let load_time = started.elapsed();
    let started = Instant::now();
    let built = MeshResources::build(
        &registry.snapshot(),
        "cluster.local",
        &MeshResources::empty(),
    );
    let build_time = started.elapsed();
    drop(built);

    let config = CaConfig {
        trust_domain: "cluster.local".into(),
        issuer,
        ttl: TtlPolicy::new(Duration::from_secs(86_400), Duration::from_secs(86_400)),
        authenticator: Arc::new(Authenticator::Keys {
            keys: signer.verifying_keys()?,
            policy: TokenPolicy::default(),
        }),
        trusted_node_accounts: vec!["istio-system/ztunnel".parse()?],
        registry: Arc::clone(&registry) as _,
        metrics: Arc::new(CaMetrics::new()),
        serving_dns_names: vec!["localhost".into()],
        serving_ips: vec!["127.0.0.1".parse()?],
        connections: ztunnel_control_plane::ca::connection::ConnectionLimits::DEFAULT,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(server::serve(config, listener, async move {
        let _ = stopped.await;
    }));
    // The resources are built before the listener serves; let it settle.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let served = memory("self")?;

    let plan = ClientPlan {
        addr,
        clients,
        root_pem,
        token_key_pem: signer.private_key_pem().to_owned(),
    };
    let (mut child, stdin, lines) = spawn_clients(&plan)?;
    let result = measure(&path, pods, clients, rounds, &registry, &child, lines).await;
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    let measured = result?;

    let mut report = String::new();
    writeln!(
        report,
        "mesh: {pods} pods on {NODES} nodes, {SERVICES} services, {POLICIES} policies; file {} KiB",
        file_bytes / 1024
    )?;
    writeln!(
        report,
        "load (read + parse + check): {load_time:?}; resource build: {build_time:?}"
    )?;
    writeln!(
        report,
        "server RSS: baseline {}, serving {}, synced {}, after pushes {}",
        baseline,
        served,
        measured.synced_memory,
        memory("self")?
    )?;
    writeln!(
        report,
        "client process ({clients} clients) RSS: {}",
        measured.client_memory
    )?;
    writeln!(
        report,
        "initial sync of {clients} clients: {:?}, {} KiB per client",
        measured.sync_time,
        measured.initial_bytes / clients.max(1) as u64 / 1024
    )?;
    let mut latencies = measured.latencies;
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q) as usize)
            .copied()
    };
    writeln!(
        report,
        "push latency over {rounds} rounds x {clients} clients (swap → received): p50 {:?}, p90 {:?}, max {:?}; reload (read + parse + check) p50 {:?}",
        at(0.5).unwrap_or_default(),
        at(0.9).unwrap_or_default(),
        at(1.0).unwrap_or_default(),
        median(measured.reload_times),
    )?;
    writeln!(
        report,
        "push size: {} resources, {} bytes per client response",
        measured.push_resources, measured.push_bytes
    )?;
    print!("{report}");
    Ok(())
}

/// What one run measured.
struct Measured {
    synced_memory: Memory,
    client_memory: Memory,
    sync_time: Duration,
    initial_bytes: u64,
    latencies: Vec<Duration>,
    reload_times: Vec<Duration>,
    push_resources: u64,
    push_bytes: u64,
}

async fn measure(
    path: &Path,
    pods: usize,
    clients: usize,
    rounds: usize,
    registry: &Arc<FileRegistry>,
    child: &Child,
    mut lines: mpsc::UnboundedReceiver<String>,
) -> anyhow::Result<Measured> {
    let started = Instant::now();
    let synced = next_line(&mut lines, SYNC_TIMEOUT).await?;
    let sync_time = started.elapsed();
    let initial_bytes: u64 = synced
        .strip_prefix("synced ")
        .ok_or_else(|| anyhow!("unexpected {synced:?}"))?
        .parse()?;
    let synced_memory = memory("self")?;
    let client_memory = memory(&child.id().to_string())?;

    let (mut latencies, mut reload_times) = (Vec::new(), Vec::new());
    let (mut push_resources, mut push_bytes) = (0, 0);
    for round in 1..=rounds {
        std::fs::write(path, mesh(pods, round))?;
        let reloading = Arc::clone(registry);
        let started = Instant::now();
        let changed = tokio::task::spawn_blocking(move || reloading.reload()).await??;
        let swapped = SystemTime::now();
        reload_times.push(started.elapsed());
        if !changed {
            bail!("round {round}: the file did not change");
        }
        for _ in 0..clients {
            let line = next_line(&mut lines, ROUND_TIMEOUT).await?;
            let fields: Vec<&str> = line.split(' ').collect();
            let ["push", _client, nanos, bytes, resources] = fields[..] else {
                bail!("unexpected {line:?}");
            };
            let received = UNIX_EPOCH + Duration::from_nanos(nanos.parse()?);
            latencies.push(received.duration_since(swapped).unwrap_or_default());
            push_bytes = bytes.parse()?;
            push_resources = resources.parse()?;
        }
    }
    Ok(Measured {
        synced_memory,
        client_memory,
        sync_time,
        initial_bytes,
        latencies,
        reload_times,
        push_resources,
        push_bytes,
    })
}

async fn next_line(
    lines: &mut mpsc::UnboundedReceiver<String>,
    timeout: Duration,
) -> anyhow::Result<String> {
    tokio::time::timeout(timeout, lines.recv())
        .await
        .context("timed out waiting for the clients")?
        .ok_or_else(|| anyhow!("the client process ended"))
}

/// Starts this example again as the client process, hands it the plan, and
/// forwards its stdout lines. The client process ends when the returned
/// stdin is dropped.
fn spawn_clients(
    plan: &ClientPlan,
) -> anyhow::Result<(Child, ChildStdin, mpsc::UnboundedReceiver<String>)> {
    let mut child = Command::new(std::env::current_exe()?)
        .arg("--clients")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin"))?;
    writeln!(stdin, "{}", serde_json::to_string(plan)?)?;
    let stdout: ChildStdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let (lines, receiver) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    Ok((child, stdin, receiver))
}

/// The mesh file; `round` moves pod 0 to another IP.
fn mesh(pods: usize, round: usize) -> String {
    let mut text = String::with_capacity(pods * 250);
    text.push_str("pods:\n");
    for node in 0..NODES {
        let _ = writeln!(
            text,
            "- {{name: ztunnel-{node}, namespace: istio-system, uid: uid-ztunnel-{node}, serviceAccount: ztunnel, nodeName: node-{node}}}"
        );
    }
    for pod in 0..pods {
        let ip = if pod == 0 && round > 0 {
            format!("10.200.0.{round}")
        } else {
            format!(
                "10.{}.{}.{}",
                1 + pod / 65_536,
                (pod / 256) % 256,
                pod % 256
            )
        };
        let _ = writeln!(
            text,
            "- {{name: pod-{pod}, namespace: ns-{}, uid: uid-pod-{pod}, serviceAccount: sa-{}, nodeName: node-{}, ips: [{ip}], labels: {{app: svc-{}, version: v1}}}}",
            pod % NAMESPACES,
            pod % SERVICES,
            pod % NODES,
            pod % SERVICES
        );
    }
    text.push_str("services:\n");
    for service in 0..SERVICES {
        let namespace = service % NAMESPACES;
        let _ = writeln!(
            text,
            "- {{name: svc-{service}, namespace: ns-{namespace}, hostname: svc-{service}.ns-{namespace}.svc.cluster.local, vips: [10.96.{}.{}], ports: {{80: 8080}}, selector: {{app: svc-{service}}}}}",
            service / 256,
            service % 256
        );
    }
    text.push_str("policies:\n");
    for policy in 0..POLICIES {
        let namespace = policy % NAMESPACES;
        let scope = if policy % 2 == 0 {
            format!("scope: WorkloadSelector, selector: {{app: svc-{policy}}}")
        } else {
            "scope: Namespace".to_owned()
        };
        let _ = writeln!(
            text,
            "- {{name: pol-{policy}, namespace: ns-{namespace}, {scope}, action: Allow, rules: [[[{{principals: [!Exact cluster.local/ns/ns-{namespace}/sa/sa-{}]}}], [{{destinationPorts: [8080]}}]]]}}",
            (policy + 1) % SERVICES
        );
    }
    text
}

/// VmRSS and VmHWM of a process (`self` or a pid).
#[derive(Debug, Clone, Copy)]
struct Memory {
    rss_kib: u64,
    peak_kib: u64,
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} MiB (peak {} MiB)",
            self.rss_kib / 1024,
            self.peak_kib / 1024
        )
    }
}

fn memory(process: &str) -> anyhow::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{process}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let line = status
            .lines()
            .find(|line| line.starts_with(name))
            .ok_or_else(|| anyhow!("no {name}"))?;
        let kib = line
            .split_whitespace()
            .nth(1)
            .ok_or_else(|| anyhow!("bad {line:?}"))?;
        Ok(kib.parse()?)
    };
    Ok(Memory {
        rss_kib: field("VmRSS:")?,
        peak_kib: field("VmHWM:")?,
    })
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// The client process: `clients` subscribers, each reporting on stdout.
async fn clients_main() -> anyhow::Result<()> {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let plan: ClientPlan = serde_json::from_str(&line)?;
    // The server process closes our stdin when it is done (or dies).
    std::thread::spawn(|| {
        let mut rest = String::new();
        while std::io::stdin()
            .read_line(&mut rest)
            .is_ok_and(|read| read > 0)
        {
            rest.clear();
        }
        std::process::exit(0);
    });
    let signer = TokenSigner::from_pem(&plan.token_key_pem)?;
    let mut roots = rustls::RootCertStore::empty();
    for root in ztunnel_certs::cert::parse_pem_bundle(&plan.root_pem)? {
        roots.add(root)?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(ztunnel_certs::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));

    let (events, mut received) = mpsc::unbounded_channel::<Event>();
    for client in 0..plan.clients {
        let node = client % NODES;
        let token = signer.mint(
            &PodToken {
                issuer: DEFAULT_ISSUER.into(),
                audiences: vec![DEFAULT_AUDIENCE.into()],
                namespace: "istio-system".into(),
                service_account: "ztunnel".into(),
                pod_name: format!("ztunnel-{node}"),
                pod_uid: format!("uid-ztunnel-{node}"),
                node_name: Some(format!("node-{node}")),
                ttl: Duration::from_secs(3600),
            },
            SystemTime::now(),
        )?;
        let channel = channel(plan.addr, connector.clone()).await?;
        tokio::spawn(subscribe(client, channel, token, events.clone()));
    }
    drop(events);

    let deadline = tokio::time::Instant::now() + CLIENT_LIFETIME;
    let mut initial: HashMap<usize, u32> = HashMap::new();
    let mut initial_bytes = 0u64;
    let mut stdout = std::io::stdout();
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, received.recv()).await {
        match event {
            Event::Initial { client, bytes } => {
                initial_bytes += bytes;
                let done = initial.entry(client).or_default();
                *done += 1;
                if initial.len() == plan.clients && initial.values().all(|n| *n == 2) {
                    writeln!(stdout, "synced {initial_bytes}")?;
                }
            }
            Event::Push {
                client,
                at,
                bytes,
                resources,
            } => {
                let nanos = at.duration_since(UNIX_EPOCH)?.as_nanos();
                writeln!(stdout, "push {client} {nanos} {bytes} {resources}")?;
            }
            Event::Failed { client, error } => {
                eprintln!("client {client}: {error}");
            }
        }
        stdout.flush()?;
    }
    Ok(())
}

/// What a client saw.
enum Event {
    Initial {
        client: usize,
        bytes: u64,
    },
    Push {
        client: usize,
        at: SystemTime,
        bytes: u64,
        resources: usize,
    },
    Failed {
        client: usize,
        error: String,
    },
}

/// A TLS channel to the server, checking its certificate for `localhost`.
async fn channel(
    addr: SocketAddr,
    connector: tokio_rustls::TlsConnector,
) -> anyhow::Result<Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let connector = connector.clone();
            async move {
                let tcp = TcpStream::connect(addr).await?;
                let name = ServerName::try_from("localhost")
                    .map_err(|error| std::io::Error::other(error.to_string()))?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await?;
    Ok(channel)
}

/// One subscriber: both initial requests, then ACK every response and
/// report it.
async fn subscribe(
    client: usize,
    channel: Channel,
    token: String,
    events: mpsc::UnboundedSender<Event>,
) {
    let failed = |error: String| {
        let _ = events.send(Event::Failed { client, error });
    };
    let mut ads = AggregatedDiscoveryServiceClient::new(channel)
        .max_decoding_message_size(MAX_RESPONSE_BYTES);
    let (requests, outbound) = mpsc::channel(16);
    for type_url in [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL] {
        let initial = DeltaDiscoveryRequest {
            type_url: type_url.into(),
            ..DeltaDiscoveryRequest::default()
        };
        if requests.send(initial).await.is_err() {
            return;
        }
    }
    let mut request = Request::new(ReceiverStream::new(outbound));
    match format!("Bearer {token}").parse() {
        Ok(value) => {
            request.metadata_mut().insert("authorization", value);
        }
        Err(error) => return failed(format!("{error}")),
    }
    let mut inbound = match ads.delta_aggregated_resources(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => return failed(format!("{status}")),
    };
    let mut responses = 0;
    loop {
        let response = match inbound.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return,
            Err(status) => return failed(format!("{status}")),
        };
        let at = SystemTime::now();
        let bytes = response.encoded_len() as u64;
        responses += 1;
        let event = if responses <= 2 {
            Event::Initial { client, bytes }
        } else {
            Event::Push {
                client,
                at,
                bytes,
                resources: response.resources.len(),
            }
        };
        let ack = DeltaDiscoveryRequest {
            type_url: response.type_url,
            response_nonce: response.nonce,
            ..DeltaDiscoveryRequest::default()
        };
        if events.send(event).is_err() || requests.send(ack).await.is_err() {
            return;
        }
    }
}
