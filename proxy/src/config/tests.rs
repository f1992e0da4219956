use ztunnel_certs::error_chain::ErrorChain;

use crate::control_plane::LiteralToken;

use super::*;

/// Flags only: tests never touch the process environment, and none of
/// these variables is set where tests run.
fn parse(args: &[&str]) -> Result<Config, ConfigError> {
    Config::from_args(std::iter::once("ztunnel").chain(args.iter().copied()))
}

#[test]
fn dedicated_mode_needs_its_workload() {
    let config = parse(&[
        "--proxy-mode",
        "dedicated",
        "--proxy-workload-info",
        "default/client-0/client",
    ])
    .unwrap();
    let ProxyMode::Dedicated(info) = &config.mode else {
        panic!("mode {:?}", config.mode);
    };
    assert_eq!(
        (&*info.namespace, &*info.name, &*info.service_account),
        ("default", "client-0", "client")
    );
    assert_eq!(config.packet_mark, None);

    let error = parse(&["--proxy-mode", "dedicated"]).unwrap_err();
    assert!(
        error.to_string().starts_with("PROXY_WORKLOAD_INFO"),
        "{error}"
    );
    let error = parse(&[
        "--proxy-mode",
        "dedicated",
        "--proxy-workload-info",
        "default/client-0",
    ])
    .unwrap_err();
    let shown = ErrorChain(&error).to_string();
    assert!(shown.contains("namespace/name/service-account"), "{shown}");
}

#[test]
fn ztunnels_own_workload_is_its_pod_in_shared_mode_when_all_three_are_given() {
    let own = |args: &[&str]| parse(args).unwrap().own_workload;
    let pod = [
        "--pod-namespace",
        "istio-system",
        "--pod-name",
        "ztunnel-x7",
        "--service-account",
        "ztunnel",
    ];
    let info = own(&pod).unwrap();
    assert_eq!(
        (&*info.namespace, &*info.name, &*info.service_account),
        ("istio-system", "ztunnel-x7", "ztunnel")
    );
    assert_eq!(own(&pod[..4]), None, "no service account: none");
    let mut empty = pod;
    empty[5] = "";
    assert_eq!(own(&empty), None, "an empty part: none");
    let dedicated = [
        &pod[..],
        &[
            "--proxy-mode",
            "dedicated",
            "--proxy-workload-info",
            "default/client-0/client",
        ],
    ]
    .concat();
    assert_eq!(
        own(&dedicated),
        None,
        "dedicated mode serves one workload only"
    );
}

#[test]
fn on_demand_xds_needs_the_dns_proxy_off_as_istio_does() {
    let error = parse(&["--xds-on-demand", "true"]).unwrap_err();
    assert!(
        matches!(error, ConfigError::OnDemandWithDnsProxy),
        "{error}"
    );
    assert!(error.to_string().contains("DNS_CAPTURE=false"), "{error}");
    let config = parse(&["--xds-on-demand", "true", "--dns-capture", "false"]).unwrap();
    assert!(config.xds.unwrap().on_demand);
    assert!(
        !parse(&[]).unwrap().xds.unwrap().on_demand,
        "off by default"
    );
}

#[test]
fn defaults_follow_istio() {
    let config = parse(&[]).unwrap();
    assert_eq!(config.mode, ProxyMode::Shared);
    assert_eq!(config.packet_mark, Some(1337));
    let xds = config.xds.as_ref().unwrap();
    assert_eq!(xds.address.to_string(), DEFAULT_XDS_ADDRESS);
    // No token file at Istio's path here: none is sent, as Istio does.
    assert_eq!(config.auth_token, TokenSource::None);
    assert_eq!(config.cluster_id, "Kubernetes");
    assert_eq!(config.trust_domain, "cluster.local");
    assert_eq!(config.secret_ttl, Duration::from_secs(24 * 3600));
    assert_eq!(config.pool.max_streams_per_connection, 100);
    assert_eq!(config.pool.unused_release_timeout, Duration::from_secs(300));
    assert_eq!(config.http2.stream_window, 4 << 20);
    assert_eq!(config.http2.connection_window, 16 << 20);
    assert_eq!(config.http2.frame_size, 1 << 20);
    assert_eq!(config.listeners.inbound.port(), 15008);
    assert_eq!(config.listeners.admin, "127.0.0.1:15000".parse().unwrap());
    assert_eq!(
        config.listeners.admin_ipv6,
        Some("[::1]:15000".parse().unwrap())
    );
    assert_eq!(config.listeners.stats, "[::]:15020".parse().unwrap());
    assert_eq!(
        config.inpod.uds,
        PathBuf::from("/var/run/ztunnel/ztunnel.sock")
    );
    assert!(config.inpod.port_reuse && config.inpod.ipv6_enabled);
    assert_eq!(config.inpod.original_source, None);
    assert_eq!(config.max_pending_handshakes, 4096);
    assert_eq!(config.max_connections, 65_536);
    assert_eq!(config.min_connections_per_pod, 256, "a 256th of the bound");
    let small = parse(&["--max-connections", "100"]).unwrap();
    assert_eq!(small.min_connections_per_pod, 1, "at least one");
    let floor = parse(&["--min-connections-per-pod", "1000"]).unwrap();
    assert_eq!(floor.min_connections_per_pod, 1000);
    let limited = parse(&["--max-pending-handshakes", "100"]).unwrap();
    assert_eq!(limited.max_pending_handshakes, 100);
    assert!(config.inpod.same_node_shortcut, "on by default");
    let off = parse(&["--same-node-shortcut", "false"]).unwrap();
    assert!(!off.inpod.same_node_shortcut);
    assert!(config.inpod.same_node_splice, "on by default");
    let copied = parse(&["--same-node-splice", "false"]).unwrap();
    assert!(!copied.inpod.same_node_splice && copied.inpod.same_node_shortcut);
}

#[test]
fn the_cpu_limit_sets_the_workers_unless_they_are_set() {
    // A quarter of the cores, at least 2 (the table is in config/workers.rs).
    assert_eq!(parse(&["--cpu-limit", "1"]).unwrap().worker_threads, 2);
    assert_eq!(parse(&["--cpu-limit", "32"]).unwrap().worker_threads, 8);
    let limited = parse(&["--cpu-limit", "32", "--resource-cpu-limit", "1500m"]).unwrap();
    assert_eq!(limited.worker_threads, 2);
    let both = parse(&["--cpu-limit", "8", "--worker-threads", "3"]).unwrap();
    assert_eq!(both.worker_threads, 3);
    let share = parse(&["--cpu-limit", "8", "--worker-threads", "50%"]).unwrap();
    assert_eq!(share.worker_threads, 4);
}

#[test]
fn the_drain_deadline_comes_before_kubelets_sigkill() {
    // Grace period → deadline, in seconds: AMBIENT.md §7.1's table, then
    // where Istio's rule wraps round (0) and the ends of the range.
    let rows: &[(u64, u64, &str)] = &[
        (30, 25, "the chart's grace: 5 s of margin"),
        (15, 10, "over 10 s: 5 s of margin"),
        (11, 6, "just over 10 s: 5 s of margin"),
        (10, 9, "10 s and under: 1 s of margin"),
        (5, 4, "1 s of margin"),
        (2, 1, "1 s of margin"),
        (1, 1, "at least 1 s"),
        (
            0,
            0,
            "SIGKILL follows at once: close at once, no wrap-round",
        ),
        (u64::MAX, u64::MAX - 5, "no overflow"),
    ];
    for &(grace, deadline, why) in rows {
        assert_eq!(
            drain_deadline(Duration::from_secs(grace)),
            Duration::from_secs(deadline),
            "grace {grace} s: {why}"
        );
    }
    let half = Duration::from_millis(500);
    assert_eq!(drain_deadline(half), half, "never past the grace period");
}

#[test]
fn the_connection_termination_deadline_wins_over_the_grace_period() {
    let deadline = |args: &[&str]| parse(args).unwrap().drain_deadline;
    assert_eq!(deadline(&[]), Duration::from_secs(5), "Istio's default");
    let grace = ["--termination-grace-period-seconds", "30"];
    assert_eq!(deadline(&grace), Duration::from_secs(25));
    let explicit = ["--connection-termination-deadline", "10s"];
    assert_eq!(deadline(&explicit), Duration::from_secs(10));
    assert_eq!(
        deadline(&[explicit.as_slice(), grace.as_slice()].concat()),
        Duration::from_secs(10)
    );
    assert_eq!(
        deadline(&["--connection-termination-deadline", "7"]),
        Duration::from_secs(7),
        "a bare number is seconds"
    );
}

#[test]
fn bad_values_name_their_variable() {
    let cases: &[(&[&str], &str)] = &[
        (&["--proxy-mode", "sidecar"], "PROXY_MODE"),
        (&["--secret-ttl", "soon"], "SECRET_TTL"),
        (
            &["--pool-unused-release-timeout=-1s"],
            "POOL_UNUSED_RELEASE_TIMEOUT",
        ),
        (&["--worker-threads", "0%"], "ZTUNNEL_WORKER_THREADS"),
        (&["--resource-cpu-limit", "0"], "ZTUNNEL_RESOURCE_CPU_LIMIT"),
        (
            &["--resource-cpu-request", "x"],
            "ZTUNNEL_RESOURCE_CPU_REQUEST",
        ),
        (&["--cpu-limit", "0"], "ZTUNNEL_CPU_LIMIT"),
        (&["--max-pending-handshakes", "0"], "MAX_PENDING_HANDSHAKES"),
        (&["--max-connections", "0"], "MAX_CONNECTIONS"),
        (
            &["--min-connections-per-pod", "0"],
            "MIN_CONNECTIONS_PER_POD",
        ),
        (
            &["--max-connections", "10", "--min-connections-per-pod", "11"],
            "MIN_CONNECTIONS_PER_POD",
        ),
        (
            &["--connection-termination-deadline", "soon"],
            "CONNECTION_TERMINATION_DEADLINE",
        ),
        (
            &["--termination-grace-period-seconds=-1"],
            "TERMINATION_GRACE_PERIOD_SECONDS",
        ),
    ];
    for (args, name) in cases {
        let error = parse(args).unwrap_err();
        assert!(error.to_string().starts_with(name), "{args:?}: {error}");
    }
    assert!(matches!(
        parse(&["--packet-mark", "x"]),
        Err(ConfigError::Args(_))
    ));
}

#[test]
fn istios_chart_arguments_run_the_proxy_and_its_words_are_understood() {
    assert!(
        parse(&["proxy", "ztunnel"]).is_ok(),
        "Istio's ztunnel chart args"
    );
    assert!(parse(&["proxy"]).is_ok());
    let kind = |args: &[&str]| match parse(args) {
        Err(ConfigError::Args(error)) => Some(error.kind()),
        _ => None,
    };
    let printed = |args: &[&str]| match parse(args) {
        Err(ConfigError::Print(text)) => text,
        other => panic!("{args:?}: {other:?}"),
    };
    for version in [&["version"][..], &["--version"], &["-V"]] {
        assert!(
            printed(version).starts_with("version.BuildInfo{Version:\""),
            "{version:?}"
        );
    }
    assert!(printed(&["help"]).contains("CA_ADDRESS"));
    assert_eq!(kind(&["serve"]), Some(clap::error::ErrorKind::InvalidValue));
}

#[test]
fn istios_cluster_id_variable_wins_over_cluster_id_but_not_over_the_flag() {
    let with_env = |args: &[&str], env: &[(&str, &str)]| {
        let env = env
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()));
        Config::from_args_and_env(std::iter::once("ztunnel").chain(args.iter().copied()), env)
            .unwrap()
            .cluster_id
    };
    let istio = [("ISTIO_META_CLUSTER_ID", "east")];
    assert_eq!(with_env(&[], &istio), "east");
    assert_eq!(with_env(&["--cluster-id", "west"], &istio), "west");
    assert_eq!(
        with_env(&[], &[("ISTIO_META_CLUSTER_ID", "")]),
        "Kubernetes"
    );
}

#[test]
fn a_proxy_application_tunnel_is_dialled_on_loopback_unless_turned_off() {
    assert!(parse(&[]).unwrap().localhost_app_tunnel, "on by default");
    let off = parse(&["--localhost-app-tunnel", "false"]).unwrap();
    assert!(!off.localhost_app_tunnel);
}

#[test]
fn keepalive_follows_istio() {
    let keepalive = parse(&[]).unwrap().keepalive;
    assert_eq!(keepalive, crate::socket::Keepalive::default());
    let minutes = |m: u64| Duration::from_secs(m * 60);
    assert_eq!(
        (keepalive.enabled, keepalive.time, keepalive.interval),
        (true, minutes(3), minutes(3))
    );
    assert_eq!((keepalive.retries, keepalive.user_timeout()), (9, None));

    // Istio's variable names.
    let command = Args::command();
    let envs: Vec<_> = command
        .get_arguments()
        .filter(|arg| {
            arg.get_id().as_str().contains("keepalive") || arg.get_id() == "user_timeout_enabled"
        })
        .filter_map(|arg| arg.get_env()?.to_str())
        .collect();
    assert_eq!(
        envs,
        [
            "KEEPALIVE_ENABLED",
            "KEEPALIVE_TIME",
            "KEEPALIVE_INTERVAL",
            "KEEPALIVE_RETRIES",
            "USER_TIMEOUT_ENABLED"
        ]
    );

    let set = parse(&[
        "--keepalive-enabled=false",
        "--keepalive-time=1m",
        "--keepalive-interval=5",
        "--keepalive-retries=3",
        "--user-timeout-enabled=true",
    ])
    .unwrap()
    .keepalive;
    assert!(!set.enabled);
    assert_eq!(
        (set.time, set.interval),
        (minutes(1), Duration::from_secs(5))
    );
    assert_eq!(set.user_timeout(), Some(Duration::from_secs(75)));
}

#[test]
fn keepalive_values_the_kernel_refuses_fail_start_up() {
    let cases = [
        ("--keepalive-time=0s", "KEEPALIVE_TIME"),
        ("--keepalive-time=1500ms", "KEEPALIVE_TIME"),
        ("--keepalive-interval=10h", "KEEPALIVE_INTERVAL"),
        ("--keepalive-interval=soon", "KEEPALIVE_INTERVAL"),
        ("--keepalive-retries=0", "KEEPALIVE_RETRIES"),
        ("--keepalive-retries=128", "KEEPALIVE_RETRIES"),
    ];
    for (flag, name) in cases {
        let error = parse(&[flag]).unwrap_err();
        assert!(error.to_string().starts_with(name), "{flag}: {error}");
    }
}

#[test]
fn ca_headers_and_the_alternative_ca_name_are_read() {
    let env = |pairs: &[(&str, &str)]| {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        Config::from_args_and_env(["ztunnel", "--alt-ca-hostname", "istiod.example"], pairs)
    };
    let config = env(&[("CA_HEADER_X_TENANT", "blue"), ("XDS_HEADER_X_OTHER", "1")]).unwrap();
    assert_eq!(config.ca_headers.names().collect::<Vec<_>>(), ["x_tenant"]);
    assert_eq!(config.ca_alt_hostname.as_deref(), Some("istiod.example"));
    let Err(error) = env(&[("CA_HEADER_BAD NAME", "x")]) else {
        panic!("a header name with a space is refused")
    };
    assert!(
        ErrorChain(&error).to_string().contains("CA_HEADER_"),
        "{error}"
    );
}

#[test]
fn ca_root_ca_and_auth_token_are_read_as_istio_reads_them_for_the_ca_and_xds() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("root-cert.pem");
    std::fs::write(&file, "").unwrap();
    let file_text = file.to_str().unwrap();
    let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let rows: &[(&str, RootSource)] = &[
        (file_text, RootSource::File(file.clone())),
        ("SYSTEM", RootSource::System),
        (pem, RootSource::Pem(pem.to_owned())),
        // Mounted later: still a file, looked for on each call.
        (
            "./var/run/secrets/istio/root-cert.pem",
            RootSource::File(PathBuf::from("./var/run/secrets/istio/root-cert.pem")),
        ),
    ];
    for (value, expected) in rows {
        // `=`: clap takes PEM's leading dashes for a flag otherwise.
        let config = parse(&[&format!("--ca-root-ca={value}")]).unwrap();
        assert_eq!(&config.ca_root_ca, expected, "{value}");
    }
    let literal = parse(&["--auth-token", "a-literal-token"]).unwrap();
    let expected = TokenSource::Literal(LiteralToken::new("a-literal-token".to_owned()));
    assert_eq!(literal.auth_token, expected);
    assert_eq!(literal.xds.unwrap().token, expected, "the same for xDS");
    let from_file = parse(&["--auth-token", file_text]).unwrap();
    assert_eq!(from_file.auth_token, TokenSource::File(file));
}

#[test]
fn with_ipv6_off_every_listener_is_on_ipv4_as_istio_binds_them() {
    let config = parse(&["--ipv6-enabled", "false"]).unwrap();
    let listeners = config.listeners;
    let bound = [
        (listeners.outbound, "0.0.0.0:15001"),
        (listeners.inbound_plaintext, "0.0.0.0:15006"),
        (listeners.inbound, "0.0.0.0:15008"),
        (listeners.admin, "127.0.0.1:15000"),
        (listeners.stats, "0.0.0.0:15020"),
        (listeners.readiness, "0.0.0.0:15021"),
    ];
    for (addr, expected) in bound {
        assert_eq!(addr, expected.parse().unwrap());
    }
    assert_eq!(listeners.admin_ipv6, None, "no [::1] either");
    // An address given is kept, and the admin's is its only one.
    let given = parse(&[
        "--admin-addr",
        "127.0.0.1:16000",
        "--stats-addr",
        "[::]:16020",
    ])
    .unwrap();
    assert_eq!(given.listeners.admin_ipv6, None);
    assert_eq!(given.listeners.stats, "[::]:16020".parse().unwrap());
}

#[test]
fn pqc_compliance_policy_limits_handshakes_to_the_post_quantum_group() {
    assert_eq!(parse(&[]).unwrap().key_exchange, KeyExchange::Classical);
    let pqc = parse(&["--compliance-policy", "pqc"]).unwrap();
    assert_eq!(pqc.key_exchange, KeyExchange::PostQuantum);
    // Istio's other policy asks for what every handshake here has already.
    let fips = parse(&["--compliance-policy", "fips-140-2"]).unwrap();
    assert_eq!(fips.key_exchange, KeyExchange::Classical);
}

#[test]
fn proxy_config_from_the_mesh_config_and_proxy_config_sets_ports_workers_xds_and_dns() {
    let dir = tempfile::tempdir().unwrap();
    let mesh = dir.path().join("mesh");
    // As the `istio` ConfigMap's `mesh` key holds it: other fields are
    // Istio's business.
    std::fs::write(
        &mesh,
        "accessLogFile: /dev/stdout\n\
         defaultConfig:\n  \
           discoveryAddress: istiod.example:15012\n  \
           proxyAdminPort: 15100\n  \
           statsPort: 15120\n  \
           concurrency: 3\n  \
           tracing: {}\n  \
           proxyMetadata:\n    \
             ISTIO_META_DNS_CAPTURE: \"false\"\n    \
             DNS_PROXY_ADDR: \"127.0.0.1:15055\"\n",
    )
    .unwrap();
    let mesh_flag = format!("--mesh-config={}", mesh.display());
    let from = |proxy_config: Option<&str>, env: &[(&str, &str)]| {
        let mut args = vec!["ztunnel".to_owned(), mesh_flag.clone()];
        if let Some(text) = proxy_config {
            args.push(format!("--proxy-config={text}"));
        }
        let env = env
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()));
        Config::from_args_and_env(args, env).unwrap()
    };

    let config = from(None, &[]);
    assert_eq!(config.listeners.admin, "127.0.0.1:15100".parse().unwrap());
    assert_eq!(
        config.listeners.admin_ipv6,
        Some("[::1]:15100".parse().unwrap())
    );
    assert_eq!(config.listeners.stats, "[::]:15120".parse().unwrap());
    assert_eq!(config.worker_threads, 3);
    let xds = config.xds.unwrap();
    assert_eq!(xds.address.to_string(), "istiod.example:15012");
    assert!(!config.dns.enabled, "DNS_CAPTURE false in the metadata");
    assert_eq!(
        config.dns.address,
        DnsAddress::Socket("127.0.0.1:15055".parse().unwrap())
    );

    // PROXY_CONFIG over the mesh config, field by field; the ISTIO_META_
    // variables over both metadata.
    let config = from(
        Some(
            r#"{"statsPort": 15220, "proxyMetadata": {"ISTIO_META_DNS_PROXY_ADDR": "127.0.0.1:15056"}}"#,
        ),
        &[("ISTIO_META_DNS_CAPTURE", "true")],
    );
    assert_eq!(config.listeners.stats, "[::]:15220".parse().unwrap());
    assert_eq!(config.listeners.admin, "127.0.0.1:15100".parse().unwrap());
    assert!(config.dns.enabled, "the variable wins");
    assert_eq!(
        config.dns.address,
        DnsAddress::Socket("127.0.0.1:15056".parse().unwrap())
    );
    let config = from(None, &[("ISTIO_META_DNS_PROXY_ADDR", "localhost:15057")]);
    assert_eq!(config.dns.address, DnsAddress::Localhost(15057));

    // Variables and flags win over both.
    let mut args = vec!["ztunnel".to_owned(), mesh_flag.clone()];
    args.extend(
        [
            "--stats-addr",
            "[::]:16020",
            "--worker-threads",
            "5",
            "--xds-address",
            "https://other:15012",
        ]
        .map(str::to_owned),
    );
    let config = Config::from_args_and_env(args, std::iter::empty()).unwrap();
    assert_eq!(config.listeners.stats, "[::]:16020".parse().unwrap());
    assert_eq!(config.worker_threads, 5);
    assert_eq!(
        config.xds.unwrap().address.to_string(),
        "https://other:15012"
    );

    // A missing mesh config is none; a malformed one or PROXY_CONFIG fails.
    let missing = format!("--mesh-config={}", dir.path().join("absent").display());
    let config = Config::from_args_and_env(["ztunnel", missing.as_str()], std::iter::empty());
    assert_eq!(
        config.unwrap().listeners.admin,
        "127.0.0.1:15000".parse().unwrap()
    );
    std::fs::write(&mesh, "defaultConfig: [not, a, map]\n").unwrap();
    let error =
        Config::from_args_and_env(["ztunnel", mesh_flag.as_str()], std::iter::empty()).unwrap_err();
    assert!(error.to_string().starts_with("--mesh-config"), "{error}");
    let error = parse(&["--proxy-config", "statsPort: lots"]).unwrap_err();
    assert!(error.to_string().starts_with("PROXY_CONFIG"), "{error}");
}

#[test]
fn crl_path_is_read() {
    assert_eq!(
        parse(&["--crl-path", "/etc/istio/crl/ca-crl.pem"])
            .unwrap()
            .crl_path,
        Some(PathBuf::from("/etc/istio/crl/ca-crl.pem"))
    );
    assert_eq!(parse(&[]).unwrap().crl_path, None);
}

#[test]
fn the_dns_proxy_is_on_unless_dns_capture_says_otherwise() {
    let config = parse(&[]).unwrap();
    assert_eq!(
        config.dns,
        DnsSettings {
            enabled: true,
            address: DnsAddress::Localhost(15053),
            cluster_domain: "cluster.local".into(),
            preferred_namespace: None,
            upstream: DnsUpstream::ResolvConf("/etc/resolv.conf".into()),
        }
    );
    for (value, enabled) in [
        ("true", true),
        ("TRUE", true),
        ("false", false),
        ("", false),
        ("no", false),
    ] {
        let config = parse(&["--dns-capture", value]).unwrap();
        assert_eq!(config.dns.enabled, enabled, "{value:?}");
    }
    let config = parse(&[
        "--cluster-domain",
        "Corp.Internal.",
        "--dns-upstreams",
        "198.18.0.53:53,[::1]:5353",
        "--prefered-service-namespace",
        "shared",
    ])
    .unwrap();
    assert_eq!(&*config.dns.cluster_domain, "corp.internal");
    assert_eq!(config.dns.preferred_namespace.as_deref(), Some("shared"));
    assert_eq!(
        config.dns.upstream,
        DnsUpstream::Servers(vec![
            "198.18.0.53:53".parse().unwrap(),
            "[::1]:5353".parse().unwrap()
        ])
    );
    let error = parse(&["--dns-upstreams", "nameserver"]).unwrap_err();
    assert!(error.to_string().starts_with("DNS_UPSTREAMS"), "{error}");
}

#[test]
fn the_dns_proxy_listens_where_dns_proxy_addr_says_as_istio_reads_it() {
    let address = |args: &[&str]| parse(args).map(|config| config.dns.address);
    let cases: [(&[&str], DnsAddress); 6] = [
        (&["--dns-proxy-port", "5353"], DnsAddress::Localhost(5353)),
        (
            &["--dns-proxy-addr", "localhost:15054"],
            DnsAddress::Localhost(15054),
        ),
        (
            &["--dns-proxy-addr", "LocalHost:53"],
            DnsAddress::Localhost(53),
        ),
        (
            &["--dns-proxy-addr", "127.0.0.53:53"],
            DnsAddress::Socket("127.0.0.53:53".parse().unwrap()),
        ),
        (
            &["--dns-proxy-addr", "[::1]:15053"],
            DnsAddress::Socket("[::1]:15053".parse().unwrap()),
        ),
        (
            &[
                "--dns-proxy-port",
                "5353",
                "--dns-proxy-addr",
                "localhost:15053",
            ],
            DnsAddress::Localhost(15053),
        ),
    ];
    for (args, expected) in cases {
        assert_eq!(address(args).unwrap(), expected, "{args:?}");
    }
    for bad in [
        "localhost",
        "localhost:port",
        "dns.example:53",
        "127.0.0.1",
        ":53",
        "localhost:70000",
    ] {
        let error = address(&["--dns-proxy-addr", bad]).unwrap_err().to_string();
        assert!(error.starts_with("DNS_PROXY_ADDR"), "{bad}: {error}");
    }
}
