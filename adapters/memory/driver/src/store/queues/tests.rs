//! Unit tests of the memory store's queues.

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
