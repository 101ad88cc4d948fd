//! The fault hook: settlement refusals armed by tests. One table for the whole process (tests
//! open brokers through URLs, so they never hold the driver), free when nothing is armed.
//!
//! A settlement is a publish or request to a JetStream acknowledgement subject (`$JS.ACK.…`)
//! of a message of an armed queue: one whose ack subject names the queue (its stream or
//! consumer), or one the driver delivered from a subject that names it. So the hook does not
//! depend on how an adapter names its streams.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use wrpc_broker_runtime::faults::SettlementRefusals;

/// The armed refusals.
static REFUSALS: LazyLock<SettlementRefusals> = LazyLock::new(SettlementRefusals::default);
/// While armed: the ack subject of each message delivered from a subject that names an armed
/// queue, and that subject.
static DELIVERED: LazyLock<Mutex<HashMap<String, String>>> = LazyLock::new(Mutex::default);

fn delivered() -> std::sync::MutexGuard<'static, HashMap<String, String>> {
    DELIVERED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Refuse the next `count` settlements of messages of `queue`.
pub(super) fn arm(queue: &str, count: u32) {
    REFUSALS.arm(queue, count);
}

/// Note a message the driver hands to a component (its ack subject, when it concerns an armed
/// queue).
pub(super) fn saw(message: &async_nats::Message) {
    if let Some(reply) = &message.reply
        && reply.starts_with("$JS.ACK.")
        && REFUSALS.concerns(&message.subject)
    {
        delivered().insert(reply.to_string(), message.subject.to_string());
    }
}

/// Why a publish or request on `subject` is refused now, if it is (and count it).
pub(super) fn refuse(subject: &str) -> Option<String> {
    if !REFUSALS.is_armed() || !subject.starts_with("$JS.ACK.") {
        return None;
    }
    let from = delivered().get(subject).cloned().unwrap_or_default();
    let why = REFUSALS.refuse(|queue| subject.contains(queue) || from.contains(queue));
    if !REFUSALS.is_armed() {
        delivered().clear();
    }
    why
}
