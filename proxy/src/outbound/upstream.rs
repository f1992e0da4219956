//! The other end of an outbound connection, one type for every path, so
//! that the copy (and the task that runs it) has one shape whichever path
//! a connection took.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::same_node::SameNodeUpstream;
use crate::copy::{ReadBuffer, Side};
use crate::hbone::H2Stream;

/// Where an outbound connection's bytes go.
pub enum Upstream {
    /// A plain TCP connection: a destination outside the mesh, or one
    /// that does not take HBONE.
    Tcp(TcpStream),
    /// An HBONE stream, over one hop or through a network gateway.
    Hbone(H2Stream),
    /// The application of another pod this proxy serves, admitted by that
    /// pod's inbound side (the same-node path). Boxed: it is three times
    /// the size of the others, and every open connection's task holds its
    /// upstream for the connection's life.
    SameNode(Box<SameNodeUpstream>),
}

/// Each method goes to the side the variant holds.
macro_rules! each_side {
    ($upstream:expr, $side:ident => $call:expr) => {
        match $upstream {
            Upstream::Tcp($side) => $call,
            Upstream::Hbone($side) => $call,
            Upstream::SameNode(same) => {
                let $side = &mut same.app;
                $call
            }
        }
    };
}

impl AsyncRead for Upstream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        each_side!(self.get_mut(), side => Pin::new(side).poll_read(cx, buf))
    }
}

impl AsyncWrite for Upstream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        each_side!(self.get_mut(), side => Pin::new(side).poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each_side!(self.get_mut(), side => Pin::new(side).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each_side!(self.get_mut(), side => Pin::new(side).poll_shutdown(cx))
    }
}

/// The held side's own way of reading and writing: an HBONE stream hands
/// out and takes owned chunks.
impl Side for Upstream {
    fn poll_read_bytes(
        &mut self,
        cx: &mut Context<'_>,
        buffer: &mut ReadBuffer,
    ) -> Poll<io::Result<Bytes>> {
        each_side!(self, side => side.poll_read_bytes(cx, buffer))
    }

    fn poll_write_bytes(
        &mut self,
        cx: &mut Context<'_>,
        bytes: &mut Bytes,
    ) -> Poll<io::Result<usize>> {
        each_side!(self, side => side.poll_write_bytes(cx, bytes))
    }
}
