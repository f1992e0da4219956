//! Header encoding and decoding, and fixed-length messages over a duplex pipe.

use super::*;

fn echo(request: u32, response: u32, close_after_response: bool) -> Header {
    Header::Echo(Exchange {
        request: NonZeroU32::new(request).unwrap(),
        response: NonZeroU32::new(response).unwrap(),
        close_after_response,
    })
}

#[test]
fn headers_survive_the_wire() {
    for header in [
        Header::Sink,
        Header::Source,
        echo(1, 1, false),
        echo(1024, 65536, true),
        echo(MAX_MESSAGE, MAX_MESSAGE, false),
    ] {
        assert_eq!(Header::decode(&header.encode()).unwrap(), header);
    }
}

#[test]
fn the_layout_is_the_documented_one() {
    let bytes = echo(0x0102_0304, 5, true).encode();
    assert_eq!(
        bytes,
        [b'Z', b'L', b'G', b'1', 3, 1, 0, 0, 1, 2, 3, 4, 0, 0, 0, 5]
    );
}

#[test]
fn bad_headers_are_refused() {
    let with = |index: usize, value: u8, base: Header| {
        let mut bytes = base.encode();
        bytes[index] = value;
        Header::decode(&bytes)
    };
    let cases = [
        (
            Header::decode(b"GET / HTTP/1.1\r\n"),
            HeaderError::Magic(*b"GET "),
        ),
        (with(4, 9, Header::Sink), HeaderError::Mode(9)),
        (with(4, 0, Header::Sink), HeaderError::Mode(0)),
        (
            with(5, 1, Header::Sink),
            HeaderError::Reserved {
                flags: 1,
                reserved: [0, 0],
            },
        ),
        (
            with(7, 1, echo(1, 1, false)),
            HeaderError::Reserved {
                flags: 0,
                reserved: [0, 1],
            },
        ),
        (
            with(11, 0, echo(1, 1, false)),
            HeaderError::EmptyMessage {
                request: 0,
                response: 1,
            },
        ),
        (
            with(12, 0xff, echo(1, 1, false)),
            HeaderError::TooLarge(0xff00_0001),
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got.unwrap_err().to_string(), want.to_string());
    }
}

#[tokio::test]
async fn messages_longer_than_the_buffer_arrive_whole() {
    let (mut a, mut b) = tokio::io::duplex(64);
    let writer = tokio::spawn(async move {
        write_message(&mut a, &[7u8; 10], 1000).await.unwrap();
        drop(a);
    });
    let mut buf = [0u8; 33];
    assert!(read_message(&mut b, &mut buf, 1000).await.unwrap());
    writer.await.unwrap();
    assert!(!read_message(&mut b, &mut buf, 1000).await.unwrap());
}

#[tokio::test]
async fn headers_are_read_whole_or_refused() {
    let (mut a, mut b) = tokio::io::duplex(64);
    a.write_all(&Header::Sink.encode()).await.unwrap();
    a.write_all(&Header::Source.encode()[..5]).await.unwrap();
    drop(a);
    assert_eq!(read_header(&mut b).await.unwrap(), Some(Header::Sink));
    let err = read_header(&mut b).await.unwrap_err();
    assert!(matches!(err, HeaderError::Truncated(5)), "{err}");

    let (a, mut b) = tokio::io::duplex(64);
    drop(a);
    assert_eq!(read_header(&mut b).await.unwrap(), None);
}

#[tokio::test]
async fn a_close_inside_a_message_is_an_error() {
    let (mut a, mut b) = tokio::io::duplex(64);
    a.write_all(&[1, 2, 3]).await.unwrap();
    drop(a);
    let mut buf = [0u8; 8];
    let err = read_message(&mut b, &mut buf, 8).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
}
