//! The DNS messages of the `dns` and `dns-server` modes, as plain
//! functions over bytes: an A query encoded once per name with its id
//! written per send, a reply read into what the client counts, and the
//! nameserver's answer to a query. Messages are hickory-proto's types;
//! nothing here touches a socket (`dns.rs` and `dns/nameserver.rs` do).

use std::net::Ipv4Addr;

use hickory_proto::ProtoError;
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// The TTL of the nameserver's answers: what a cluster's DNS gives a
/// name outside the cluster is its own business; clients here never cache.
const ANSWER_TTL: u32 = 30;

/// The bytes of a DNS header, where the id is the first two.
const HEADER_LEN: usize = 12;

/// An A query for one name, encoded once; each send writes its own id.
#[derive(Debug, Clone)]
pub struct AQuery {
    /// The name asked, fully qualified, to check replies against.
    name: Name,
    /// The encoded message, recursion desired, no EDNS (so a conforming
    /// server answers in at most 512 bytes); its id is rewritten per send.
    bytes: Vec<u8>,
}

impl AQuery {
    /// The query for `name`.
    pub fn new(name: &Name) -> Result<AQuery, ProtoError> {
        let mut name = name.clone();
        name.set_fqdn(true);
        let mut message = Message::query();
        message.metadata.recursion_desired = true;
        message.add_query(Query::query(name.clone(), RecordType::A));
        Ok(AQuery {
            bytes: message.to_vec()?,
            name,
        })
    }

    /// The name asked.
    pub fn name(&self) -> &Name {
        &self.name
    }

    /// The message with `id`, ready to send.
    pub fn with_id(&mut self, id: u16) -> &[u8] {
        // An encoded message always has its 12-byte header.
        if let Some(header) = self.bytes.get_mut(..2) {
            header.copy_from_slice(&id.to_be_bytes());
        }
        &self.bytes
    }
}

/// What a reply says, as far as the client counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The id it answers.
    pub id: u16,
    /// Its response code.
    pub rcode: Rcode,
    /// The addresses of the A records of its answer section.
    pub addresses: Vec<Ipv4Addr>,
    /// The name of its first question, if it has one.
    pub name: Option<Name>,
}

/// The response codes a reply is counted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rcode {
    /// NOERROR: an answer, possibly with no records.
    NoError,
    /// FORMERR: the server could not read the query.
    FormErr,
    /// SERVFAIL: the server (or its upstream) failed.
    ServFail,
    /// NXDOMAIN: no such name.
    NxDomain,
    /// NOTIMP: the server does not do this kind of query.
    NotImp,
    /// REFUSED: the server will not answer.
    Refused,
    /// Any other code.
    Other,
}

impl Rcode {
    /// Its mnemonic, as the reports key the counts.
    pub fn name(self) -> &'static str {
        match self {
            Rcode::NoError => "NOERROR",
            Rcode::FormErr => "FORMERR",
            Rcode::ServFail => "SERVFAIL",
            Rcode::NxDomain => "NXDOMAIN",
            Rcode::NotImp => "NOTIMP",
            Rcode::Refused => "REFUSED",
            Rcode::Other => "OTHER",
        }
    }

    fn of(code: ResponseCode) -> Rcode {
        match code {
            ResponseCode::NoError => Rcode::NoError,
            ResponseCode::FormErr => Rcode::FormErr,
            ResponseCode::ServFail => Rcode::ServFail,
            ResponseCode::NXDomain => Rcode::NxDomain,
            ResponseCode::NotImp => Rcode::NotImp,
            ResponseCode::Refused => Rcode::Refused,
            _ => Rcode::Other,
        }
    }
}

/// The reply in `bytes`, or `None` when they are not a DNS response (they
/// do not parse, or are a query).
pub fn read_reply(bytes: &[u8]) -> Option<Reply> {
    let message = Message::from_vec(bytes).ok()?;
    if message.metadata.message_type != MessageType::Response {
        return None;
    }
    Some(Reply {
        id: message.metadata.id,
        rcode: Rcode::of(message.metadata.response_code),
        addresses: message
            .answers
            .iter()
            .filter_map(|record| match record.data {
                RData::A(A(address)) => Some(address),
                _ => None,
            })
            .collect(),
        name: message.queries.first().map(|query| query.name().clone()),
    })
}

/// The nameserver's response to the query in `bytes`: each A question
/// answered with `address`, any other question with no records
/// (NOERROR); `None` for what is not a standard query, which is dropped.
pub fn answer(bytes: &[u8], address: Ipv4Addr) -> Option<Vec<u8>> {
    if bytes.len() < HEADER_LEN {
        return None;
    }
    let query = Message::from_vec(bytes).ok()?;
    let metadata = &query.metadata;
    if metadata.message_type != MessageType::Query || metadata.op_code != OpCode::Query {
        return None;
    }
    let mut response = Message::response(metadata.id, OpCode::Query);
    response.metadata.recursion_desired = metadata.recursion_desired;
    response.metadata.recursion_available = true;
    for question in &query.queries {
        response.add_query(question.clone());
        if question.query_type() == RecordType::A {
            response.add_answer(Record::from_rdata(
                question.name().clone(),
                ANSWER_TTL,
                RData::A(A(address)),
            ));
        }
    }
    response.to_vec().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> Name {
        Name::from_ascii(text).unwrap()
    }

    #[test]
    fn a_query_is_answered_with_the_address_under_its_own_id() {
        let mut query = AQuery::new(&name("outside.example")).unwrap();
        let sent = query.with_id(0xbeef).to_vec();
        let response = answer(&sent, Ipv4Addr::new(198, 18, 250, 1)).unwrap();
        let reply = read_reply(&response).unwrap();
        assert_eq!(
            reply,
            Reply {
                id: 0xbeef,
                rcode: Rcode::NoError,
                addresses: vec![Ipv4Addr::new(198, 18, 250, 1)],
                name: Some(name("outside.example.")),
            }
        );
        // The name asked is kept fully qualified, as replies carry it.
        assert_eq!(reply.name.as_ref(), Some(query.name()));
        // A second send only changes the id.
        let again = query.with_id(7).to_vec();
        assert_eq!(again[..2], [0, 7]);
        assert_eq!(again[2..], sent[2..]);
    }

    #[test]
    fn what_is_not_a_response_is_no_reply() {
        let mut query = AQuery::new(&name("echo.")).unwrap();
        let cases: [(&str, Vec<u8>); 5] = [
            ("empty", Vec::new()),
            ("a header cut short", vec![0xbe, 0xef, 0x81]),
            ("a query, not a response", query.with_id(1).to_vec()),
            ("noise", vec![0xff; 40]),
            (
                "a response cut in its question",
                answer(query.with_id(2), Ipv4Addr::LOCALHOST).unwrap()[..15].to_vec(),
            ),
        ];
        for (case, bytes) in cases {
            assert_eq!(read_reply(&bytes), None, "{case}");
        }
    }

    #[test]
    fn response_codes_and_empty_answers_are_read() {
        let error = Message::error_msg(9, OpCode::Query, ResponseCode::NXDomain);
        let reply = read_reply(&error.to_vec().unwrap()).unwrap();
        assert_eq!((reply.id, reply.rcode), (9, Rcode::NxDomain));
        assert!(reply.addresses.is_empty());
        assert_eq!(reply.name, None);
        let refused = Message::error_msg(1, OpCode::Query, ResponseCode::BADCOOKIE);
        assert_eq!(
            read_reply(&refused.to_vec().unwrap()).unwrap().rcode,
            Rcode::Other
        );
    }

    #[test]
    fn the_nameserver_drops_what_is_not_a_query_and_answers_other_types_empty() {
        assert_eq!(answer(&[0; 5], Ipv4Addr::LOCALHOST), None);
        assert_eq!(answer(&[0xff; 64], Ipv4Addr::LOCALHOST), None);
        let response = Message::response(3, OpCode::Query).to_vec().unwrap();
        assert_eq!(answer(&response, Ipv4Addr::LOCALHOST), None);
        let mut aaaa = Message::query();
        aaaa.add_query(Query::query(name("outside.example."), RecordType::AAAA));
        let reply = read_reply(&answer(&aaaa.to_vec().unwrap(), Ipv4Addr::LOCALHOST).unwrap());
        let reply = reply.unwrap();
        assert_eq!((reply.rcode, reply.addresses), (Rcode::NoError, Vec::new()));
    }
}
