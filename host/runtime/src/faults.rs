//! The fault hook every driver offers the contract suite: refuse the next settlements of one
//! queue, as a real broker might, whatever names the adapter gives that queue in the broker.
//! A driver matches a settlement to the queue by what it sees of the broker operation (a store
//! queue, a key, a subject whose name contains the queue's name), never by an adapter's naming
//! rule; a real server never refuses on cue, so this stands in for one that does.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Settlement refusals armed by a test: queue names and how many settlements are still to be
/// refused on each. Free when nothing is armed (one atomic load per operation).
#[derive(Debug, Default)]
pub struct SettlementRefusals {
    armed: AtomicBool,
    rules: Mutex<Vec<(String, u32)>>,
}

impl SettlementRefusals {
    /// Refuse the next `count` settlements of messages of `queue` (replacing what was armed for
    /// it; 0 disarms).
    pub fn arm(&self, queue: &str, count: u32) {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        rules.retain(|(q, _)| q != queue);
        if count > 0 {
            rules.push((queue.to_string(), count));
        }
        self.armed.store(!rules.is_empty(), Ordering::SeqCst);
    }

    /// Whether any refusal is armed.
    pub fn is_armed(&self) -> bool {
        self.armed.load(Ordering::SeqCst)
    }

    /// Whether an armed queue's name occurs in `name` (nothing is counted).
    pub fn concerns(&self, name: &str) -> bool {
        self.is_armed() && self.matching(|queue| name.contains(queue)).is_some()
    }

    /// When `names` holds a name of an armed queue (for one of them `matches` is true), count one
    /// settlement of it as refused and say why.
    pub fn refuse(&self, matches: impl Fn(&str) -> bool) -> Option<String> {
        if !self.is_armed() {
            return None;
        }
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        let i = rules.iter().position(|(queue, _)| matches(queue))?;
        rules[i].1 -= 1;
        let queue = if rules[i].1 == 0 {
            rules.remove(i).0
        } else {
            rules[i].0.clone()
        };
        self.armed.store(!rules.is_empty(), Ordering::SeqCst);
        Some(format!(
            "settlement on queue `{queue}` refused (injected fault)"
        ))
    }

    fn matching(&self, matches: impl Fn(&str) -> bool) -> Option<String> {
        let rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        rules
            .iter()
            .find(|(q, _)| matches(q))
            .map(|(q, _)| q.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::SettlementRefusals;

    #[test]
    fn refusals_count_down_per_queue_and_match_by_containment() {
        let faults = SettlementRefusals::default();
        assert!(faults.refuse(|_| true).is_none(), "nothing armed");
        faults.arm("jobs", 2);
        assert!(faults.concerns("ns:jobs:pending"));
        assert!(!faults.concerns("ns:other"));
        assert!(faults.refuse(|q| "ns/queue/other".contains(q)).is_none());
        assert!(faults.refuse(|q| "ns/queue/jobs".contains(q)).is_some());
        assert!(faults.refuse(|q| "jobs@q".contains(q)).is_some());
        assert!(faults.refuse(|q| "jobs".contains(q)).is_none(), "used up");
        assert!(!faults.is_armed());
    }
}
