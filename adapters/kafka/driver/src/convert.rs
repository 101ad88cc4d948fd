//! rdkafka values to and from `wrpc:kafka/client` records, and its errors as `kafka-error`.

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};

use crate::bindings::wit;

/// A librdkafka error as a driver error.
pub(crate) fn error(e: KafkaError) -> wit::KafkaError {
    let text = e.to_string();
    match e.rdkafka_error_code() {
        Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => {
            wit::KafkaError::UnknownTopic(text)
        }
        Some(RDKafkaErrorCode::OffsetOutOfRange | RDKafkaErrorCode::AutoOffsetReset) => {
            wit::KafkaError::OutOfRange(text)
        }
        Some(
            RDKafkaErrorCode::RebalanceInProgress
            | RDKafkaErrorCode::IllegalGeneration
            | RDKafkaErrorCode::UnknownMemberId
            | RDKafkaErrorCode::FencedInstanceId
            | RDKafkaErrorCode::StaleMemberEpoch
            | RDKafkaErrorCode::Fenced,
        ) => wit::KafkaError::Refused(text),
        Some(
            RDKafkaErrorCode::InvalidTopic
            | RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidPartitions
            | RDKafkaErrorCode::InvalidReplicationFactor
            | RDKafkaErrorCode::InvalidConfig
            | RDKafkaErrorCode::InvalidArgument,
        ) => wit::KafkaError::BadRequest(text),
        Some(
            RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::MessageTimedOut
            | RDKafkaErrorCode::NetworkException
            | RDKafkaErrorCode::CoordinatorNotAvailable
            | RDKafkaErrorCode::NotCoordinator
            | RDKafkaErrorCode::LeaderNotAvailable
            | RDKafkaErrorCode::NotLeaderForPartition
            | RDKafkaErrorCode::QueueFull,
        ) => wit::KafkaError::Unavailable(text),
        _ => wit::KafkaError::Other(text),
    }
}

/// Whether `e` says only that a partition's leader is not known yet: a topic created a moment
/// ago, or a leader being elected — from the broker, or from librdkafka's own metadata cache
/// (`UnknownPartition`, "Local: Unknown partition", for a partition the topic's metadata listed
/// but the cache has not taken in yet). Asking again shortly gets the answer.
pub(crate) fn leader_unknown(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::LeaderNotAvailable
                | RDKafkaErrorCode::NotLeaderForPartition
                | RDKafkaErrorCode::UnknownPartition
        )
    )
}

/// Headers for a record to produce (order and repeats kept).
pub(crate) fn headers_out(headers: &[(String, Vec<u8>)]) -> OwnedHeaders {
    headers.iter().fold(
        OwnedHeaders::new_with_capacity(headers.len()),
        |h, (name, value)| {
            h.insert(Header {
                key: name,
                value: Some(value),
            })
        },
    )
}

/// A fetched record as an `incoming` record.
pub(crate) fn incoming<M: Message>(m: &M) -> wit::Incoming {
    let headers = m
        .headers()
        .map(|h| {
            h.iter()
                .map(|header| {
                    (
                        header.key.to_string(),
                        header.value.map(<[u8]>::to_vec).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    wit::Incoming {
        topic: m.topic().to_string(),
        partition: u32::try_from(m.partition()).unwrap_or(0),
        offset: u64::try_from(m.offset()).unwrap_or(0),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
        headers,
        timestamp_ms: m.timestamp().to_millis(),
    }
}

/// A partition number as librdkafka takes it.
pub(crate) fn partition(p: u32) -> Result<i32, wit::KafkaError> {
    i32::try_from(p).map_err(|_| wit::KafkaError::BadRequest(format!("partition {p} too large")))
}

/// An offset as librdkafka takes it.
pub(crate) fn offset(o: u64) -> Result<i64, wit::KafkaError> {
    i64::try_from(o).map_err(|_| wit::KafkaError::BadRequest(format!("offset {o} too large")))
}
