//! EDNS echo, truncation and the FORMERR of bytes that do not parse.

use std::net::Ipv4Addr;

use hickory_proto::op::Query;
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};

use super::*;

fn request(edns: Option<(u16, bool)>) -> Message {
    let mut request = Message::query();
    let name = Name::from_ascii("large.ns1.svc.cluster.local.").unwrap();
    request.add_query(Query::query(name, RecordType::A));
    if let Some((payload, dnssec_ok)) = edns {
        let mut edns = Edns::new();
        edns.set_max_payload(payload).set_dnssec_ok(dnssec_ok);
        request.set_edns(edns);
    }
    request
}

/// An answer to `request` with `count` A records.
fn large(request: &Message, count: u8) -> Message {
    let mut response = Message::response(request.metadata.id, OpCode::Query);
    response.add_queries(request.queries.iter().cloned());
    let owner = request.queries[0].name().clone();
    for last in 0..count {
        let data = RData::A(A(Ipv4Addr::new(240, 0, 0, last)));
        response.add_answer(Record::from_rdata(owner.clone(), 30, data));
    }
    response
}

fn decoded(bytes: &[u8], limit: usize) -> Message {
    assert!(bytes.len() <= limit, "{} bytes over {limit}", bytes.len());
    Message::from_vec(bytes).unwrap()
}

#[test]
fn a_large_answer_is_truncated_over_udp_and_whole_over_tcp() {
    for (edns, limit) in [
        (None, 512),
        (Some((1232, false)), 1232),
        (Some((100, false)), 512),
    ] {
        let request = request(edns);
        let response = large(&request, 255);
        let udp = decoded(
            &encode(response.clone(), &request, Transport::Udp).unwrap(),
            limit,
        );
        assert!(udp.metadata.truncation, "{edns:?}");
        assert!(
            !udp.answers.is_empty() && udp.answers.len() < 255,
            "{edns:?}"
        );
        // One more record would not have fit.
        let mut one_more = udp.clone();
        one_more
            .answers
            .push(response.answers[udp.answers.len()].clone());
        assert!(one_more.to_vec().unwrap().len() > limit, "{edns:?}");

        let tcp = Message::from_vec(&encode(response, &request, Transport::Tcp).unwrap()).unwrap();
        assert!(!tcp.metadata.truncation);
        assert_eq!(tcp.answers.len(), 255);
    }
    // dig's default payload (1232) carries as many of these as
    // istio/ztunnel's test finds over UDP.
    let request = request(Some((1232, false)));
    let udp = Message::from_vec(&encode(large(&request, 255), &request, Transport::Udp).unwrap())
        .unwrap();
    assert_eq!(udp.answers.len(), 73);
}

#[test]
fn over_tcp_an_answer_longer_than_a_message_can_be_is_refused_not_cut() {
    let request = request(None);
    let mut response = large(&request, 0);
    let owner = request.queries[0].name().clone();
    // About 16 bytes a record with the owner's name compressed: 5,000 make
    // some 80 KB, past the 65,535 a TCP length prefix can say.
    for index in 0..5_000u32 {
        let data = RData::A(A(Ipv4Addr::from(0xf000_0000 | index)));
        response.add_answer(Record::from_rdata(owner.clone(), 30, data));
    }
    match encode(response.clone(), &request, Transport::Tcp) {
        Err(DnsError::AnswerTooLarge { records }) => assert_eq!(records, 5_000),
        other => panic!(
            "expected AnswerTooLarge, got {:?}",
            other.map(|bytes| bytes.len())
        ),
    }
    // Over UDP the same answer is cut to fit, and the client retries
    // over TCP.
    let udp = decoded(&encode(response, &request, Transport::Udp).unwrap(), 512);
    assert!(udp.metadata.truncation);
}

#[test]
fn edns_is_echoed_only_when_asked_with_at_least_512_and_the_do_bit() {
    let plain = request(None);
    let answer =
        Message::from_vec(&encode(large(&plain, 1), &plain, Transport::Udp).unwrap()).unwrap();
    assert!(answer.edns.is_none());

    let small = request(Some((100, true)));
    let answer =
        Message::from_vec(&encode(large(&small, 1), &small, Transport::Udp).unwrap()).unwrap();
    let edns = answer.edns.unwrap();
    assert_eq!(edns.max_payload(), 512);
    assert!(edns.flags().dnssec_ok);

    let big = request(Some((4096, false)));
    let answer = Message::from_vec(&encode(large(&big, 1), &big, Transport::Udp).unwrap()).unwrap();
    let edns = answer.edns.unwrap();
    assert_eq!(edns.max_payload(), 4096);
    assert!(!edns.flags().dnssec_ok);
}

#[test]
fn bytes_that_do_not_parse_get_a_formerr_to_their_id_when_they_have_a_header() {
    assert!(parse(b"\x12\x34").is_err());
    assert_eq!(format_error(b"\x12\x34"), None);

    // A header claiming one question, and nothing after it.
    let header = [0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    assert!(parse(&header).is_err());
    let answer = Message::from_vec(&format_error(&header).unwrap()).unwrap();
    assert_eq!(answer.metadata.id, 0xabcd);
    assert_eq!(answer.metadata.response_code, ResponseCode::FormErr);
    assert_eq!(answer.metadata.message_type, MessageType::Response);

    // Responses are never answered.
    let mut response = header;
    response[2] |= 0x80;
    assert_eq!(format_error(&response), None);
}

#[test]
fn a_relayed_response_gets_the_clients_id_back() {
    let mut bytes = vec![0x00, 0x01, 0x81, 0x80];
    set_id(&mut bytes, 0xbeef);
    assert_eq!(bytes[..2], [0xbe, 0xef]);
    let mut short = vec![0x01];
    set_id(&mut short, 0xbeef);
    assert_eq!(short, [0x01]);
}
