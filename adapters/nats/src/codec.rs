//! How the broker's data rides on NATS messages. NATS headers are text lines and clients keep
//! them in a map (the order of different names is lost), so the broker's headers — bytes,
//! repeated names, order — travel packed into one header, [`HEADERS`]: a comma-separated list
//! of `base64url(name):base64url(value)`. The adapter's own fields are headers of their own,
//! binary ones base64url-encoded.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use wrpc_broker_guest::Headers;

/// The broker's headers, packed.
pub(crate) const HEADERS: &str = "x-wrpc-headers";
/// A log entry's key (base64url).
pub(crate) const KEY: &str = "x-wrpc-key";
/// A queue message's attempt (decimal).
pub(crate) const ATTEMPT: &str = wrpc_broker_guest::headers::ATTEMPT;
/// Not deliverable before this time (ms since the Unix epoch, decimal): a delayed retry.
pub(crate) const NOT_BEFORE: &str = "x-wrpc-not-before";
/// A direct packet's correlation id (base64url).
pub(crate) const CORRELATION_ID: &str = "x-wrpc-correlation-id";
/// A direct packet's reply-to address (base64url).
pub(crate) const REPLY_TO: &str = "x-wrpc-reply-to";
/// JetStream's de-duplication id: a resent publish is stored once.
pub(crate) const MSG_ID: &str = "Nats-Msg-Id";
/// JetStream's stream check on publish.
pub(crate) const EXPECTED_STREAM: &str = "Nats-Expected-Stream";
/// JetStream's check on publish that the stream's last message carries this `Nats-Msg-Id`:
/// how a pipelined batch keeps its order when one of its messages fails.
pub(crate) const EXPECTED_LAST_MSG_ID: &str = "Nats-Expected-Last-Msg-Id";

/// Bytes as base64url without padding.
pub(crate) fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

/// base64url text back to bytes; `None` when malformed.
pub(crate) fn unb64(text: &[u8]) -> Option<Vec<u8>> {
    B64.decode(text).ok()
}

/// The broker's headers packed into one header value; `None` when there are none.
pub(crate) fn pack(headers: &Headers) -> Option<Vec<u8>> {
    if headers.is_empty() {
        return None;
    }
    let parts: Vec<String> = headers
        .iter()
        .map(|(name, value)| format!("{}:{}", b64(name.as_bytes()), b64(value)))
        .collect();
    Some(parts.join(",").into_bytes())
}

/// The broker's headers unpacked from [`HEADERS`] of `nats` (empty when absent or malformed).
pub(crate) fn unpack(nats: &Headers) -> Headers {
    let Some(packed) = get(nats, HEADERS) else {
        return Vec::new();
    };
    packed
        .split(|b| *b == b',')
        .filter_map(|part| {
            let at = part.iter().position(|b| *b == b':')?;
            let name = String::from_utf8(unb64(&part[..at])?).ok()?;
            Some((name, unb64(&part[at + 1..])?))
        })
        .collect()
}

/// The first value of NATS header `name` (names compare case-insensitively).
pub(crate) fn get<'a>(nats: &'a Headers, name: &str) -> Option<&'a [u8]> {
    wrpc_broker_guest::headers::get(nats, name)
}

/// The value of NATS header `name` as a decimal number.
pub(crate) fn number(nats: &Headers, name: &str) -> Option<u64> {
    std::str::from_utf8(get(nats, name)?)
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Header names as the driver's `…-keeping` calls take them.
pub(crate) fn names(names: &[&str]) -> Vec<String> {
    names.iter().map(|name| name.to_string()).collect()
}

/// Push header `name` with a text value.
pub(crate) fn push(nats: &mut Headers, name: &str, value: impl Into<String>) {
    nats.push((name.to_string(), value.into().into_bytes()));
}

/// Push the broker's `headers`, packed, if there are any.
pub(crate) fn push_packed(nats: &mut Headers, headers: &Headers) {
    if let Some(packed) = pack(headers) {
        nats.push((HEADERS.to_string(), packed));
    }
}
