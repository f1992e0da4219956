//! The API server's way into a real cluster's network: an HTTP CONNECT
//! proxy on a unix socket, which kube-apiserver's egress selector uses for
//! its `cluster` traffic (admission webhooks such as istiod's, and the
//! kubelets' logs, exec and port-forward), dialling from inside the
//! cluster's fabric namespace.
//!
//! The API server runs in this process's namespace, where no route leads
//! to the nodes or pods; the proxy lets it reach them as a control plane
//! node would, without changing any interface or route of the host. Only
//! addresses of the test range (198.18.0.0/15) are dialled: anything else
//! is answered 403 and logged.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use nix::sched::{CloneFlags, setns};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::netns::NetNs;

/// The most a CONNECT request's head may take.
const MAX_HEAD: usize = 8 * 1024;
/// The bound on reading a request's head, and on each dial.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running proxy; stops on drop, closing every connection.
pub struct EgressProxy {
    runtime: Option<tokio::runtime::Runtime>,
    socket: PathBuf,
}

impl EgressProxy {
    /// Listens on the unix socket `socket` and dials each CONNECT target
    /// from inside `ns`.
    pub fn start(ns: &NetNs, socket: &Path) -> anyhow::Result<EgressProxy> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("egress-proxy")
            .enable_all()
            .build()?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::UnixListener::bind(socket)
                .with_context(|| format!("binding {}", socket.display()))?
        };
        let netns = ns.path();
        runtime.spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let netns = netns.clone();
                tokio::spawn(async move {
                    if let Err(error) = serve(client, netns).await {
                        eprintln!("egress proxy: {error:#}");
                    }
                });
            }
        });
        Ok(EgressProxy {
            runtime: Some(runtime),
            socket: socket.to_owned(),
        })
    }

    /// The API server's egress selector configuration that sends its
    /// `cluster` traffic through this proxy.
    pub fn selector_config(&self) -> String {
        serde_json::json!({
            "apiVersion": "apiserver.k8s.io/v1beta1",
            "kind": "EgressSelectorConfiguration",
            "egressSelections": [{
                "name": "cluster",
                "connection": {
                    "proxyProtocol": "HTTPConnect",
                    "transport": {"uds": {"udsName": self.socket}},
                },
            }],
        })
        .to_string()
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// One client: its CONNECT head, the dial, the answer, then the bytes both
/// ways.
async fn serve(mut client: UnixStream, netns: PathBuf) -> anyhow::Result<()> {
    let head = tokio::time::timeout(STEP_TIMEOUT, read_head(&mut client))
        .await
        .context("no CONNECT head in time")??;
    let target = match connect_target(&head) {
        Ok(target) => target,
        Err(reason) => {
            client
                .write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                .await?;
            anyhow::bail!("refused: {reason}");
        }
    };
    let dialled = tokio::task::spawn_blocking(move || dial_in(&netns, target)).await?;
    let mut upstream = match dialled {
        Ok(stream) => {
            stream.set_nonblocking(true)?;
            tokio::net::TcpStream::from_std(stream)?
        }
        Err(error) => {
            client
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                .await?;
            return Err(error).with_context(|| format!("dialling {target}"));
        }
    };
    client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    Ok(())
}

/// Reads up to the blank line that ends a request's head; nothing past it
/// (a CONNECT client waits for the answer before it sends more).
async fn read_head(client: &mut UnixStream) -> anyhow::Result<String> {
    let mut head = Vec::with_capacity(256);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        anyhow::ensure!(head.len() < MAX_HEAD, "CONNECT head over {MAX_HEAD} bytes");
        let read = client.read(&mut byte).await?;
        anyhow::ensure!(read == 1, "closed before the end of the CONNECT head");
        head.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// The address of a `CONNECT <ip>:<port> HTTP/1.1` head, if it is one of
/// the test range's.
fn connect_target(head: &str) -> Result<SocketAddr, String> {
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some("CONNECT"), Some(authority)) = (parts.next(), parts.next()) else {
        return Err(format!("not a CONNECT: {line:?}"));
    };
    let target: SocketAddr = authority
        .parse()
        .map_err(|_| format!("not an address and port: {authority:?}"))?;
    match target.ip() {
        IpAddr::V4(ip) if ip.octets()[0] == 198 && ip.octets()[1] & 0xfe == 18 => Ok(target),
        _ => Err(format!("{target} is outside 198.18.0.0/15")),
    }
}

/// A TCP connection to `target` made from inside the namespace at `netns`
/// (the socket keeps that namespace once made).
fn dial_in(netns: &Path, target: SocketAddr) -> io::Result<TcpStream> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let file = std::fs::File::open(netns)?;
                setns(&file, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
                TcpStream::connect_timeout(&target, STEP_TIMEOUT)
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("dialling thread panicked")))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a panic is a failed test

    use super::*;

    #[test]
    fn only_test_range_addresses_are_dialled() {
        let head = |line: &str| format!("{line}\r\nHost: x\r\n\r\n");
        assert_eq!(
            connect_target(&head("CONNECT 198.18.0.11:10250 HTTP/1.1")),
            Ok("198.18.0.11:10250".parse().unwrap())
        );
        assert_eq!(
            connect_target(&head("CONNECT 198.19.255.1:443 HTTP/1.1")),
            Ok("198.19.255.1:443".parse().unwrap())
        );
        for refused in [
            "CONNECT 10.96.0.1:443 HTTP/1.1",
            "CONNECT 198.20.0.1:443 HTTP/1.1",
            "CONNECT node-a:10250 HTTP/1.1",
            "GET / HTTP/1.1",
            "",
        ] {
            assert!(connect_target(&head(refused)).is_err(), "{refused}");
        }
    }
}
