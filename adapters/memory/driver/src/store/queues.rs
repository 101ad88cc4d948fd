//! Queues: FIFO with delays and visibility leases, settled by receipt (ack, nack, extend).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

use wrpc_broker_runtime::faults::SettlementRefusals;

use super::{Headers, MemoryStore, QueueStats, Queued, Received, StoreError, lock, ms};

pub(super) struct QueueSlot {
    state: Mutex<Queue>,
    /// Woken when a message may have become deliverable or a deadline moved.
    notify: Notify,
}

struct Msg {
    body: Vec<u8>,
    headers: Headers,
}

struct Lease {
    msg: Msg,
    deadline: Instant,
}

#[derive(Default)]
struct Queue {
    ready: VecDeque<Msg>,
    /// Keyed by (due time, push sequence).
    delayed: BTreeMap<(Instant, u64), Msg>,
    leased: HashMap<u64, Lease>,
    /// (deadline, receipt) of every live lease, to expire them in order.
    deadlines: BTreeSet<(Instant, u64)>,
    seq: u64,
}

impl Queue {
    /// Expires leases (back to the head) and releases due delayed messages (to the tail).
    fn tick(&mut self, now: Instant) {
        let mut expired = Vec::new();
        while let Some(&(deadline, receipt)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(lease) = self.leased.remove(&receipt) {
                expired.push((receipt, lease.msg));
            }
        }
        // The earliest lease was nearest the head: it ends up first.
        expired.sort_by_key(|(receipt, _)| *receipt);
        for (_, msg) in expired.into_iter().rev() {
            self.ready.push_front(msg);
        }
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            self.ready.push_back(entry.remove());
        }
    }

    fn delay(&mut self, msg: Msg, due: Instant) {
        self.seq += 1;
        self.delayed.insert((due, self.seq), msg);
    }

    /// The next instant something changes by itself (a delay ends, a lease expires).
    fn next_event(&self) -> Option<Instant> {
        let delayed = self.delayed.keys().next().map(|(t, _)| *t);
        let lease = self.deadlines.first().map(|(t, _)| *t);
        match (delayed, lease) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn earliest_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(t, _)| *t)
    }

    /// Takes the next receipt-named lease for a settlement, or says why not.
    fn take_lease(
        &mut self,
        queue: &str,
        receipt: u64,
        refusals: &SettlementRefusals,
    ) -> Result<Lease, StoreError> {
        if let Some(why) = refusals.refuse(|armed| queue.contains(armed)) {
            return Err(StoreError::Refused(format!("receipt {receipt}: {why}")));
        }
        match self.leased.remove(&receipt) {
            Some(lease) => {
                self.deadlines.remove(&(lease.deadline, receipt));
                Ok(lease)
            }
            None => Err(StoreError::BadRequest(format!(
                "receipt {receipt} is not leased on queue {queue} (unknown, settled or expired)"
            ))),
        }
    }

    fn stats(&self) -> QueueStats {
        QueueStats {
            ready: self.ready.len(),
            delayed: self.delayed.len(),
            leased: self.leased.len(),
        }
    }
}

impl MemoryStore {
    fn queue_slot(&self, queue: &str) -> Arc<QueueSlot> {
        lock(&self.queues)
            .entry(queue.to_owned())
            .or_insert_with(|| {
                Arc::new(QueueSlot {
                    state: Mutex::new(Queue::default()),
                    notify: Notify::new(),
                })
            })
            .clone()
    }

    /// Puts messages on a queue in order (a delayed one becomes ready when due); never fails today.
    pub fn queue_push(&self, queue: &str, batch: Vec<Queued>) -> Result<(), StoreError> {
        let slot = self.queue_slot(queue);
        let mut q = lock(&slot.state);
        let now = Instant::now();
        q.tick(now);
        for m in batch {
            let msg = Msg {
                body: m.body,
                headers: m.headers,
            };
            if m.delay_ms == 0 {
                q.ready.push_back(msg);
            } else {
                q.delay(msg, now + ms(m.delay_ms));
            }
        }
        drop(q);
        slot.notify.notify_waiters();
        Ok(())
    }

    /// Leases up to `max` ready messages for `visibility_ms`, waiting up to `wait_ms` for the first.
    pub async fn queue_receive(
        &self,
        queue: &str,
        max: u32,
        visibility_ms: u32,
        wait_ms: u32,
    ) -> Vec<Received> {
        let slot = self.queue_slot(queue);
        let give_up = Instant::now() + ms(wait_ms);
        loop {
            let notified = slot.notify.notified();
            tokio::pin!(notified);
            // Registered before the state is checked: a push after the check wakes us.
            notified.as_mut().enable();
            let wake_at = {
                let mut q = lock(&slot.state);
                let now = Instant::now();
                q.tick(now);
                let n = (max as usize).min(q.ready.len());
                if n > 0 {
                    let deadline = now + ms(visibility_ms);
                    let earlier = q.earliest_deadline().is_none_or(|d| deadline < d);
                    let mut out = Vec::with_capacity(n);
                    for msg in q.ready.drain(..n).collect::<Vec<_>>() {
                        let receipt = self.receipts.fetch_add(1, Ordering::Relaxed);
                        out.push(Received {
                            receipt,
                            body: msg.body.clone(),
                            headers: msg.headers.clone(),
                        });
                        q.leased.insert(receipt, Lease { msg, deadline });
                        q.deadlines.insert((deadline, receipt));
                    }
                    drop(q);
                    if earlier {
                        // Waiters sleeping until a later event must see this lease's expiry.
                        slot.notify.notify_waiters();
                    }
                    return out;
                }
                if max == 0 || now >= give_up {
                    return Vec::new();
                }
                q.next_event().map_or(give_up, |t| t.min(give_up))
            };
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(wake_at) => {}
            }
        }
    }

    /// Removes leased messages for good; one result per receipt.
    pub fn queue_ack(&self, queue: &str, receipts: &[u64]) -> Vec<Result<(), StoreError>> {
        let slot = self.queue_slot(queue);
        let mut q = lock(&slot.state);
        q.tick(Instant::now());
        receipts
            .iter()
            .map(|&r| q.take_lease(queue, r, &self.refusals).map(drop))
            .collect()
    }

    /// Puts leased messages back unchanged, ready after `delay_ms` (0: at the head of the queue).
    pub fn queue_nack(
        &self,
        queue: &str,
        receipts: &[u64],
        delay_ms: u32,
    ) -> Vec<Result<(), StoreError>> {
        let slot = self.queue_slot(queue);
        let mut q = lock(&slot.state);
        let now = Instant::now();
        q.tick(now);
        let mut back = Vec::new();
        let results = receipts
            .iter()
            .map(|&r| {
                let lease = q.take_lease(queue, r, &self.refusals)?;
                if delay_ms == 0 {
                    back.push(lease.msg);
                } else {
                    q.delay(lease.msg, now + ms(delay_ms));
                }
                Ok(())
            })
            .collect::<Vec<_>>();
        // Nacked together, they keep the order they were given in, ahead of the rest.
        for msg in back.into_iter().rev() {
            q.ready.push_front(msg);
        }
        let changed = results.iter().any(Result::is_ok);
        drop(q);
        if changed {
            slot.notify.notify_waiters();
        }
        results
    }

    /// Moves lease deadlines to now + `visibility_ms`; one result per receipt.
    pub fn queue_extend(
        &self,
        queue: &str,
        receipts: &[u64],
        visibility_ms: u32,
    ) -> Vec<Result<(), StoreError>> {
        let slot = self.queue_slot(queue);
        let mut q = lock(&slot.state);
        let now = Instant::now();
        q.tick(now);
        let deadline = now + ms(visibility_ms);
        let results = receipts
            .iter()
            .map(|&r| {
                let lease = q.take_lease(queue, r, &self.refusals)?;
                q.leased.insert(
                    r,
                    Lease {
                        msg: lease.msg,
                        deadline,
                    },
                );
                q.deadlines.insert((deadline, r));
                Ok(())
            })
            .collect::<Vec<_>>();
        let changed = results.iter().any(Result::is_ok);
        drop(q);
        if changed {
            // A deadline may have moved earlier: sleeping receivers recompute their wake time.
            slot.notify.notify_waiters();
        }
        results
    }

    /// Counts a queue's messages by state (after processing due delays and expired leases).
    pub fn queue_len(&self, queue: &str) -> QueueStats {
        let Some(slot) = lock(&self.queues).get(queue).cloned() else {
            return QueueStats::default();
        };
        let mut q = lock(&slot.state);
        q.tick(Instant::now());
        q.stats()
    }
}

#[cfg(test)]
mod tests;
