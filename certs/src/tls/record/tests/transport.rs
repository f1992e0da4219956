//! Transports that cut the byte stream anywhere: one byte per read, and
//! reads and writes of seeded random sizes, with records at the size
//! limits (2^14 bytes of content, or as much padding as fits) and one byte
//! over them. What a record layer gets from TCP is any cut of what was
//! sent.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::raw::{RawPeer, ours_over_to_raw};
use super::*;

/// How a [`Cut`] transport sizes each read and write.
enum Cuts {
    /// One byte per read; writes whole.
    OneByte,
    /// Reads and writes of 1 to `max` bytes, drawn from a seeded generator.
    Random { rng: Box<StdRng>, max: usize },
}

impl Cuts {
    fn random(seed: u64) -> Cuts {
        Cuts::Random {
            rng: Box::new(StdRng::seed_from_u64(seed)),
            // Up to two of the largest records: a read may hold the end of
            // one, a whole one and the start of a third.
            max: 2 * MAX_RECORD,
        }
    }

    fn next_read(&mut self) -> usize {
        match self {
            Cuts::OneByte => 1,
            Cuts::Random { rng, max } => rng.random_range(1..=*max),
        }
    }

    fn next_write(&mut self) -> usize {
        match self {
            Cuts::OneByte => usize::MAX,
            Cuts::Random { rng, max } => rng.random_range(1..=*max),
        }
    }
}

/// A transport whose reads and writes take no more than [`Cuts`] says.
struct Cut {
    io: DuplexStream,
    cuts: Cuts,
}

impl AsyncRead for Cut {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let len = this.cuts.next_read().min(buf.remaining());
        let mut limited = ReadBuf::new(buf.initialize_unfilled_to(len));
        let poll = Pin::new(&mut this.io).poll_read(cx, &mut limited);
        let read = limited.filled().len();
        buf.advance(read);
        poll
    }
}

impl AsyncWrite for Cut {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let len = this.cuts.next_write().min(buf.len());
        Pin::new(&mut this.io).poll_write(cx, &buf[..len])
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Our client over a [`Cut`] transport, and a stock server.
async fn ours_cut_to_stock(cuts: Cuts) -> (RecordStream<Cut>, StockServer) {
    let (ours, theirs) = tokio::io::duplex(PIPE);
    let ours = Cut { io: ours, cuts };
    let (ours, theirs) = tokio::join!(
        connect(client_tls(), dummy_server_name(), ours),
        TlsAcceptor::from(server_tls()).accept(theirs),
    );
    (ours.unwrap().0, theirs.unwrap())
}

/// Our server over a [`Cut`] transport, and a stock client.
async fn stock_to_ours_cut(cuts: Cuts) -> (RecordStream<Cut>, StockClient) {
    let (ours, theirs) = tokio::io::duplex(PIPE);
    let ours = Cut { io: ours, cuts };
    let (ours, theirs) = tokio::join!(
        accept(server_tls(), ours),
        TlsConnector::from(client_tls()).connect(dummy_server_name(), theirs),
    );
    (ours.unwrap().0, theirs.unwrap())
}

/// Our client over a [`Cut`] transport after a real handshake, and the
/// server as a raw peer.
async fn ours_cut_to_raw(cuts: Cuts) -> (RecordStream<Cut>, RawPeer) {
    ours_over_to_raw(|io| Cut { io, cuts }).await
}

/// Sizes around one record and a few, so that reads of one byte stay
/// quick.
const SMALL_SIZES: [usize; 5] = [1, 16_383, 16_384, 16_385, 100_000];

#[tokio::test]
async fn one_byte_per_read_moves_every_byte_both_ways() {
    let (mut ours, mut theirs) = ours_cut_to_stock(Cuts::OneByte).await;
    for len in SMALL_SIZES {
        (ours, theirs) = exchange(ours, theirs, len).await;
    }
    let (mut ours, mut theirs) = stock_to_ours_cut(Cuts::OneByte).await;
    for len in SMALL_SIZES {
        (ours, theirs) = exchange(ours, theirs, len).await;
    }
}

#[tokio::test]
async fn reads_and_writes_of_random_sizes_move_every_byte_both_ways() {
    for seed in 0..4 {
        let (ours, theirs) = ours_cut_to_stock(Cuts::random(seed)).await;
        exchange_every_size(ours, theirs).await;
        let (ours, theirs) = stock_to_ours_cut(Cuts::random(seed)).await;
        exchange_every_size(ours, theirs).await;
    }
}

/// The longest TLSInnerPlaintext: content, its type and padding together
/// (RFC 8446 §5.4), so padding counts against the limit.
const MAX_INNER: usize = MAX_PLAINTEXT + 1;

/// `content`, its type (application data) and `padding` zeros.
fn padded(content: &[u8], padding: usize) -> Vec<u8> {
    [content, &[APPLICATION_DATA], &vec![0; padding]].concat()
}

#[tokio::test]
async fn records_at_the_size_limits_are_read_however_the_transport_cuts_them() {
    let transports = [
        Cuts::OneByte,
        Cuts::random(1),
        Cuts::random(2),
        Cuts::random(3),
    ];
    for cuts in transports {
        let (mut ours, mut peer) = ours_cut_to_raw(cuts).await;
        let full = plaintext(MAX_PLAINTEXT, 1);
        let records = [
            // 2^14 bytes of content.
            peer.seal(&padded(&full, 0)),
            // One byte of content, as much padding as fits.
            peer.seal(&padded(&full[..1], MAX_INNER - 2)),
            // No content, padding only.
            peer.seal(&padded(b"", MAX_INNER - 1)),
            peer.seal(&padded(&full[1..], 1)),
            peer.record(ALERT, &[1, 0]),
        ];
        assert_eq!(records[0].len(), HEADER_LEN + MAX_INNER + 16);
        assert_eq!(records[1].len(), records[0].len());
        peer.io.write_all(&records.concat()).await.unwrap();
        let mut received = Vec::new();
        let reading = ours.read_to_end(&mut received);
        tokio::time::timeout(PATIENCE, reading)
            .await
            .expect("the read hung")
            .unwrap();
        assert!(received == [&full, &full[..1], &full[1..]].concat());
    }
}

/// What a raw peer seals in one case.
type Sealing = fn(&mut RawPeer) -> Vec<u8>;

#[tokio::test]
async fn a_record_one_byte_over_a_limit_is_refused_however_the_transport_cuts_it() {
    let over_limits: [(&str, Sealing); 3] = [
        ("a content byte", |peer| {
            peer.seal(&padded(&plaintext(MAX_PLAINTEXT + 1, 2), 0))
        }),
        ("a padding byte", |peer| {
            peer.seal(&padded(&plaintext(MAX_PLAINTEXT, 3), 1))
        }),
        // Seen at the header, before the record is opened.
        ("a ciphertext byte", |peer| {
            peer.seal(&padded(b"", MAX_CIPHERTEXT - 16))
        }),
    ];
    for (over, record) in over_limits {
        for cuts in [Cuts::OneByte, Cuts::random(4)] {
            let (mut ours, mut peer) = ours_cut_to_raw(cuts).await;
            let bytes = record(&mut peer);
            peer.io.write_all(&bytes).await.unwrap();
            let mut buf = [0; 64];
            let reading = ours.read(&mut buf);
            let error = tokio::time::timeout(PATIENCE, reading)
                .await
                .expect("the read hung")
                .unwrap_err();
            assert_eq!(
                record_error(&error),
                Some(&RecordError::RecordOverflow),
                "{over}"
            );
        }
    }
}
