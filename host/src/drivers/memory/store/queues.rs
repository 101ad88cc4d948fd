//! Queues: FIFO with delays and visibility leases, settled by receipt (ack, nack, extend).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::drivers::faults::SettlementRefusals;

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
mod tests {
    use super::super::test_support::*;
    use super::*;
    use std::collections::HashSet;
    use std::time::Duration;
    use tokio::time::{sleep, timeout};

    #[tokio::test]
    async fn queue_is_fifo_and_receive_takes_at_most_max() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0), q("b", 0), q("c", 0)])
            .unwrap();
        let r = s.queue_receive("q", 2, 10_000, 0).await;
        assert_eq!(bodies(&r), vec!["a", "b"]);
        assert_eq!(r[0].headers, vec![("h".to_string(), b"v".to_vec())]);
        assert_eq!(bodies(&s.queue_receive("q", 5, 10_000, 0).await), vec!["c"]);
        assert_eq!(
            s.queue_len("q"),
            QueueStats {
                ready: 0,
                delayed: 0,
                leased: 3
            }
        );
        assert!(s.queue_receive("q", 0, 10_000, 0).await.is_empty());
        assert_eq!(s.queue_len("missing"), QueueStats::default());
    }

    #[tokio::test]
    async fn receive_gives_up_after_wait_ms() {
        let s = MemoryStore::new();
        let t0 = Instant::now();
        assert!(s.queue_receive("q", 1, 1000, 80).await.is_empty());
        assert!(t0.elapsed() >= Duration::from_millis(80));
    }

    #[tokio::test]
    async fn delayed_message_not_delivered_early_then_ordered_by_due_then_push() {
        let s = MemoryStore::new();
        s.queue_push(
            "q",
            vec![q("late", 300), q("d1", 150), q("d2", 150), q("now", 0)],
        )
        .unwrap();
        assert_eq!(
            bodies(&s.queue_receive("q", 10, 10_000, 0).await),
            vec!["now"]
        );
        assert_eq!(
            s.queue_len("q"),
            QueueStats {
                ready: 0,
                delayed: 3,
                leased: 1
            }
        );
        assert!(s.queue_receive("q", 10, 10_000, 50).await.is_empty());
        sleep(Duration::from_millis(400)).await;
        assert_eq!(
            bodies(&s.queue_receive("q", 10, 10_000, 0).await),
            vec!["d1", "d2", "late"]
        );
    }

    #[tokio::test]
    async fn waiting_receiver_woken_by_push() {
        let s = MemoryStore::new();
        let s2 = s.clone();
        let t0 = Instant::now();
        let task = tokio::spawn(async move { s2.queue_receive("q", 5, 10_000, 5_000).await });
        sleep(Duration::from_millis(50)).await;
        s.queue_push("q", vec![q("x", 0)]).unwrap();
        let r = timeout(LONG, task).await.unwrap().unwrap();
        assert_eq!(bodies(&r), vec!["x"]);
        assert!(t0.elapsed() < Duration::from_millis(2_000));
    }

    #[tokio::test]
    async fn waiting_receiver_woken_by_delay_becoming_due() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("d", 100)]).unwrap();
        let t0 = Instant::now();
        let r = s.queue_receive("q", 5, 10_000, 5_000).await;
        assert_eq!(bodies(&r), vec!["d"]);
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(100) && took < Duration::from_millis(2_000));
    }

    #[tokio::test]
    async fn lease_expiry_redelivers_at_the_front_and_wakes_waiters() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0), q("b", 0)]).unwrap();
        let first = s.queue_receive("q", 1, 100, 0).await;
        assert_eq!(bodies(&first), vec!["a"]);
        let second = s.queue_receive("q", 1, 10_000, 0).await;
        assert_eq!(bodies(&second), vec!["b"]);
        s.queue_push("q", vec![q("c", 0)]).unwrap();
        // Leave c alone; a waiter on an empty queue is woken by a's expiry alone.
        let c = s.queue_receive("q", 1, 10_000, 0).await;
        assert_eq!(bodies(&c), vec!["c"]);
        s.queue_push("q", vec![q("d", 0)]).unwrap();
        sleep(Duration::from_millis(150)).await;
        // a expired: back at the front, before d.
        let r = s.queue_receive("q", 10, 10_000, 0).await;
        assert_eq!(bodies(&r), vec!["a", "d"]);
        assert_ne!(r[0].receipt, first[0].receipt, "a fresh receipt");
        // The old receipt is stale now.
        assert!(matches!(
            &s.queue_ack("q", &[first[0].receipt])[0],
            Err(StoreError::BadRequest(_))
        ));

        // A waiter with nothing ready is woken by an expiry (no push at all).
        let s2 = MemoryStore::new();
        s2.queue_push("w", vec![q("x", 0)]).unwrap();
        let _lease = s2.queue_receive("w", 1, 120, 0).await;
        let t0 = Instant::now();
        let r = s2.queue_receive("w", 1, 10_000, 5_000).await;
        assert_eq!(bodies(&r), vec!["x"]);
        assert!(t0.elapsed() < Duration::from_millis(2_000));
    }

    #[tokio::test]
    async fn waiter_woken_by_a_shorter_lease_taken_after_it_started() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("long", 0)]).unwrap();
        let _long = s.queue_receive("q", 1, 60_000, 0).await;
        let s2 = s.clone();
        let waiter = tokio::spawn(async move { s2.queue_receive("q", 1, 10_000, 4_000).await });
        sleep(Duration::from_millis(30)).await;
        // Pushed and leased at once by someone else with a short lease; the waiter may or may
        // not win the push, but either way it must get a message well before its wait ends.
        s.queue_push("q", vec![q("short", 0)]).unwrap();
        let _mine = s.queue_receive("q", 1, 100, 0).await;
        let t0 = Instant::now();
        let r = timeout(LONG, waiter).await.unwrap().unwrap();
        assert_eq!(bodies(&r), vec!["short"]);
        assert!(t0.elapsed() < Duration::from_millis(2_000));
    }

    #[tokio::test]
    async fn ack_removes_for_good() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0), q("b", 0)]).unwrap();
        let r = s.queue_receive("q", 2, 50, 0).await;
        let res = s.queue_ack("q", &[r[0].receipt]);
        assert_eq!(res, vec![Ok(())]);
        sleep(Duration::from_millis(100)).await;
        // b expired and comes back; a does not.
        assert_eq!(
            bodies(&s.queue_receive("q", 10, 10_000, 0).await),
            vec!["b"]
        );
        assert_eq!(
            s.queue_len("q"),
            QueueStats {
                ready: 0,
                delayed: 0,
                leased: 1
            }
        );
    }

    #[tokio::test]
    async fn nack_zero_puts_back_at_front_unchanged() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0), q("b", 0), q("c", 0)])
            .unwrap();
        let r = s.queue_receive("q", 2, 10_000, 0).await;
        assert_eq!(
            s.queue_nack("q", &[r[0].receipt, r[1].receipt], 0),
            vec![Ok(()), Ok(())]
        );
        let again = s.queue_receive("q", 10, 10_000, 0).await;
        assert_eq!(bodies(&again), vec!["a", "b", "c"]);
        assert_eq!(again[0].headers, r[0].headers);
        assert!(
            !again
                .iter()
                .any(|m| m.receipt == r[0].receipt || m.receipt == r[1].receipt)
        );
    }

    #[tokio::test]
    async fn nack_with_delay_redelivers_after_it_and_wakes_waiter() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0)]).unwrap();
        let r = s.queue_receive("q", 1, 10_000, 0).await;
        assert_eq!(s.queue_nack("q", &[r[0].receipt], 150), vec![Ok(())]);
        assert_eq!(
            s.queue_len("q"),
            QueueStats {
                ready: 0,
                delayed: 1,
                leased: 0
            }
        );
        assert!(s.queue_receive("q", 1, 10_000, 50).await.is_empty());
        let r = s.queue_receive("q", 1, 10_000, 3_000).await;
        assert_eq!(bodies(&r), vec!["a"]);

        // A waiter is woken by a nack (delay 0).
        let s2 = s.clone();
        let waiter = tokio::spawn(async move { s2.queue_receive("q", 1, 10_000, 4_000).await });
        sleep(Duration::from_millis(30)).await;
        let t0 = Instant::now();
        s.queue_nack("q", &[r[0].receipt], 0);
        let got = timeout(LONG, waiter).await.unwrap().unwrap();
        assert_eq!(bodies(&got), vec!["a"]);
        assert!(t0.elapsed() < Duration::from_millis(1_000));
    }

    #[tokio::test]
    async fn extend_keeps_the_lease_alive() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0)]).unwrap();
        let r = s.queue_receive("q", 1, 100, 0).await;
        sleep(Duration::from_millis(50)).await;
        assert_eq!(s.queue_extend("q", &[r[0].receipt], 400), vec![Ok(())]);
        sleep(Duration::from_millis(150)).await;
        // Past the original 100 ms: still leased.
        assert!(s.queue_receive("q", 1, 10_000, 0).await.is_empty());
        assert_eq!(s.queue_len("q").leased, 1);
        assert_eq!(s.queue_ack("q", &[r[0].receipt]), vec![Ok(())]);
        assert_eq!(s.queue_len("q"), QueueStats::default());
    }

    #[tokio::test]
    async fn extend_to_a_shorter_lease_wakes_a_sleeping_waiter() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0)]).unwrap();
        let r = s.queue_receive("q", 1, 60_000, 0).await;
        let s2 = s.clone();
        let waiter = tokio::spawn(async move { s2.queue_receive("q", 1, 10_000, 4_000).await });
        sleep(Duration::from_millis(30)).await; // the waiter sleeps until its 4 s give-up
        let t0 = Instant::now();
        assert_eq!(s.queue_extend("q", &[r[0].receipt], 50), vec![Ok(())]);
        let got = timeout(LONG, waiter).await.unwrap().unwrap();
        assert_eq!(bodies(&got), vec!["a"]);
        assert!(t0.elapsed() < Duration::from_millis(2_000));
    }

    #[tokio::test]
    async fn stale_receipts_are_bad_requests_naming_the_receipt() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0), q("b", 0)]).unwrap();
        let r = s.queue_receive("q", 2, 60, 0).await;
        let (a, b) = (r[0].receipt, r[1].receipt);
        let check = |res: &Result<(), StoreError>, receipt: u64| match res {
            Err(StoreError::BadRequest(m)) => assert!(m.contains(&receipt.to_string()), "{m}"),
            other => panic!("expected bad request, got {other:?}"),
        };
        // Unknown.
        check(&s.queue_ack("q", &[999_999])[0], 999_999);
        // Already settled, per-receipt results in order.
        let res = s.queue_ack("q", &[a, a]);
        assert_eq!(res[0], Ok(()));
        check(&res[1], a);
        check(&s.queue_nack("q", &[a], 0)[0], a);
        check(&s.queue_extend("q", &[a], 100)[0], a);
        // Expired.
        sleep(Duration::from_millis(120)).await;
        check(&s.queue_ack("q", &[b])[0], b);
        check(&s.queue_extend("q", &[b], 100)[0], b);
        // Another queue's receipt names nothing here.
        s.queue_push("other", vec![q("o", 0)]).unwrap();
        let o = s.queue_receive("other", 1, 10_000, 0).await[0].receipt;
        check(&s.queue_ack("q", &[o])[0], o);
        assert_eq!(s.queue_ack("other", &[o]), vec![Ok(())]);
    }

    #[tokio::test]
    async fn receipts_are_unique_store_wide() {
        let s = MemoryStore::new();
        let mut seen = HashSet::new();
        for name in ["q1", "q2"] {
            s.queue_push(name, (0..20).map(|i| q(&i.to_string(), 0)).collect())
                .unwrap();
        }
        for _ in 0..2 {
            for name in ["q1", "q2"] {
                for m in s.queue_receive(name, 5, 1, 0).await {
                    assert!(seen.insert(m.receipt), "receipt reused");
                }
            }
            sleep(Duration::from_millis(5)).await; // leases expire: the same messages again
        }
        assert_eq!(seen.len(), 20);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn competing_receivers_get_disjoint_messages() {
        let s = MemoryStore::new();
        let n = 400;
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                loop {
                    let r = s.queue_receive("q", 3, 60_000, 200).await;
                    if r.is_empty() {
                        break;
                    }
                    got.extend(bodies(&r));
                }
                got
            }));
        }
        for chunk in (0..n).collect::<Vec<_>>().chunks(10) {
            s.queue_push("q", chunk.iter().map(|i| q(&i.to_string(), 0)).collect())
                .unwrap();
            tokio::task::yield_now().await;
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(timeout(LONG, t).await.unwrap().unwrap());
        }
        let distinct: HashSet<_> = all.iter().cloned().collect();
        assert_eq!(all.len(), n, "no duplicates");
        assert_eq!(distinct.len(), n, "nothing lost");
    }

    #[tokio::test]
    async fn refused_settlements_count_and_change_nothing() {
        let s = MemoryStore::new();
        s.queue_push("q", vec![q("a", 0), q("b", 0)]).unwrap();
        let r = s.queue_receive("q", 2, 10_000, 0).await;
        let (a, b) = (r[0].receipt, r[1].receipt);
        s.refuse_settlements("q", 3);
        // Another queue is not affected.
        s.queue_push("other", vec![q("o", 0)]).unwrap();
        let o = s.queue_receive("other", 1, 10_000, 0).await[0].receipt;
        assert_eq!(s.queue_ack("other", &[o]), vec![Ok(())]);
        let res = s.queue_ack("q", &[a, b]);
        assert!(
            res.iter().all(|r| matches!(r, Err(StoreError::Refused(_)))),
            "{res:?}"
        );
        let res = s.queue_nack("q", &[a], 0);
        assert!(matches!(res[0], Err(StoreError::Refused(_))));
        assert_eq!(
            s.queue_len("q"),
            QueueStats {
                ready: 0,
                delayed: 0,
                leased: 2
            },
            "nothing changed"
        );
        // The count is used up: settlements land again.
        assert_eq!(s.queue_ack("q", &[a]), vec![Ok(())]);
        assert_eq!(s.queue_extend("q", &[b], 10_000), vec![Ok(())]);
        assert_eq!(s.queue_nack("q", &[b], 0), vec![Ok(())]);
        assert_eq!(
            s.queue_len("q"),
            QueueStats {
                ready: 1,
                delayed: 0,
                leased: 0
            }
        );
        // A refused extend does not extend.
        let r = s.queue_receive("q", 1, 80, 0).await;
        s.refuse_settlements("q", 1);
        assert!(matches!(
            s.queue_extend("q", &[r[0].receipt], 60_000)[0],
            Err(StoreError::Refused(_))
        ));
        sleep(Duration::from_millis(120)).await;
        assert_eq!(
            s.queue_len("q").ready,
            1,
            "the lease expired as if never extended"
        );
    }
}
