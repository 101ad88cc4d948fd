//! The shared owner: polls counted, wakes from many tasks, the holder's nearby polls, another
//! runtime's poll, an end and a panic.

use super::*;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

type Request = (u64, oneshot::Sender<u64>);

/// An owner that answers each number sent to it with its double.
fn doubler() -> (Arc<Owner>, mpsc::Sender<Request>) {
    let (tx, mut rx) = mpsc::channel::<Request>(16);
    let owner = Owner::spawn(|_| {
        Box::pin(async move {
            while let Some((n, answer)) = rx.recv().await {
                let _ = answer.send(n * 2);
            }
        })
    });
    (owner, tx)
}

/// Submit `request` as the host does: through the held future when nobody polls it.
async fn submit(owner: &Owner, tx: &mpsc::Sender<Request>, request: Request) {
    let request = match owner.hold() {
        Some(held) => match tx.try_send(request) {
            Ok(()) => return drop(held),
            Err(full) => full.into_inner(),
        },
        None => request,
    };
    tx.send(request).await.unwrap();
}

/// An owner whose every poll is counted and, when asked, wakes itself once before the
/// covered part of its poll (`BEFORE`) or after it (`AFTER`).
fn self_waking() -> (Arc<Owner>, Arc<AtomicUsize>, Arc<AtomicU8>) {
    let (polls, wake) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicU8::new(0)));
    let (counted, asked) = (polls.clone(), wake.clone());
    let owner = Owner::spawn(|cover| {
        Box::pin(async move {
            let mut covered = std::pin::pin!(cover.polling(std::future::pending::<()>()));
            std::future::poll_fn(|cx| {
                counted.fetch_add(1, SeqCst);
                let wake = asked.swap(0, SeqCst);
                if wake == BEFORE {
                    cx.waker().wake_by_ref();
                }
                let _ = covered.as_mut().poll(cx);
                if wake == AFTER {
                    cx.waker().wake_by_ref();
                }
                Poll::<()>::Pending
            })
            .await
        })
    });
    (owner, polls, wake)
}
const BEFORE: u8 = 1;
const AFTER: u8 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_the_covered_part_saw_costs_no_second_poll_and_a_later_one_does() {
    let (owner, polls, wake) = self_waking();
    // The driver's first poll.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(polls.load(SeqCst), 1);
    wake.store(BEFORE, SeqCst);
    drop(owner.hold().expect("idle"));
    assert_eq!(
        polls.load(SeqCst),
        2,
        "the wake came before the mark: one poll"
    );
    wake.store(AFTER, SeqCst);
    drop(owner.hold().expect("idle"));
    assert_eq!(
        polls.load(SeqCst),
        4,
        "the wake came after the mark: polled again"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(polls.load(SeqCst), 4, "and nothing left for the driver");
}

#[tokio::test(flavor = "current_thread")]
async fn a_helper_polls_a_woken_future_on_its_own_task_and_the_driver_then_skips_its_poll() {
    let (tx, mut rx) = mpsc::channel::<u64>(16);
    let (polls, seen) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (counted, got) = (polls.clone(), seen.clone());
    let owner = Owner::spawn(|_| {
        Box::pin(async move {
            std::future::poll_fn(|cx| {
                counted.fetch_add(1, SeqCst);
                while let Poll::Ready(Some(n)) = rx.poll_recv(cx) {
                    got.fetch_add(n as usize, SeqCst);
                }
                Poll::<()>::Pending
            })
            .await
        })
    });
    // The driver's first poll.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(polls.load(SeqCst), 1);
    owner.help();
    assert_eq!(polls.load(SeqCst), 1, "not woken: no poll");
    // The send wakes the future; on this one thread the driver cannot run before the help.
    tx.try_send(7).unwrap();
    owner.help();
    assert_eq!(seen.load(SeqCst), 7, "taken within the helper's poll");
    assert_eq!(polls.load(SeqCst), 2);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        polls.load(SeqCst),
        2,
        "the driver, woken too, found nothing to poll for"
    );
    tx.try_send(5).unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        (seen.load(SeqCst), polls.load(SeqCst)),
        (12, 3),
        "unhelped: the driver polls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_is_answered_within_the_callers_own_poll() {
    let (owner, tx) = doubler();
    // Let the driver run once and go idle.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (answer, mut rx) = oneshot::channel();
    submit(&owner, &tx, (21, answer)).await;
    assert_eq!(rx.try_recv(), Ok(42), "answered before the caller waited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_poll_from_another_runtime_makes_belongs_to_the_owners_runtime() {
    // Each request waits for a tick of an interval made at the first request (as the
    // Store-owner's heartbeat and a job's sleeps are made inside its future's poll).
    let (tx, mut rx) = mpsc::channel::<Request>(16);
    let owner = Owner::spawn(|_| {
        Box::pin(async move {
            let mut ticks = None;
            while let Some((n, answer)) = rx.recv().await {
                let interval =
                    ticks.get_or_insert_with(|| tokio::time::interval(Duration::from_millis(1)));
                interval.tick().await;
                let _ = answer.send(n * 2);
            }
        })
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The first request comes from a runtime of its own, on a thread of its own, which then
    // shuts down: its poll of the future made the interval.
    let (other_owner, other_tx) = (owner.clone(), tx.clone());
    std::thread::spawn(move || {
        let other = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        other.block_on(async {
            let (answer, rx) = oneshot::channel();
            submit(&other_owner, &other_tx, (1, answer)).await;
            assert_eq!(rx.await.unwrap(), 2);
        });
    })
    .join()
    .unwrap();
    // Its interval still ticks: it was made in the owner's runtime, not the one that ended.
    for n in 2..5 {
        let (answer, rx) = oneshot::channel();
        submit(&owner, &tx, (n, answer)).await;
        let got = tokio::time::timeout(Duration::from_secs(5), rx).await;
        assert_eq!(got.expect("answered").expect("the owner lives"), n * 2);
    }
}

/// A chain of `len` owners: each passes every number it gets on to the next, the last
/// adds it to the returned total. The first owner's sender.
fn chain(len: usize) -> (Vec<Arc<Owner>>, mpsc::Sender<u64>, Arc<AtomicUsize>) {
    let total = Arc::new(AtomicUsize::new(0));
    let (first, mut rx) = mpsc::channel::<u64>(16);
    let mut owners = Vec::new();
    for at in 0..len {
        let (tx, next_rx) = mpsc::channel::<u64>(16);
        let mut this_rx = std::mem::replace(&mut rx, next_rx);
        let last = (at + 1 == len).then(|| total.clone());
        owners.push(Owner::spawn(|_| {
            Box::pin(async move {
                while let Some(n) = this_rx.recv().await {
                    match &last {
                        Some(total) => drop(total.fetch_add(n as usize, SeqCst)),
                        None => tx.try_send(n).unwrap(),
                    }
                }
            })
        }));
    }
    (owners, first, total)
}

#[tokio::test(flavor = "current_thread")]
async fn owners_a_held_poll_wakes_are_polled_by_the_holder_and_the_rest_by_their_drivers() {
    let (owners, first, total) = chain(3);
    // Every driver's first poll.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let held = owners[0].hold().expect("idle");
    first.try_send(5).unwrap();
    drop(held);
    // On this one thread no driver ran in between: the holder polled the second owner,
    // whose poll woke the third, polled by the holder too.
    assert_eq!(
        total.load(SeqCst),
        5,
        "through the chain within the holder's poll"
    );
    // A chain longer than the holder polls: the rest goes on through the drivers.
    let (owners, first, total) = chain(NEARBY_HELPS + 4);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let held = owners[0].hold().expect("idle");
    first.try_send(7).unwrap();
    drop(held);
    assert_eq!(total.load(SeqCst), 0, "past what the holder polls");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(total.load(SeqCst), 7, "the drivers took it from there");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wakes_from_many_tasks_are_never_lost() {
    let (owner, tx) = doubler();
    let answered = Arc::new(AtomicUsize::new(0));
    let tasks = (0..8).map(|t| {
        let (owner, tx, answered) = (owner.clone(), tx.clone(), answered.clone());
        tokio::spawn(async move {
            for n in 0..2_000u64 {
                let (answer, rx) = oneshot::channel();
                // Half the tasks submit through the held future, half leave it to others.
                if t % 2 == 0 {
                    submit(&owner, &tx, (n, answer)).await;
                } else {
                    tx.send((n, answer)).await.unwrap();
                }
                let got = tokio::time::timeout(Duration::from_secs(5), rx).await;
                assert_eq!(got.expect("a wake was lost").unwrap(), n * 2);
                answered.fetch_add(1, SeqCst);
            }
        })
    });
    for task in tasks.collect::<Vec<_>>() {
        task.await.unwrap();
    }
    assert_eq!(answered.load(SeqCst), 16_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_future_finishes_once_whoever_polls_it() {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let ended = Arc::new(AtomicUsize::new(0));
    let end = ended.clone();
    let owner = Owner::spawn(|_| {
        Box::pin(async move {
            let _ = rx.recv().await;
            end.fetch_add(1, SeqCst);
        })
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The sender's drop wakes the future; it ends in the driver's poll or this one.
    drop(tx);
    drop(owner.hold());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(ended.load(SeqCst), 1);
    assert!(owner.hold().is_some(), "a finished future is not held");
    assert_eq!(Arc::strong_count(&owner), 1, "the driver task ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_future_ends_without_panicking_the_caller_that_polled_it() {
    let (tx, mut rx) = mpsc::channel::<Request>(16);
    let owner = Owner::spawn(|_| {
        Box::pin(async move {
            if let Some((n, _answer)) = rx.recv().await {
                panic!("a host bug on {n}");
            }
        })
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (answer, waiting) = oneshot::channel();
    // The held poll runs the future into its panic here, on the caller's task.
    submit(&owner, &tx, (7, answer)).await;
    let got = tokio::time::timeout(Duration::from_secs(5), waiting).await;
    assert!(got.expect("answered").is_err(), "the call answers: gone");
    assert!(
        tx.send((8, oneshot::channel().0)).await.is_err(),
        "the owner's end is gone"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(Arc::strong_count(&owner), 1, "the driver task ended");
}
