//! The HTTP/2 flow-control windows and largest frame of HBONE connections,
//! in both directions. Turning them into h2's settings is `hbone.rs`'s
//! business; the pool that holds the outbound connections is `pool.rs`'s.

/// HTTP/2 windows and frame size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Settings {
    /// Initial stream flow-control window, bytes.
    pub stream_window: u32,
    /// Connection flow-control window, bytes.
    pub connection_window: u32,
    /// Largest frame we accept, bytes.
    pub frame_size: u32,
}

/// The flags and variables, flattened into the command line.
#[derive(Debug, clap::Args)]
pub(super) struct Http2Args {
    /// HTTP/2 initial stream window, bytes.
    #[arg(long, env = "HTTP2_STREAM_WINDOW_SIZE", default_value_t = 4 * 1024 * 1024)]
    http2_stream_window_size: u32,
    /// HTTP/2 connection window, bytes.
    #[arg(long, env = "HTTP2_CONNECTION_WINDOW_SIZE", default_value_t = 16 * 1024 * 1024)]
    http2_connection_window_size: u32,
    /// HTTP/2 max frame size, bytes.
    #[arg(long, env = "HTTP2_FRAME_SIZE", default_value_t = 1024 * 1024)]
    http2_frame_size: u32,
}

impl Http2Args {
    /// The settings, as given.
    pub(super) fn parse(&self) -> Http2Settings {
        Http2Settings {
            stream_window: self.http2_stream_window_size,
            connection_window: self.http2_connection_window_size,
            frame_size: self.http2_frame_size,
        }
    }
}
