//! Between the WIT records of `wrpc:amqp/client` and lapin's types: field tables, properties,
//! deliveries and errors.

use lapin::types::{AMQPValue, ByteArray, FieldArray, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, ErrorKind};

use crate::bindings::wit;

/// The longest AMQP short string (names, routing keys, property strings).
const MAX_SHORT: usize = 255;

/// `text` as a short string; longer than 255 bytes is a bad request naming `what`.
pub(crate) fn short(what: &str, text: String) -> Result<ShortString, wit::AmqpError> {
    if text.len() > MAX_SHORT {
        return Err(wit::AmqpError::BadRequest(format!(
            "{what} is {} bytes, AMQP allows {MAX_SHORT}",
            text.len()
        )));
    }
    Ok(ShortString::from(text))
}

/// A WIT field value as lapin's.
fn value(v: wit::FieldValue) -> AMQPValue {
    match v {
        wit::FieldValue::Boolean(b) => AMQPValue::Boolean(b),
        wit::FieldValue::Long(n) => AMQPValue::LongLongInt(n),
        wit::FieldValue::Text(t) => AMQPValue::LongString(LongString::from(t)),
        wit::FieldValue::Bytes(b) => AMQPValue::ByteArray(ByteArray::from(b)),
        wit::FieldValue::ByteArrays(items) => {
            let mut array = FieldArray::default();
            for item in items {
                array.push(AMQPValue::ByteArray(ByteArray::from(item)));
            }
            AMQPValue::FieldArray(array)
        }
        wit::FieldValue::Other(t) => AMQPValue::LongString(LongString::from(t)),
    }
}

/// The bytes of a string-like value, if it is one.
fn bytes_of(v: &AMQPValue) -> Option<Vec<u8>> {
    match v {
        AMQPValue::LongString(s) => Some(s.as_bytes().to_vec()),
        AMQPValue::ShortString(s) => Some(s.as_str().as_bytes().to_vec()),
        AMQPValue::ByteArray(b) => Some(b.as_slice().to_vec()),
        _ => None,
    }
}

/// A lapin field value as the WIT one.
fn wit_value(v: &AMQPValue) -> wit::FieldValue {
    use wit::FieldValue as F;
    match v {
        AMQPValue::Boolean(b) => F::Boolean(*b),
        AMQPValue::ShortShortInt(n) => F::Long(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => F::Long(i64::from(*n)),
        AMQPValue::ShortInt(n) => F::Long(i64::from(*n)),
        AMQPValue::ShortUInt(n) => F::Long(i64::from(*n)),
        AMQPValue::LongInt(n) => F::Long(i64::from(*n)),
        AMQPValue::LongUInt(n) => F::Long(i64::from(*n)),
        AMQPValue::LongLongInt(n) => F::Long(*n),
        AMQPValue::LongString(_) | AMQPValue::ShortString(_) | AMQPValue::ByteArray(_) => {
            let bytes = bytes_of(v).unwrap_or_default();
            match (
                matches!(v, AMQPValue::ByteArray(_)),
                String::from_utf8(bytes),
            ) {
                (false, Ok(text)) => F::Text(text),
                (_, Ok(text)) => F::Bytes(text.into_bytes()),
                (_, Err(e)) => F::Bytes(e.into_bytes()),
            }
        }
        AMQPValue::FieldArray(items) => {
            let all: Option<Vec<Vec<u8>>> = items.as_slice().iter().map(bytes_of).collect();
            match all {
                Some(items) => F::ByteArrays(items),
                None => F::Other(format!("{items:?}")),
            }
        }
        other => F::Other(format!("{other:?}")),
    }
}

/// A WIT field table as lapin's (names over 255 bytes are a bad request).
pub(crate) fn table(fields: wit::FieldTable) -> Result<FieldTable, wit::AmqpError> {
    let mut table = FieldTable::default();
    for (name, v) in fields {
        table.insert(short("a field name", name)?, value(v));
    }
    Ok(table)
}

/// A lapin field table as the WIT one (in name order).
fn wit_table(table: &FieldTable) -> wit::FieldTable {
    table
        .inner()
        .iter()
        .map(|(name, v)| (name.to_string(), wit_value(v)))
        .collect()
}

/// WIT properties as lapin's.
pub(crate) fn properties(p: wit::Properties) -> Result<BasicProperties, wit::AmqpError> {
    let mut out = BasicProperties::default();
    if let Some(id) = p.message_id {
        out = out.with_message_id(short("message-id", id)?);
    }
    if let Some(id) = p.correlation_id {
        out = out.with_correlation_id(short("correlation-id", id)?);
    }
    if let Some(to) = p.reply_to {
        out = out.with_reply_to(short("reply-to", to)?);
    }
    if let Some(ttl) = p.expiration {
        out = out.with_expiration(short("expiration", ttl)?);
    }
    if p.persistent {
        out = out.with_delivery_mode(2);
    }
    if !p.headers.is_empty() {
        out = out.with_headers(table(p.headers)?);
    }
    Ok(out)
}

/// lapin properties as the WIT ones.
fn wit_properties(p: &BasicProperties) -> wit::Properties {
    let text = |s: &Option<ShortString>| s.as_ref().map(|s| s.to_string());
    wit::Properties {
        message_id: text(p.message_id()),
        correlation_id: text(p.correlation_id()),
        reply_to: text(p.reply_to()),
        expiration: text(p.expiration()),
        persistent: *p.delivery_mode() == Some(2),
        headers: p.headers().as_ref().map(wit_table).unwrap_or_default(),
    }
}

/// A lapin delivery as the WIT record.
pub(crate) fn delivery(d: lapin::message::Delivery) -> wit::Delivery {
    wit::Delivery {
        delivery_tag: d.delivery_tag,
        redelivered: d.redelivered,
        exchange: d.exchange.to_string(),
        routing_key: d.routing_key.to_string(),
        properties: wit_properties(&d.properties),
        body: d.data,
    }
}

/// A lapin error of a call on a channel: the channel is closed (with the broker's reply code
/// when it closed it).
pub(crate) fn error(e: lapin::Error) -> wit::AmqpError {
    let (code, text) = match e.kind() {
        ErrorKind::ProtocolError(amqp) => (amqp.get_id(), amqp.get_message().to_string()),
        _ => (0, e.to_string()),
    };
    wit::AmqpError::Closed(wit::CloseReason { code, text })
}
