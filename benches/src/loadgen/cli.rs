//! The command line: the `serve` and `dns-server` commands and the client
//! modes, parsed once into typed values (addresses, destinations, names,
//! durations, sizes). What each mode does with them lives in its own
//! module.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

use super::protocol::MAX_MESSAGE;

/// The longest duration accepted. A run of more than a day is not a
/// benchmark, and the cap keeps deadline arithmetic far from overflow.
const MAX_SECONDS: f64 = 86_400.0;

/// The highest total request rate accepted; far above what one host can
/// answer, it only keeps the schedule's arithmetic meaningful.
const MAX_RATE: f64 = 1e9;

/// The longest DNS name (RFC 1035: 255 octets on the wire, 253 as text).
const MAX_NAME: usize = 253;

/// The longest label of a DNS name (RFC 1035).
const MAX_LABEL: usize = 63;

/// The most DNS queries outstanding at once: far more than one client
/// needs to saturate a proxy, and few enough that ids (16 bits) are found
/// free at once.
const MAX_IN_FLIGHT: i64 = 4096;

/// Load generator for ztunnel benchmarks: a server and five client modes
/// that measure throughput, latency, connection set-up and idle connections,
/// and count what a rollout disturbs (soak); `resolve` and `dns` ask a
/// pod's DNS, and `dns-server` is a nameserver for `dns`.
///
/// Run `serve` on the far side and a client mode on the near side; between
/// them there may be nothing, proxies, or a tunnel. Each client connection
/// starts with a 16-byte header (big-endian): magic "ZLG1", mode byte
/// (1 sink, 2 source, 3 echo), flags byte (bit 0: server closes after its
/// first response), two zero bytes, u32 request size, u32 response size.
///
/// Every client run ends by printing one JSON object as the last line of
/// stdout, the mode's figures below plus `"cpu_s":F`, the CPU seconds this
/// process used; earlier stdout lines are `{"event":...}` objects. Progress for
/// people goes to stderr once a second on runs longer than 3 s. If every
/// attempt fails the report is still printed and the exit status is 1.
/// Client runs other than idle are bounded by --duration and their count
/// limit; a signal ends them without a report.
///
/// `ztunnel-loadgen <COMMAND> --help` describes each command's flags and output.
#[derive(Debug, Parser)]
#[command(name = "ztunnel-loadgen", version)]
pub struct Cli {
    /// Worker threads for the runtime; 1 runs everything on the main thread,
    /// which leaves the most CPU to the proxies being measured.
    #[arg(long, global = true, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,

    /// No progress lines on stderr.
    #[arg(long, global = true)]
    pub quiet: bool,

    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The program's commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve every client mode on one port until SIGTERM or SIGINT.
    ///
    /// Prints `{"event":"listening","addr":"IP:PORT"}` on stdout once bound
    /// (with the real port when given port 0). A connection with a bad header
    /// is closed and logged on stderr; the server keeps serving.
    Serve(ServeArgs),
    /// Bulk transfer over N connections, one direction.
    ///
    /// Prints `{"mode":"stream","direction":"up|down","connections":N,
    /// "duration_s":F,"bytes":N,"gbit_per_s":F,"errors":N}`. Bytes are those
    /// the client wrote (up) or read (down).
    Stream(StreamArgs),
    /// Fixed-size requests and responses over C connections, closed loop or
    /// at a fixed total rate.
    ///
    /// Prints `{"mode":"rr","connections":C,"duration_s":F,"requests":N,
    /// "requests_per_s":F,"errors":N,"latency_us":{"p50":F,"p90":F,"p99":F,
    /// "p999":F,"max":F,"mean":F}}`. At a fixed rate, a request held back by
    /// a slow response is charged from its intended send time, so a stall is
    /// not hidden by the requests it delayed (no coordinated omission); this
    /// program's own timer lateness is not charged.
    Rr(RrArgs),
    /// A new connection for every request: connect, send one request, read
    /// the full response, close.
    ///
    /// Prints `{"mode":"connect","connections_made":N,"connections_per_s":F,
    /// "errors":N,"connect_us":{...},"setup_us":{...}}` where connect_us is
    /// the connect() call and setup_us runs from the start of connect() to
    /// the full first response.
    Connect(ConnectArgs),
    /// Open N connections, prove each with a 1-byte round trip, and hold them.
    ///
    /// Prints `{"event":"holding","held":N,"errors":N}` once open, holds for
    /// --hold seconds or until stdin reaches EOF or SIGTERM/SIGINT (whichever
    /// comes first), then prints `{"mode":"idle","held":N,"errors":N,
    /// "dropped":N,"open_s":F}`; dropped counts held connections the far side
    /// had closed by then. Keep stdin open (a pipe) or pass --ignore-stdin,
    /// else the hold ends at once. Needs N + 64 open files (`ulimit -n`).
    Idle(IdleArgs),
    /// Traffic a rollout must not disturb, counted: long-lived connections
    /// and a steady stream of new short ones, for --duration or until
    /// SIGTERM/SIGINT.
    ///
    /// --connections long-lived connections each send a 32-byte message
    /// every 200 ms and check its echo; one that breaks (any error, EOF or
    /// wrong answer before the run ends) is counted with its time and
    /// replaced. Meanwhile --rate new connections a second each send one
    /// message, check the echo and close. HOST may be a name: it is resolved
    /// again for every connection opened.
    ///
    /// Every second stdout gets one line of the counts so far,
    /// `{"event":"soak","started_unix_s":F,"elapsed_s":F,"new":{"ok":N,"failed":KINDS},
    /// "long_lived":{"wanted":N,"open":N,"exchanges":N,"broken":KINDS,
    /// "breaks":[{"at_s":F,"kind":K},...],"replaced":N,"open_failed":KINDS}}`,
    /// and when the run ends the same counts as `{"mode":"soak",...,
    /// "cpu_s":F}`, the last line of all output (stderr included), so
    /// `kubectl logs --tail=1` reads it. KINDS is `{"refused":N,"reset":N,
    /// "timeout":N,"closed":N,"wrong":N,"unreachable":N,"resolve":N,
    /// "other":N}`; K is one of those names. breaks lists the first 100.
    /// Nothing goes to stderr while it runs; the exit status is 0 whenever
    /// the final line was printed: judging the counts is the caller's part.
    Soak(SoakArgs),
    /// Looks names up with the system resolver (getaddrinfo, so the pod's
    /// resolv.conf and search list apply), each once, in order.
    ///
    /// Prints `{"mode":"resolve","results":[{"name":N,"addresses":[IP,...]}
    /// | {"name":N,"error":TEXT},...]}`, the last line of all output. A
    /// name that does not resolve is a result, not a failure of the
    /// program: judging the results is the caller's part.
    Resolve(ResolveArgs),
    /// DNS A queries over UDP to one nameserver, closed loop, with
    /// --in-flight queries outstanding, round robin over the names.
    ///
    /// Without --server it asks the first nameserver of /etc/resolv.conf
    /// (port 53), as an application in a pod would, so a DNS proxy that
    /// captures the pod's port 53 answers. A query with no reply within
    /// --timeout is a timeout. Ends at --duration or after --max-queries
    /// were sent and answered or timed out, whichever comes first; queries
    /// still open at the end are not counted.
    ///
    /// Prints `{"mode":"dns","server":"IP:PORT","in_flight":N,
    /// "duration_s":F,"sent":N,"answered":N,"with_address":N,
    /// "timeouts":N,"malformed":N,"unmatched":N,"errors":N,
    /// "rcodes":{"NOERROR":N,...},"addresses":[IP,...],"queries_per_s":F,
    /// "latency_us":{...}}`: answered counts replies to open queries
    /// (with_address those with an A record; addresses lists the first 16
    /// distinct ones), malformed what is no DNS response or answers another
    /// question than its id asked, unmatched replies to no open query
    /// (late ones); errors = timeouts + malformed + socket errors.
    Dns(DnsArgs),
    /// A nameserver for `dns`: answers every A query over UDP with
    /// --address (other types with no records) until SIGTERM or SIGINT.
    ///
    /// Prints `{"event":"listening","addr":"IP:PORT"}` once bound. What is
    /// not a standard query is dropped.
    DnsServer(DnsServerArgs),
}

/// Arguments of `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on, e.g. 0.0.0.0:9000; port 0 picks a free port.
    #[arg(long)]
    pub listen: SocketAddr,
}

/// Which way a stream's bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Client to server.
    Up,
    /// Server to client.
    Down,
}

/// Arguments of `stream`.
#[derive(Debug, Args)]
pub struct StreamArgs {
    /// Server address, IP:PORT.
    #[arg(long)]
    pub target: SocketAddr,
    /// Parallel connections.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub connections: u32,
    /// Seconds to transfer for (fractions allowed).
    #[arg(long, default_value = "10", value_parser = positive_seconds)]
    pub duration: Duration,
    /// up: client sends; down: server sends.
    #[arg(long, value_enum)]
    pub direction: Direction,
    /// Stop once this many bytes have moved in total.
    #[arg(long)]
    pub max_bytes: Option<u64>,
}

/// Arguments of `rr`.
#[derive(Debug, Args)]
pub struct RrArgs {
    /// Server address, IP:PORT.
    #[arg(long)]
    pub target: SocketAddr,
    /// Request size in bytes.
    #[arg(long, default_value_t = NonZeroU32::MIN, value_parser = message_size)]
    pub size: NonZeroU32,
    /// Response size in bytes [default: --size].
    #[arg(long, value_parser = message_size)]
    pub response_size: Option<NonZeroU32>,
    /// Parallel connections, each with one request in flight.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub connections: u32,
    /// Seconds to run for (fractions allowed).
    #[arg(long, default_value = "10", value_parser = positive_seconds)]
    pub duration: Duration,
    /// Stop after this many requests in total.
    #[arg(long)]
    pub max_requests: Option<u64>,
    /// Total requests per second over all connections; 0 sends each request
    /// as soon as the previous response is in (closed loop).
    #[arg(long, default_value_t = 0.0, value_parser = rate)]
    pub rate: f64,
}

/// How the connect mode ends each connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Close {
    /// The server closes first after its response and the client closes on
    /// its FIN: every hop, proxies included, sees an ordinary close, and
    /// TIME_WAIT stays off the client's ephemeral ports.
    Server,
    /// The client closes with SO_LINGER 0 right after the response: a reset,
    /// which leaves no TIME_WAIT anywhere but takes the proxies' error paths.
    Reset,
}

/// Arguments of `connect`.
#[derive(Debug, Args)]
pub struct ConnectArgs {
    /// Server address, IP:PORT.
    #[arg(long)]
    pub target: SocketAddr,
    /// Seconds to run for (fractions allowed).
    #[arg(long, default_value = "10", value_parser = positive_seconds)]
    pub duration: Duration,
    /// Stop after this many connection attempts in total.
    #[arg(long)]
    pub max_connections: Option<u64>,
    /// Connections in progress at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,
    /// Request and response size in bytes.
    #[arg(long, default_value_t = NonZeroU32::MIN, value_parser = message_size)]
    pub size: NonZeroU32,
    /// Which side closes each connection.
    #[arg(long, value_enum, default_value_t = Close::Server)]
    pub close: Close,
}

/// Arguments of `idle`.
#[derive(Debug, Args)]
pub struct IdleArgs {
    /// Server address, IP:PORT.
    #[arg(long)]
    pub target: SocketAddr,
    /// Connections to open and hold.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub connections: u32,
    /// Seconds to hold them for (fractions allowed).
    #[arg(long, default_value = "60", value_parser = seconds)]
    pub hold: Duration,
    /// New connections per second; 0 or absent: as fast as possible. At most
    /// 256 connect at once either way.
    #[arg(long, value_parser = rate)]
    pub open_rate: Option<f64>,
    /// Hold for the full --hold even when stdin reaches EOF.
    #[arg(long)]
    pub ignore_stdin: bool,
}

/// A server named by HOST:PORT, as the soak mode dials it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    /// Where the server is.
    pub host: Host,
    /// Its port, never zero.
    pub port: u16,
}

/// The host part of a [`Destination`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// An IP address, dialled as it is.
    Address(IpAddr),
    /// A DNS name, resolved for every connection so that a Service name
    /// follows what the cluster's DNS answers now. Shared, not copied, by
    /// the errors that name it.
    Name(Arc<str>),
}

/// Arguments of `resolve`.
#[derive(Debug, Args)]
pub struct ResolveArgs {
    /// A name to look up; repeat for more.
    #[arg(long = "name", required = true)]
    pub names: Vec<String>,
}

/// Arguments of `dns`.
#[derive(Debug, Args)]
pub struct DnsArgs {
    /// Nameserver, IP:PORT [default: the first nameserver of
    /// /etc/resolv.conf, port 53].
    #[arg(long)]
    pub server: Option<SocketAddr>,
    /// A name to ask for (its A records); repeat for more, asked in turn.
    #[arg(long = "name", required = true, value_parser = dns_name)]
    pub names: Vec<hickory_proto::rr::Name>,
    /// Queries outstanding at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=MAX_IN_FLIGHT))]
    pub in_flight: u32,
    /// Seconds to run for (fractions allowed).
    #[arg(long, default_value = "10", value_parser = positive_seconds)]
    pub duration: Duration,
    /// Stop after sending this many queries.
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_queries: u64,
    /// Seconds a reply may take before its query counts as timed out
    /// (fractions allowed).
    #[arg(long, default_value = "1", value_parser = positive_seconds)]
    pub timeout: Duration,
}

/// Arguments of `dns-server`.
#[derive(Debug, Args)]
pub struct DnsServerArgs {
    /// Address to listen on (UDP), e.g. 198.18.53.2:53; port 0 picks a
    /// free port.
    #[arg(long)]
    pub listen: SocketAddr,
    /// The address every A query is answered with.
    #[arg(long, default_value_t = Ipv4Addr::new(198, 18, 250, 1))]
    pub address: Ipv4Addr,
}

/// Arguments of `soak`.
#[derive(Debug, Args)]
pub struct SoakArgs {
    /// Server, HOST:PORT: HOST is an IP address (IPv6 in brackets) or a DNS
    /// name.
    #[arg(long, value_parser = destination)]
    pub target: Destination,
    /// Long-lived connections to keep open; 0 opens none.
    #[arg(long, default_value_t = 4)]
    pub connections: u32,
    /// New short connections per second; 0 opens none.
    #[arg(long, default_value_t = 10.0, value_parser = rate)]
    pub rate: f64,
    /// Seconds to run for (fractions allowed).
    #[arg(long, default_value = "60", value_parser = positive_seconds)]
    pub duration: Duration,
    /// Seconds that opening a connection, or one message's answer, may take
    /// before it counts as a timeout (fractions allowed).
    #[arg(long, default_value = "5", value_parser = positive_seconds)]
    pub timeout: Duration,
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Address(address) => write!(f, "{}", SocketAddr::new(*address, self.port)),
            Host::Name(name) => write!(f, "{name}:{}", self.port),
        }
    }
}

/// Parses HOST:PORT: an IP socket address, or a DNS name and a port.
fn destination(text: &str) -> Result<Destination, String> {
    if let Ok(address) = text.parse::<SocketAddr>() {
        if address.port() == 0 {
            return Err(format!("{text:?}: the port must not be 0"));
        }
        return Ok(Destination {
            host: Host::Address(address.ip()),
            port: address.port(),
        });
    }
    let Some((name, port)) = text.rsplit_once(':') else {
        return Err(format!("{text:?} is not HOST:PORT"));
    };
    let port = match port.parse::<u16>() {
        Ok(0) | Err(_) => return Err(format!("{text:?}: {port:?} is not a port (1..=65535)")),
        Ok(port) => port,
    };
    let labels = name.strip_suffix('.').unwrap_or(name);
    let label_ok = |label: &str| {
        (1..=MAX_LABEL).contains(&label.len())
            && label
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
    };
    if name.len() > MAX_NAME || !labels.split('.').all(label_ok) {
        return Err(format!(
            "{text:?}: {name:?} is neither an IP address (IPv6 goes in brackets) nor a DNS name"
        ));
    }
    Ok(Destination {
        host: Host::Name(Arc::from(name)),
        port,
    })
}

/// Parses a DNS name, taken as fully qualified (the `dns` mode asks for
/// exactly the name given; search lists are a resolver's business).
fn dns_name(text: &str) -> Result<hickory_proto::rr::Name, String> {
    let mut name = hickory_proto::rr::Name::from_ascii(text)
        .map_err(|error| format!("{text:?} is not a DNS name: {error}"))?;
    if name.num_labels() == 0 {
        return Err(format!("{text:?}: the root is not a name to ask for"));
    }
    name.set_fqdn(true);
    Ok(name)
}

/// Parses seconds (fractions allowed), zero included.
fn seconds(text: &str) -> Result<Duration, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.0..=MAX_SECONDS).contains(&value) {
        return Err(format!("{value} s is outside 0..={MAX_SECONDS} s"));
    }
    Ok(Duration::from_secs_f64(value))
}

/// Parses seconds (fractions allowed), above zero.
fn positive_seconds(text: &str) -> Result<Duration, String> {
    let duration = seconds(text)?;
    if duration.is_zero() {
        return Err("the duration must be above zero".to_owned());
    }
    Ok(duration)
}

/// Parses a per-second rate: zero, or a positive number up to [`MAX_RATE`].
fn rate(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a rate per second"))?;
    if !(0.0..=MAX_RATE).contains(&value) {
        return Err(format!("{value}/s is outside 0..={MAX_RATE}/s"));
    }
    Ok(value)
}

/// Parses a message size: 1 byte up to the protocol's limit.
fn message_size(text: &str) -> Result<NonZeroU32, String> {
    let value: u32 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a size in bytes"))?;
    match NonZeroU32::new(value) {
        Some(size) if value <= MAX_MESSAGE => Ok(size),
        _ => Err(format!("{value} is outside 1..={MAX_MESSAGE} bytes")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_take_fractions_and_refuse_nonsense() {
        assert_eq!(seconds("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(seconds("0"), Ok(Duration::ZERO));
        for bad in ["-1", "NaN", "inf", "1e30", "two"] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
        assert!(positive_seconds("0").is_err());
        assert_eq!(positive_seconds("0.001"), Ok(Duration::from_millis(1)));
    }

    #[test]
    fn rates_and_sizes_have_bounds() {
        assert_eq!(rate("0"), Ok(0.0));
        assert_eq!(rate("1500.5"), Ok(1500.5));
        assert!(rate("-3").is_err());
        assert!(rate("NaN").is_err());
        assert_eq!(message_size("1024"), Ok(NonZeroU32::new(1024).unwrap()));
        assert!(message_size("0").is_err());
        assert!(message_size(&(MAX_MESSAGE as u64 + 1).to_string()).is_err());
    }

    #[test]
    fn the_command_line_parses_into_modes() {
        let cli = Cli::try_parse_from([
            "ztunnel-loadgen",
            "rr",
            "--target",
            "127.0.0.1:9000",
            "--size",
            "1024",
            "--duration",
            "2.5",
            "--rate",
            "1000",
            "--quiet",
        ])
        .unwrap();
        assert!(cli.quiet);
        assert_eq!(cli.threads, 1);
        let Command::Rr(args) = cli.command else {
            panic!("not rr: {:?}", cli.command)
        };
        assert_eq!(args.size.get(), 1024);
        assert_eq!(args.response_size, None);
        assert_eq!(args.duration, Duration::from_millis(2500));
        assert_eq!(args.rate, 1000.0);
    }

    #[test]
    fn destinations_are_addresses_or_names() {
        let name = |host: &str, port| Destination {
            host: Host::Name(Arc::from(host)),
            port,
        };
        let address = |host: &str, port| Destination {
            host: Host::Address(host.parse().unwrap()),
            port,
        };
        let cases = [
            ("127.0.0.1:9000", Ok(address("127.0.0.1", 9000))),
            ("[::1]:80", Ok(address("::1", 80))),
            ("echo:9000", Ok(name("echo", 9000))),
            (
                "echo.soak.svc.cluster.local:9000",
                Ok(name("echo.soak.svc.cluster.local", 9000)),
            ),
            // A fully qualified name keeps its dot: the resolver then skips
            // the search list.
            (
                "echo.soak.svc.cluster.local.:1",
                Ok(name("echo.soak.svc.cluster.local.", 1)),
            ),
            ("echo", Err(())),
            ("echo:0", Err(())),
            ("echo:65536", Err(())),
            ("127.0.0.1:0", Err(())),
            (":9000", Err(())),
            ("a..b:9000", Err(())),
            ("ech o:9000", Err(())),
            // An IPv6 address without brackets is not a name.
            ("::1:9000", Err(())),
        ];
        for (text, expected) in cases {
            assert_eq!(destination(text).map_err(|_| ()), expected, "{text}");
        }
        assert_eq!(
            destination("echo.soak:9000").unwrap().to_string(),
            "echo.soak:9000"
        );
        assert_eq!(destination("[::1]:80").unwrap().to_string(), "[::1]:80");
    }

    #[test]
    fn clap_definitions_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
