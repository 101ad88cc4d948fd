//! Helpers shared by the store's unit tests.

use std::time::Duration;

use super::{LogRecord, Packet, Queued, Received};

pub(super) fn rec(v: &str) -> LogRecord {
    LogRecord {
        value: v.as_bytes().to_vec(),
        headers: vec![("h".into(), b"1".to_vec())],
        key: Some(b"k".to_vec()),
    }
}

pub(super) fn recs(n: usize) -> Vec<LogRecord> {
    (0..n).map(|i| rec(&i.to_string())).collect()
}

pub(super) fn q(body: &str, delay_ms: u32) -> Queued {
    Queued {
        body: body.as_bytes().to_vec(),
        headers: vec![("h".into(), b"v".to_vec())],
        delay_ms,
    }
}

pub(super) fn bodies(r: &[Received]) -> Vec<String> {
    r.iter()
        .map(|m| String::from_utf8(m.body.clone()).unwrap())
        .collect()
}

pub(super) fn pkt(body: &str) -> Packet {
    Packet {
        body: body.as_bytes().to_vec(),
        headers: vec![],
        correlation_id: Some("c".into()),
        reply_to: None,
    }
}

pub(super) const LONG: Duration = Duration::from_secs(5);
pub(super) const SHORT: Duration = Duration::from_millis(100);
