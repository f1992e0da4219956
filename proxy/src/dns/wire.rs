//! DNS messages to and from bytes (AMBIENT.md §5.6): parsing a request, the
//! FORMERR for one that does not parse, the EDNS echo, truncation to what
//! a UDP client takes, and the id of a relayed upstream response. Pure;
//! what goes in a response is `answer.rs`'s.

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};

use super::DnsError;

/// The largest response a UDP client takes without EDNS, and the least
/// it is assumed to take with it (RFC 1035 §4.2.1, RFC 6891 §6.2.3).
pub const UDP_MIN_PAYLOAD: u16 = 512;

/// Length of the fixed DNS header: a request shorter than this has no id
/// to answer to.
const HEADER_LEN: usize = 12;

/// The transport a query came over, which decides how large its response
/// may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// One datagram each way; a response too large is truncated (TC).
    Udp,
    /// Length-prefixed messages on a stream; no limit below 64 KiB.
    Tcp,
}

impl Transport {
    /// The `request_protocol` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
        }
    }
}

/// Parses a request.
pub fn parse(bytes: &[u8]) -> Result<Message, DnsError> {
    Message::from_vec(bytes).map_err(DnsError::Malformed)
}

/// The FORMERR response to bytes that did not parse, answered to their id
/// and opcode, or `None` when there is not even a header to answer to, or
/// the bytes claim to be a response (answering those would let two
/// resolvers bounce errors at each other).
pub fn format_error(bytes: &[u8]) -> Option<Vec<u8>> {
    let header = bytes.get(..HEADER_LEN)?;
    let id = u16::from_be_bytes([header[0], header[1]]);
    let is_response = header[2] & 0x80 != 0;
    if is_response {
        return None;
    }
    let op_code = OpCode::from_u8((header[2] >> 3) & 0x0f);
    let mut response = Message::response(id, op_code);
    response.metadata.message_type = MessageType::Response;
    response.metadata.response_code = ResponseCode::FormErr;
    response.to_vec().ok()
}

/// Encodes a local `response` to `request` for `transport`: the request's
/// EDNS echoed (payload at least [`UDP_MIN_PAYLOAD`], same version, DO
/// copied) if it had one, and over UDP, as many answers as fit in what the
/// client takes, with TC set when some were left out. Over TCP a response
/// longer than a TCP message can be is [`DnsError::AnswerTooLarge`].
pub fn encode(
    mut response: Message,
    request: &Message,
    transport: Transport,
) -> Result<Vec<u8>, DnsError> {
    let mut limit = usize::from(UDP_MIN_PAYLOAD);
    if let Some(asked) = &request.edns {
        let payload = asked.max_payload().max(UDP_MIN_PAYLOAD);
        let mut edns = Edns::new();
        edns.set_max_payload(payload)
            .set_version(asked.version())
            .set_dnssec_ok(asked.flags().dnssec_ok);
        response.set_edns(edns);
        limit = usize::from(payload);
    }
    let bytes = to_vec(&response)?;
    match transport {
        // Past the 65,535 bytes a TCP length prefix can say, the encoder
        // leaves out the records that do not fit and sets TC, which over
        // TCP no client can act on: the caller answers SERVFAIL instead.
        Transport::Tcp if !response.metadata.truncation && truncated(&bytes) => {
            Err(DnsError::AnswerTooLarge {
                records: response.answers.len(),
            })
        }
        Transport::Tcp => Ok(bytes),
        Transport::Udp if bytes.len() <= limit => Ok(bytes),
        Transport::Udp => truncate(response, limit),
    }
}

/// The response with the most answers that fits in `limit` bytes, TC set.
/// Binary search over how many answers are kept, since records differ in
/// size (a CNAME first, then addresses).
fn truncate(mut response: Message, limit: usize) -> Result<Vec<u8>, DnsError> {
    response.metadata.truncation = true;
    let answers = std::mem::take(&mut response.answers);
    response.authorities.clear();
    response.additionals.clear();
    let mut fits = to_vec(&response)?;
    if fits.len() > limit {
        // Not even the question fits; a client that asks this over UDP
        // gets the bare TC and retries over TCP.
        response.edns = None;
        response.queries.clear();
        return to_vec(&response);
    }
    let (mut low, mut high) = (0, answers.len());
    while low < high {
        let middle = (low + high).div_ceil(2);
        response.answers = answers[..middle].to_vec();
        let bytes = to_vec(&response)?;
        if bytes.len() <= limit {
            low = middle;
            fits = bytes;
        } else {
            high = middle - 1;
        }
    }
    Ok(fits)
}

/// Whether encoded message `bytes` has TC set (RFC 1035 §4.1.1: the third
/// byte's second lowest bit).
fn truncated(bytes: &[u8]) -> bool {
    bytes.get(2).is_some_and(|flags| flags & 0x02 != 0)
}

/// Puts the client's `id` on a response relayed from the upstream, which
/// was asked under an id of the forwarder's own.
pub fn set_id(response: &mut [u8], id: u16) {
    if let Some(header) = response.get_mut(..2) {
        header.copy_from_slice(&id.to_be_bytes());
    }
}

fn to_vec(message: &Message) -> Result<Vec<u8>, DnsError> {
    message.to_vec().map_err(DnsError::Encode)
}

#[cfg(test)]
mod tests;
