//! How the broker's data rides on AMQP messages. A field table keeps one value per name, in
//! name order, so the broker's headers (bytes, repeated names, order) travel in one header,
//! [`HEADERS`]: an array of byte arrays `[name, value, name, value, …]` that a plain AMQP
//! client reads as well. The adapter's own fields are headers of their own.

use crate::wrpc::amqp::client::{FieldTable, FieldValue, Properties};
use wrpc_broker_guest::Headers;

/// The broker's headers: `[name, value, …]`.
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
    let items = headers
        .iter()
        .flat_map(|(name, value)| [name.as_bytes().to_vec(), value.clone()])
        .collect();
    table.push((HEADERS.to_string(), FieldValue::ByteArrays(items)));
}

/// The broker's headers unpacked from [`HEADERS`] (empty when absent or malformed).
pub(crate) fn unpack(table: &FieldTable) -> Headers {
    let Some(FieldValue::ByteArrays(items)) = field(table, HEADERS) else {
        return Vec::new();
    };
    items
        .chunks_exact(2)
        .filter_map(|pair| Some((String::from_utf8(pair[0].clone()).ok()?, pair[1].clone())))
        .collect()
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
