//! A stand-in for ztunnel's ZDS client: connects to the agent's
//! SOCK_SEQPACKET socket, says hello, and reads (and acks) requests with
//! the fds they carry. Blocking, with a receive timeout, so a test that
//! waits for a message that never comes fails instead of hanging.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::socket::{
    AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr, connect, recvmsg,
    send, setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;
use prost::Message;
use ztunnel_proto::istio::workload::zds::{
    Ack, Version, WorkloadRequest, WorkloadResponse, ZdsHello, workload_request::Payload,
    workload_response,
};

/// How long a test waits for the agent's next message.
const RECEIVE_TIMEOUT_SECS: i64 = 10;

/// One connected fake ztunnel.
pub struct FakeZtunnel {
    socket: OwnedFd,
}

/// A request and the fds that came with it.
pub struct Received {
    pub payload: Payload,
    pub fds: Vec<OwnedFd>,
}

impl FakeZtunnel {
    /// Connects (retrying for up to 5 s while the socket appears) and sends
    /// the hello.
    pub fn connect(path: &Path) -> FakeZtunnel {
        let deadline = Instant::now() + Duration::from_secs(5);
        let socket = loop {
            let socket = socket(
                AddressFamily::Unix,
                SockType::SeqPacket,
                SockFlag::SOCK_CLOEXEC,
                None,
            )
            .unwrap();
            match connect(socket.as_raw_fd(), &UnixAddr::new(path).unwrap()) {
                Ok(()) => break socket,
                Err(error) if Instant::now() < deadline => {
                    let _ = error;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(error) => panic!("connecting to {}: {error}", path.display()),
            }
        };
        setsockopt(
            &socket,
            sockopt::ReceiveTimeout,
            &TimeVal::new(RECEIVE_TIMEOUT_SECS, 0),
        )
        .unwrap();
        let client = FakeZtunnel { socket };
        let hello = ZdsHello {
            version: Version::V1 as i32,
        };
        client.send(&hello.encode_to_vec());
        client
    }

    fn send(&self, bytes: &[u8]) {
        send(self.socket.as_raw_fd(), bytes, MsgFlags::MSG_NOSIGNAL).unwrap();
    }

    /// The next request; panics on timeout, end of stream or garbage.
    pub fn receive(&self) -> Received {
        self.next().unwrap_or_else(|error| panic!("{error}"))
    }

    /// The next request, or `None` once the agent has closed the
    /// connection or sent nothing within the receive timeout: for a
    /// ztunnel that outlives its agent.
    #[allow(dead_code)] // not every test crate that includes this needs it
    pub fn receive_until_closed(&self) -> Option<Received> {
        self.next().ok()
    }

    fn next(&self) -> Result<Received, String> {
        let mut buf = [0u8; 1024];
        let mut cmsg = nix::cmsg_space!([RawFd; 4]);
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let message = match recvmsg::<UnixAddr>(
            self.socket.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            // A signal to the test process (a plugin child exiting) cut the
            // wait short; nothing was read.
            Err(nix::errno::Errno::EINTR) => return self.next(),
            received => received.map_err(|error| format!("receiving a ZDS request: {error}"))?,
        };
        let mut fds = Vec::new();
        for control in message.cmsgs().unwrap() {
            if let ControlMessageOwned::ScmRights(raw) = control {
                for fd in raw {
                    // SAFETY: the kernel just installed this fd for us and
                    // nothing else owns it.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
        assert!(
            !message
                .flags
                .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC)
        );
        let len = message.bytes;
        if len == 0 {
            return Err("the agent closed the connection (or sent an empty datagram)".into());
        }
        let request = WorkloadRequest::decode(&buf[..len]).expect("a WorkloadRequest");
        Ok(Received {
            payload: request.payload.expect("a request with a payload"),
            fds,
        })
    }

    /// Acks (empty error) or nacks the last request.
    pub fn answer(&self, error: &str) {
        let response = WorkloadResponse {
            payload: Some(workload_response::Payload::Ack(Ack {
                error: error.into(),
            })),
        };
        self.send(&response.encode_to_vec());
    }

    /// Receives and acks one request.
    pub fn receive_and_ack(&self) -> Received {
        let received = self.receive();
        self.answer("");
        received
    }

    /// Receives and acks requests until `snapshot_sent`; returns those
    /// before it.
    pub fn read_snapshot(&self) -> Vec<Received> {
        let mut requests = Vec::new();
        for _ in 0..100 {
            let received = self.receive_and_ack();
            if matches!(received.payload, Payload::SnapshotSent(_)) {
                return requests;
            }
            requests.push(received);
        }
        panic!("no snapshot_sent within 100 requests");
    }
}
