//! The fault hook: refusals armed by tests, consulted on every publish and request. One table
//! for the whole process (tests open brokers through URLs, so they never hold the driver), and
//! free when nothing is armed.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether any refusal is armed (checked without the lock on every call).
static ARMED: AtomicBool = AtomicBool::new(false);
/// Armed refusals: (subject prefix, how many calls still to refuse).
static REFUSALS: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());

/// Refuse the next `count` calls on subjects starting with `prefix`.
pub(super) fn refuse_next(prefix: &str, count: u32) {
    let mut refusals = REFUSALS.lock().unwrap_or_else(|e| e.into_inner());
    match refusals.iter_mut().find(|(p, _)| p == prefix) {
        Some((_, left)) => *left += count,
        None => refusals.push((prefix.to_string(), count)),
    }
    ARMED.store(true, Ordering::SeqCst);
}

/// Whether a call on `subject` is to be refused now (and count it).
pub(super) fn refuse(subject: &str) -> bool {
    if !ARMED.load(Ordering::SeqCst) {
        return false;
    }
    let mut refusals = REFUSALS.lock().unwrap_or_else(|e| e.into_inner());
    let hit = match refusals
        .iter_mut()
        .find(|(p, left)| *left > 0 && subject.starts_with(p.as_str()))
    {
        Some((_, left)) => {
            *left -= 1;
            true
        }
        None => false,
    };
    refusals.retain(|(_, left)| *left > 0);
    if refusals.is_empty() {
        ARMED.store(false, Ordering::SeqCst);
    }
    hit
}
