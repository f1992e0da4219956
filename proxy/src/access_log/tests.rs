use std::io;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::*;
use crate::config::LogFormat;
use crate::telemetry::{self, LogOptions};

/// Collects what the subscriber writes, one JSON object a line.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<Value> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }
}

/// Runs `emit` under a JSON subscriber with `filter`; returns the lines.
fn logged(filter: &str, emit: impl FnOnce()) -> Vec<Value> {
    let captured = Captured::default();
    let writer = captured.clone();
    let options = LogOptions {
        filter: filter.to_owned(),
        format: LogFormat::Json,
    };
    let (dispatch, _handle) = telemetry::subscriber(&options, move || writer.clone()).unwrap();
    tracing::dispatcher::with_default(&dispatch, emit);
    captured.lines()
}

fn inbound_mtls() -> ConnectionLog {
    ConnectionLog {
        src_addr: "10.0.0.1:40000".parse().unwrap(),
        dst_addr: "10.0.0.2:8080".parse().unwrap(),
        dst_hbone_addr: Some("10.0.0.2:15008".parse().unwrap()),
        same_node: false,
        peers: Arc::new(Peers {
            src: PeerLog {
                workload: Some("client".into()),
                namespace: Some("a".into()),
                identity: Some("spiffe://cluster.local/ns/a/sa/client".into()),
                cluster: None,
            },
            dst_service: Some("echo.b.svc.cluster.local".into()),
            dst: PeerLog {
                workload: Some("server".into()),
                namespace: Some("b".into()),
                identity: Some("spiffe://cluster.local/ns/b/sa/server".into()),
                cluster: None,
            },
        }),
        direction: Direction::Inbound,
    }
}

#[test]
fn a_successful_close_is_one_info_line_with_every_field() {
    let log = inbound_mtls();
    let lines = logged("info", || {
        complete(
            &log,
            &Outcome {
                bytes_sent: 11,
                bytes_recv: 22,
                duration: Duration::from_millis(1234),
                error: None,
            },
        );
    });
    assert_eq!(lines.len(), 1);
    let line = &lines[0];
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["target"], "access");
    assert_eq!(line["message"], "connection complete");
    assert_eq!(line["src.addr"], "10.0.0.1:40000");
    assert_eq!(
        line["src.identity"],
        "spiffe://cluster.local/ns/a/sa/client"
    );
    assert_eq!(
        line["dst.identity"],
        "spiffe://cluster.local/ns/b/sa/server"
    );
    assert_eq!(line["dst.hbone_addr"], "10.0.0.2:15008");
    assert_eq!(line["dst.service"], "echo.b.svc.cluster.local");
    assert_eq!(line["direction"], "inbound");
    assert_eq!(line["bytes_sent"], 11);
    assert_eq!(line["bytes_recv"], 22);
    assert_eq!(line["duration"], "1234ms");
    assert!(line.get("error").is_none());
    assert!(
        line.get("src.cluster").is_none(),
        "missing values are left out"
    );
    assert!(line.get("path").is_none(), "the network path is not named");
}

#[test]
fn a_same_node_connection_says_so() {
    let log = ConnectionLog {
        same_node: true,
        ..inbound_mtls()
    };
    let lines = logged("info", || {
        complete(
            &log,
            &Outcome {
                bytes_sent: 1,
                bytes_recv: 2,
                duration: Duration::from_millis(3),
                error: None,
            },
        );
    });
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["path"], "same-node");
    assert_eq!(lines[0]["message"], "connection complete");
}

#[test]
fn a_failed_close_is_an_error_line_with_the_error() {
    let mut log = inbound_mtls();
    Arc::make_mut(&mut log.peers).src.identity = None;
    log.direction = Direction::Outbound;
    let error = io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused");
    let lines = logged("info", || {
        complete(
            &log,
            &Outcome {
                bytes_sent: 0,
                bytes_recv: 0,
                duration: Duration::from_millis(3),
                error: Some(&error),
            },
        );
    });
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["level"], "ERROR");
    assert_eq!(lines[0]["error"], "connection refused");
    assert_eq!(lines[0]["direction"], "outbound");
    assert!(
        lines[0].get("src.identity").is_none(),
        "no identity without mTLS"
    );
}

#[test]
fn opened_is_debug_only_and_has_no_byte_fields() {
    let log = inbound_mtls();
    assert!(logged("info", || opened(&log)).is_empty());
    let lines = logged("access=debug", || opened(&log));
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["message"], "connection opened");
    assert_eq!(lines[0]["level"], "DEBUG");
    assert!(lines[0].get("bytes_sent").is_none());
    assert!(lines[0].get("duration").is_none());
}

#[test]
fn an_early_deny_is_a_warn_line() {
    let lines = logged("info", || {
        failed(
            "127.0.0.1:5000".parse().unwrap(),
            "127.0.0.1:15001".parse().unwrap(),
            Direction::Outbound,
            &io::Error::other("attempted recursive call to ourselves"),
        );
    });
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["level"], "WARN");
    assert_eq!(lines[0]["message"], "connection failed");
    assert_eq!(lines[0]["dst.addr"], "127.0.0.1:15001");
    assert_eq!(lines[0]["error"], "attempted recursive call to ourselves");
}
