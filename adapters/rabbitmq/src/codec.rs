//! How the broker's data rides on AMQP messages. A field table keeps one value per name, in
//! name order, so the broker's headers (bytes, repeated names, order) travel in one header,
//! [`HEADERS`], a byte array (`x`): a u32 count, then each name and value as a u32 length and
//! its bytes (big-endian lengths, as the Redis adapter's field `h`). Not a field array: a
//! stream queue of RabbitMQ 3.10 drops array headers (its AMQP 1.0 conversion keeps byte
//! arrays). The adapter's own fields are headers of their own.

use crate::wrpc::amqp::client::{FieldTable, FieldValue, Properties};
use wrpc_broker_guest::Headers;

/// The broker's headers, packed.
pub(crate) const HEADERS: &str = "x-wrpc-headers";
/// A log entry's key (bytes).
pub(crate) const KEY: &str = "x-wrpc-key";
/// A log entry's epoch (text): the log it was appended to.
pub(crate) const EPOCH: &str = "x-wrpc-epoch";
/// A queue message's attempt (decimal text).
pub(crate) const ATTEMPT: &str = wrpc_broker_guest::headers::ATTEMPT;
/// A direct packet's correlation id when longer than a short string (bytes).
pub(crate) const CORRELATION_ID: &str = "x-wrpc-correlation-id";
/// A direct packet's reply-to address when longer than a short string (bytes).
pub(crate) const REPLY_TO: &str = "x-wrpc-reply-to";
/// The offset of a stream delivery (set by the broker).
pub(crate) const STREAM_OFFSET: &str = "x-stream-offset";

/// The broker's headers as the [`HEADERS`] field, if there are any.
pub(crate) fn pack(table: &mut FieldTable, headers: &Headers) {
    if headers.is_empty() {
        return;
    }
    let mut out = Vec::new();
    let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes();
    out.extend(len(headers.len()));
    for (name, value) in headers {
        out.extend(len(name.len()));
        out.extend(name.as_bytes());
        out.extend(len(value.len()));
        out.extend(value);
    }
    table.push((HEADERS.to_string(), FieldValue::Bytes(out)));
}

/// The broker's headers unpacked from [`HEADERS`] (empty when absent or malformed).
pub(crate) fn unpack(table: &FieldTable) -> Headers {
    bytes(table, HEADERS)
        .and_then(|packed| decode(&packed))
        .unwrap_or_default()
}

/// The next `n` bytes of `packed` from `at`.
fn take<'a>(packed: &'a [u8], at: &mut usize, n: usize) -> Option<&'a [u8]> {
    let part = packed.get(*at..at.checked_add(n)?)?;
    *at += n;
    Some(part)
}

/// The next u32 length of `packed` from `at`.
fn length(packed: &[u8], at: &mut usize) -> Option<usize> {
    let b: [u8; 4] = take(packed, at, 4)?.try_into().ok()?;
    Some(u32::from_be_bytes(b) as usize)
}

/// Packed headers; none when malformed.
fn decode(packed: &[u8]) -> Option<Headers> {
    let mut at = 0;
    let count = length(packed, &mut at)?;
    let mut headers = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        let n = length(packed, &mut at)?;
        let name = String::from_utf8(take(packed, &mut at, n)?.to_vec()).ok()?;
        let n = length(packed, &mut at)?;
        headers.push((name, take(packed, &mut at, n)?.to_vec()));
    }
    Some(headers)
}

/// The field `name`, if present.
pub(crate) fn field<'a>(table: &'a FieldTable, name: &str) -> Option<&'a FieldValue> {
    table.iter().find(|(n, _)| n == name).map(|(_, v)| v)
}

/// The bytes of field `name` (text or bytes).
pub(crate) fn bytes(table: &FieldTable, name: &str) -> Option<Vec<u8>> {
    match field(table, name)? {
        FieldValue::Text(t) => Some(t.clone().into_bytes()),
        FieldValue::Bytes(b) => Some(b.clone()),
        _ => None,
    }
}

/// Field `name` as text.
pub(crate) fn text(table: &FieldTable, name: &str) -> Option<String> {
    String::from_utf8(bytes(table, name)?).ok()
}

/// Field `name` as a number (an integer, or decimal text).
pub(crate) fn number(table: &FieldTable, name: &str) -> Option<i64> {
    match field(table, name)? {
        FieldValue::Long(n) => Some(*n),
        _ => text(table, name)?.trim().parse().ok(),
    }
}

/// Persistent properties with these headers.
pub(crate) fn persistent(headers: FieldTable) -> Properties {
    Properties {
        message_id: None,
        correlation_id: None,
        reply_to: None,
        expiration: None,
        persistent: true,
        headers,
    }
}

/// A text field.
pub(crate) fn text_field(name: &str, value: impl Into<String>) -> (String, FieldValue) {
    (name.to_string(), FieldValue::Text(value.into()))
}
