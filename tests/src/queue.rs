//! Queue contracts: at-least-once work queues with competing consumers, prefetch, retry with
//! attempt counting, release, dead-lettering, first settlement wins, refused settlements, and
//! a stopped consumer's unsettled work reaching another consumer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use tokio::sync::mpsc;
use wrpc_broker::bindings::queue::{ConsumeOptions as RawOptions, Settlement};
use wrpc_broker::{ConsumeOptions, Delivery, Error, ProduceOptions, Queue, Settled};

use crate::support::{ARRIVAL, SILENCE, recv, unique};
use crate::{Factory, ensure_eq};

crate::contract_tests!(
    Queue:
    produce_consume_100_with_headers,
    an_empty_body_is_delivered_empty,
    competing_consumers_on_two_instances_share_the_work,
    prefetch_bounds_unsettled_deliveries_handled_concurrently,
    ack_is_final,
    retry_redelivers_after_the_delay_with_attempt_plus_one,
    release_puts_back_now_with_the_same_attempt,
    dead_letter_moves_with_reason_and_attempt,
    a_failing_handler_is_retried_with_backoff_never_released,
    the_first_settlement_wins,
    the_adapter_refuses_a_second_settlement_of_one_tag,
    a_stopped_consumer_hands_unsettled_work_to_another,
    a_thousand_messages_with_random_failures_all_handled,
    refused_settlements_hand_the_message_back_and_mark_unhealthy [Refusals],
    depth_counts_what_is_not_done_waiting_delayed_or_unsettled,
);

/// A consumer of the adapter itself (no host machinery), holding at most `prefetch` deliveries.
async fn raw_consumer(
    adapter: &wrpc_broker::runtime::AdapterInstance,
    name: &str,
    prefetch: u32,
) -> anyhow::Result<(
    u64,
    mpsc::Receiver<Vec<wrpc_broker::bindings::queue::Delivery>>,
)> {
    let options = RawOptions {
        prefetch,
        dead_letter: None,
    };
    Ok(adapter.queue_consume(name.to_string(), options).await?)
}

/// What a test handler saw: (body, attempt) in arrival order.
type Seen = Arc<Mutex<Vec<(String, u32)>>>;

fn text(d: &Delivery) -> String {
    String::from_utf8_lossy(&d.body).into_owned()
}

async fn produce_n(queue: &Queue, name: &str, n: usize) -> anyhow::Result<()> {
    let messages = (0..n)
        .map(|i| (format!("m{i}").into_bytes(), ProduceOptions::default()))
        .collect();
    Ok(queue.produce_batch(name, messages).await?)
}

/// Consume `name`, recording every delivery and acking it; deliveries also go to the channel.
async fn recorder(
    queue: &Queue,
    name: &str,
    prefetch: u32,
) -> anyhow::Result<(
    wrpc_broker::Consumer,
    Seen,
    mpsc::UnboundedReceiver<(String, u32)>,
)> {
    let seen: Seen = Arc::default();
    let (tx, rx) = mpsc::unbounded_channel();
    let record = seen.clone();
    let consumer = queue
        .consume(
            name,
            move |d: Delivery| {
                let (record, tx) = (record.clone(), tx.clone());
                async move {
                    record.lock().unwrap().push((text(&d), d.attempt));
                    let _ = tx.send((text(&d), d.attempt));
                    Ok(())
                }
            },
            ConsumeOptions {
                prefetch,
                dead_letter: None,
            },
        )
        .await?;
    Ok((consumer, seen, rx))
}

/// Wait until `count` deliveries were seen.
async fn until_seen(seen: &Seen, count: usize, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + ARRIVAL;
    while seen.lock().unwrap().len() < count {
        ensure!(
            Instant::now() < deadline,
            "{what}: {} of {count} deliveries within {ARRIVAL:?}",
            seen.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn an_empty_body_is_delivered_empty(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let queue = broker.queue()?;
    let name = unique("empty");
    let empty = ProduceOptions {
        headers: vec![("h".to_string(), Vec::new())],
    };
    queue.produce(&name, Vec::<u8>::new(), empty).await?;
    queue
        .produce(&name, "after", ProduceOptions::default())
        .await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer = queue
        .consume(
            &name,
            move |d: Delivery| {
                let sent = tx.send((d.body.clone(), d.headers.clone()));
                async move { Ok(sent?) }
            },
            ConsumeOptions {
                prefetch: 1,
                dead_letter: None,
            },
        )
        .await?;
    let first = recv(&mut rx, "the empty message").await;
    let second = recv(&mut rx, "the message after it").await;
    consumer.stop().await;
    let (body, headers) = first?;
    ensure_eq!(
        body.len(),
        0,
        "bytes of the first body (zero were produced)"
    );
    ensure_eq!(
        headers,
        vec![("h".to_string(), Vec::new())],
        "the empty message's headers"
    );
    ensure_eq!(second?.0, b"after".to_vec(), "the body after the empty one");
    Ok(())
}

async fn produce_consume_100_with_headers(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let queue = broker.queue()?;
    let name = unique("work");
    for i in 0..100 {
        let headers = vec![
            ("n".to_string(), vec![i as u8]),
            ("n".into(), b"again".to_vec()),
        ];
        queue
            .produce(&name, format!("m{i}"), ProduceOptions { headers })
            .await?;
    }
    let got: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let keep = got.clone();
    let consumer = queue
        .consume(
            &name,
            move |d| {
                let keep = keep.clone();
                async move {
                    keep.lock().unwrap().push(d);
                    Ok(())
                }
            },
            ConsumeOptions {
                prefetch: 1,
                dead_letter: None,
            },
        )
        .await?;
    let deadline = Instant::now() + ARRIVAL;
    while got.lock().unwrap().len() < 100 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    consumer.stop().await;
    let got = got.lock().unwrap().clone();
    ensure_eq!(got.len(), 100, "deliveries");
    for (i, d) in got.iter().enumerate() {
        ensure_eq!(
            text(d),
            format!("m{i}"),
            "body {i} (prefetch 1 keeps the queue order)"
        );
        ensure_eq!(d.attempt, 1, "attempt of {i}");
        ensure_eq!(
            d.headers,
            vec![
                ("n".to_string(), vec![i as u8]),
                ("n".into(), b"again".to_vec())
            ],
            "headers of {i}"
        );
    }
    Ok(())
}

async fn competing_consumers_on_two_instances_share_the_work(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let name = unique("shared");
    let (ca, seen_a, _) = recorder(&a.queue()?, &name, 8).await?;
    let (cb, seen_b, _) = recorder(&b.queue()?, &name, 8).await?;
    produce_n(&a.queue()?, &name, 400).await?;
    let deadline = Instant::now() + ARRIVAL;
    while seen_a.lock().unwrap().len() + seen_b.lock().unwrap().len() < 400
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(SILENCE).await;
    ca.stop().await;
    cb.stop().await;
    let (seen_a, seen_b) = (
        seen_a.lock().unwrap().clone(),
        seen_b.lock().unwrap().clone(),
    );
    let mut all: Vec<String> = seen_a
        .iter()
        .chain(&seen_b)
        .map(|(m, _)| m.clone())
        .collect();
    ensure_eq!(
        all.len(),
        400,
        "deliveries in total (none twice without a failure)"
    );
    all.sort();
    all.dedup();
    ensure_eq!(all.len(), 400, "distinct messages delivered");
    ensure!(
        !seen_a.is_empty() && !seen_b.is_empty(),
        "both consumers got work ({} and {})",
        seen_a.len(),
        seen_b.len()
    );
    Ok(())
}

async fn prefetch_bounds_unsettled_deliveries_handled_concurrently(
    f: Factory,
) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let queue = broker.queue()?;
    let name = unique("prefetch");
    produce_n(&queue, &name, 12).await?;
    let (running, peak, done) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (r, p, d) = (running.clone(), peak.clone(), done.clone());
    let consumer = queue
        .consume(
            &name,
            move |_delivery| {
                let (r, p, d) = (r.clone(), p.clone(), d.clone());
                async move {
                    let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                    p.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    r.fetch_sub(1, Ordering::SeqCst);
                    d.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            },
            ConsumeOptions {
                prefetch: 4,
                dead_letter: None,
            },
        )
        .await?;
    let deadline = Instant::now() + ARRIVAL;
    while done.load(Ordering::SeqCst) < 12 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    consumer.stop().await;
    ensure_eq!(done.load(Ordering::SeqCst), 12, "handled");
    ensure_eq!(
        peak.load(Ordering::SeqCst),
        4,
        "the most handlers at once with prefetch 4"
    );
    // The adapter's own bound: with prefetch 3 and nothing settled, it delivers exactly 3.
    let (id, mut deliveries) = raw_consumer(&broker.adapter(), &name, 3).await?;
    produce_n(&queue, &name, 5).await?;
    let mut held = Vec::new();
    while held.len() < 3 {
        held.extend(recv(&mut deliveries, "raw deliveries").await?);
    }
    ensure_eq!(held.len(), 3, "unsettled deliveries with prefetch 3");
    if let Ok(Some(more)) = tokio::time::timeout(SILENCE, deliveries.recv()).await {
        bail!("the adapter delivered {} more than prefetch", more.len());
    }
    broker.adapter().queue_stop(id).await?;
    Ok(())
}

async fn ack_is_final(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let queue = broker.queue()?;
    let name = unique("ack");
    produce_n(&queue, &name, 3).await?;
    let (consumer, seen, _) = recorder(&queue, &name, 2).await?;
    until_seen(&seen, 3, "first deliveries").await?;
    tokio::time::sleep(SILENCE).await;
    ensure_eq!(seen.lock().unwrap().len(), 3, "deliveries after acks");
    consumer.stop().await;
    let (again, seen, _) = recorder(&queue, &name, 2).await?;
    tokio::time::sleep(SILENCE).await;
    again.stop().await;
    ensure!(
        seen.lock().unwrap().is_empty(),
        "acked messages came back: {:?}",
        seen.lock().unwrap()
    );
    Ok(())
}

async fn depth_counts_what_is_not_done_waiting_delayed_or_unsettled(
    f: Factory,
) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let (queue, adapter) = (broker.queue()?, broker.adapter());
    let (name, dlq) = (unique("depth"), unique("depth-dead"));
    ensure_eq!(queue.depth(&name).await?, 0, "a queue nobody produced to");
    produce_n(&queue, &name, 3).await?;
    ensure_eq!(queue.depth(&name).await?, 3, "three waiting");
    let options = RawOptions {
        prefetch: 1,
        dead_letter: Some(dlq.clone()),
    };
    let (id, mut deliveries) = adapter.queue_consume(name.clone(), options).await?;
    let mut settle = async |settlement: Settlement| -> anyhow::Result<()> {
        let held = recv(&mut deliveries, "a delivery").await?.remove(0);
        let results = adapter
            .queue_settle(id, vec![(held.tag, settlement)])
            .await?;
        ensure!(results.iter().all(|r| r.is_ok()), "settled: {results:?}");
        Ok(())
    };
    // Delivered and unsettled still counts; a retry waiting for its delay counts.
    settle(Settlement::Retry(60_000)).await?;
    ensure_eq!(queue.depth(&name).await?, 3, "one delayed, two waiting");
    settle(Settlement::Ack).await?;
    ensure_eq!(queue.depth(&name).await?, 2, "after an ack");
    settle(Settlement::DeadLetter("no".into())).await?;
    ensure_eq!(
        queue.depth(&name).await?,
        1,
        "after a dead-letter: the delayed retry"
    );
    ensure_eq!(queue.depth(&dlq).await?, 1, "the dead-letter queue");
    adapter.queue_stop(id).await?;
    ensure_eq!(
        queue.depth(&name).await?,
        1,
        "a stopped consumer changes nothing"
    );
    Ok(())
}

/// Consume `name` and apply `settle` to the first delivery of each message; every later delivery
/// is acked. Returns (body, attempt, time since start) of every delivery.
async fn settle_first_with<S, Fut>(
    queue: &Queue,
    name: &str,
    settle: S,
) -> anyhow::Result<(
    wrpc_broker::Consumer,
    mpsc::UnboundedReceiver<(String, u32, Duration, Option<Settled>)>,
)>
where
    S: Fn(Delivery) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Settled, Error>> + Send + 'static,
{
    let started = Instant::now();
    let (tx, rx) = mpsc::unbounded_channel();
    let settle = Arc::new(settle);
    let consumer = queue
        .consume(
            name,
            move |d: Delivery| {
                let (tx, settle) = (tx.clone(), settle.clone());
                async move {
                    let body = text(&d);
                    let attempt = d.attempt;
                    let outcome = if attempt == 1 {
                        Some(settle(d).await?)
                    } else {
                        None
                    };
                    let _ = tx.send((body, attempt, started.elapsed(), outcome));
                    Ok(())
                }
            },
            ConsumeOptions::default(),
        )
        .await?;
    Ok((consumer, rx))
}

async fn retry_redelivers_after_the_delay_with_attempt_plus_one(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let queue = broker.queue()?;
    let name = unique("retry");
    queue
        .produce(
            &name,
            "job",
            ProduceOptions {
                headers: vec![("k".into(), b"v".to_vec())],
            },
        )
        .await?;
    let (consumer, mut rx) = settle_first_with(&queue, &name, |d| async move {
        d.retry(Duration::from_millis(300)).await
    })
    .await?;
    let first = recv(&mut rx, "the first delivery").await?;
    let second = recv(&mut rx, "the retried delivery").await?;
    consumer.stop().await;
    ensure_eq!((first.0.as_str(), first.1), ("job", 1), "first delivery");
    ensure_eq!(
        (second.0.as_str(), second.1),
        ("job", 2),
        "retried delivery"
    );
    let waited = second.2 - first.2;
    ensure!(
        waited >= Duration::from_millis(250),
        "redelivered after {waited:?}, before the 300 ms delay"
    );
    Ok(())
}

async fn release_puts_back_now_with_the_same_attempt(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let queue = broker.queue()?;
    let name = unique("release");
    queue
        .produce(&name, "job", ProduceOptions::default())
        .await?;
    // A raw consumer holds it and releases it; the next delivery keeps attempt 1.
    let adapter = broker.adapter();
    let (id, mut deliveries) = raw_consumer(&adapter, &name, 1).await?;
    let held = recv(&mut deliveries, "the delivery").await?.remove(0);
    ensure_eq!(held.attempt, 1, "first attempt");
    let results = adapter
        .queue_settle(id, vec![(held.tag, Settlement::Release)])
        .await?;
    ensure!(
        results.iter().all(|r| r.is_ok()),
        "release answered {results:?}"
    );
    let again = recv(&mut deliveries, "the released message")
        .await?
        .remove(0);
    ensure_eq!(
        (again.body.clone(), again.attempt),
        (b"job".to_vec(), 1),
        "the released message and its attempt"
    );
    adapter
        .queue_settle(id, vec![(again.tag, Settlement::Ack)])
        .await?;
    adapter.queue_stop(id).await?;
    Ok(())
}

async fn dead_letter_moves_with_reason_and_attempt(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let queue = broker.queue()?;
    let (name, dlq) = (unique("invoices"), unique("invoices-dead"));
    queue
        .produce(
            &name,
            "bad invoice",
            ProduceOptions {
                headers: vec![("id".into(), b"7".to_vec())],
            },
        )
        .await?;
    let reason = format!("line one\nline two {}", "x".repeat(1000));
    let (tx, mut moved_rx) = mpsc::unbounded_channel();
    let dead_consumer = queue
        .consume(
            &dlq,
            move |d: Delivery| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(d);
                    Ok(())
                }
            },
            ConsumeOptions {
                prefetch: 1,
                dead_letter: None,
            },
        )
        .await?;
    let (tx, mut attempts) = mpsc::unbounded_channel();
    let consumer = queue
        .consume(
            &name,
            {
                let reason = reason.clone();
                move |d: Delivery| {
                    let (reason, tx) = (reason.clone(), tx.clone());
                    async move {
                        let _ = tx.send(d.attempt);
                        if d.attempt < 3 {
                            bail!("not yet");
                        }
                        d.dead_letter(&reason).await?;
                        Ok(())
                    }
                }
            },
            ConsumeOptions {
                prefetch: 1,
                dead_letter: Some(dlq.clone()),
            },
        )
        .await?;
    let moved = recv(&mut moved_rx, "the dead-lettered message").await?;
    tokio::time::sleep(SILENCE).await;
    consumer.stop().await;
    dead_consumer.stop().await;
    let mut seen = Vec::new();
    while let Ok(a) = attempts.try_recv() {
        seen.push(a);
    }
    ensure_eq!(
        seen,
        vec![1, 2, 3],
        "attempts on the original queue (nothing after the move)"
    );
    ensure_eq!(
        moved.body,
        b"bad invoice".to_vec(),
        "body of the dead-lettered copy"
    );
    ensure_eq!(moved.attempt, 3, "the attempt it carries (x-wrpc-attempt)");
    let header = |name: &str| {
        moved
            .headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    ensure_eq!(header("id"), Some("7".to_string()), "the original headers");
    let why = header("x-wrpc-dead-reason").context("x-wrpc-dead-reason is set")?;
    ensure!(
        !why.contains('\n') && !why.contains('\r'),
        "the reason is one line: {why:?}"
    );
    ensure!(
        why.chars().count() <= 512,
        "the reason is at most 512 characters ({})",
        why.chars().count()
    );
    ensure!(
        why.starts_with("line one line two"),
        "the reason keeps its text: {why:?}"
    );
    Ok(())
}

async fn a_failing_handler_is_retried_with_backoff_never_released(
    f: Factory,
) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let queue = broker.queue()?;
    let name = unique("flaky");
    queue
        .produce(&name, "job", ProduceOptions::default())
        .await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let started = Instant::now();
    let consumer = queue
        .consume(
            &name,
            move |d: Delivery| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send((d.attempt, started.elapsed()));
                    if d.attempt < 3 {
                        bail!("failing on attempt {}", d.attempt);
                    }
                    Ok(())
                }
            },
            ConsumeOptions {
                prefetch: 1,
                dead_letter: None,
            },
        )
        .await?;
    let mut seen = Vec::new();
    for i in 0..3 {
        seen.push(recv(&mut rx, &format!("delivery {i}")).await?);
    }
    tokio::time::sleep(SILENCE).await;
    consumer.stop().await;
    ensure!(
        rx.try_recv().is_err(),
        "delivered again after the handler succeeded"
    );
    let attempts: Vec<u32> = seen.iter().map(|(a, _)| *a).collect();
    ensure_eq!(attempts, vec![1, 2, 3], "attempts");
    let (gap1, gap2) = (seen[1].1 - seen[0].1, seen[2].1 - seen[1].1);
    ensure!(
        gap1 >= Duration::from_millis(40),
        "first backoff {gap1:?} (50 ms expected)"
    );
    ensure!(
        gap2 >= Duration::from_millis(80),
        "second backoff {gap2:?} (100 ms expected)"
    );
    Ok(())
}

async fn the_first_settlement_wins(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let queue = broker.queue()?;
    let name = unique("once");
    queue
        .produce(&name, "job", ProduceOptions::default())
        .await?;
    let (consumer, mut rx) = settle_first_with(&queue, &name, |d| async move {
        let first = d.ack().await?;
        let second = d.retry(Duration::from_millis(10)).await?;
        let third = d.dead_letter("late").await?;
        if first != Settled::Applied
            || second != (Settled::AlreadySettled { first: "ack" })
            || third != second
        {
            return Err(Error::Internal(format!(
                "settlements answered {first:?}, {second:?}, {third:?}"
            )));
        }
        Ok(first)
    })
    .await?;
    let (_, attempt, _, outcome) = recv(&mut rx, "the delivery").await?;
    ensure_eq!(
        (attempt, outcome),
        (1, Some(Settled::Applied)),
        "the first delivery and its settlement"
    );
    if let Ok(Some(again)) = tokio::time::timeout(SILENCE * 2, rx.recv()).await {
        bail!("a later settlement took effect: the message came back {again:?}");
    }
    consumer.stop().await;
    Ok(())
}

async fn the_adapter_refuses_a_second_settlement_of_one_tag(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let queue = broker.queue()?;
    let name = unique("twice");
    queue
        .produce(&name, "job", ProduceOptions::default())
        .await?;
    let adapter = broker.adapter();
    let (id, mut deliveries) = raw_consumer(&adapter, &name, 4).await?;
    let held = recv(&mut deliveries, "the delivery").await?.remove(0);
    let first = adapter
        .queue_settle(id, vec![(held.tag, Settlement::Ack)])
        .await?;
    ensure!(first[0].is_ok(), "the first settlement: {:?}", first[0]);
    let second = adapter
        .queue_settle(id, vec![(held.tag, Settlement::Retry(0))])
        .await?;
    ensure!(
        matches!(second[0], Err(Error::Stale(_))),
        "a second settlement of one tag: expected stale, got {:?}",
        second[0]
    );
    if let Ok(Some(again)) = tokio::time::timeout(SILENCE, deliveries.recv()).await {
        bail!(
            "the second settlement took effect: {} deliveries came",
            again.len()
        );
    }
    adapter.queue_stop(id).await?;
    Ok(())
}

async fn a_stopped_consumer_hands_unsettled_work_to_another(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let name = unique("handover");
    produce_n(&a.queue()?, &name, 10).await?;
    // A raw consumer on A holds 5 deliveries unsettled, then stops.
    let adapter = a.adapter();
    let (id, mut deliveries) = raw_consumer(&adapter, &name, 5).await?;
    let mut held = Vec::new();
    while held.len() < 5 {
        held.extend(recv(&mut deliveries, "held deliveries").await?);
    }
    adapter.queue_stop(id).await?;
    // Everything reaches a consumer on B, the 5 handed back included.
    let (consumer, seen, _) = recorder(&b.queue()?, &name, 4).await?;
    until_seen(&seen, 10, "on instance b").await?;
    consumer.stop().await;
    let got: BTreeSet<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(m, _)| m.clone())
        .collect();
    ensure_eq!(got.len(), 10, "distinct messages on b");
    // And through the API: a consumer stopped mid-run leaves nothing behind.
    let name = unique("midrun");
    produce_n(&a.queue()?, &name, 100).await?;
    let handled: Arc<Mutex<Vec<String>>> = Arc::default();
    let slow = {
        let handled = handled.clone();
        a.queue()?
            .consume(
                &name,
                move |d: Delivery| {
                    let handled = handled.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        handled.lock().unwrap().push(text(&d));
                        Ok(())
                    }
                },
                ConsumeOptions {
                    prefetch: 8,
                    dead_letter: None,
                },
            )
            .await?
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    slow.stop().await;
    let (rest, seen, _) = recorder(&b.queue()?, &name, 8).await?;
    let before = handled.lock().unwrap().len();
    ensure!(
        before > 0 && before < 100,
        "the first consumer handled {before} before its stop"
    );
    let deadline = Instant::now() + ARRIVAL;
    loop {
        let all: BTreeSet<String> = handled
            .lock()
            .unwrap()
            .iter()
            .cloned()
            .chain(seen.lock().unwrap().iter().map(|(m, _)| m.clone()))
            .collect();
        if all.len() == 100 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{} of 100 messages handled after the stop",
            all.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    rest.stop().await;
    Ok(())
}

async fn a_thousand_messages_with_random_failures_all_handled(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let name = unique("chaos");
    let handled: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let mut consumers = Vec::new();
    for broker in [&a, &b] {
        let handled = handled.clone();
        consumers.push(
            broker
                .queue()?
                .consume(
                    &name,
                    move |d: Delivery| {
                        let handled = handled.clone();
                        async move {
                            if rand_percent() < 20 {
                                bail!("random failure");
                            }
                            *handled.lock().unwrap().entry(text(&d)).or_default() += 1;
                            Ok(())
                        }
                    },
                    ConsumeOptions {
                        prefetch: 32,
                        dead_letter: None,
                    },
                )
                .await?,
        );
    }
    let queue = a.queue()?;
    let producers: Vec<_> = (0..1000)
        .map(|i| {
            let (queue, name) = (queue.clone(), name.clone());
            tokio::spawn(async move {
                queue
                    .produce(&name, format!("m{i}"), ProduceOptions::default())
                    .await
            })
        })
        .collect();
    for p in producers {
        p.await??;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while handled.lock().unwrap().len() < 1000 {
        ensure!(
            Instant::now() < deadline,
            "{} of 1000 messages handled",
            handled.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for c in &consumers {
        c.stop().await;
    }
    ensure_eq!(
        handled.lock().unwrap().len(),
        1000,
        "distinct messages handled at least once"
    );
    Ok(())
}

/// A cheap random number in 0..100.
fn rand_percent() -> u32 {
    (uuid::Uuid::new_v4().as_u128() % 100) as u32
}

async fn refused_settlements_hand_the_message_back_and_mark_unhealthy(
    f: Factory,
) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let queue = broker.queue()?;
    let name = unique("refused");
    queue
        .produce(&name, "job", ProduceOptions::default())
        .await?;
    // The handler reports each ack's answer and the consumer's health right after it (with
    // prefetch 1 the redelivery cannot be handled before this handler returns).
    let this: Arc<std::sync::OnceLock<Arc<wrpc_broker::Consumer>>> = Arc::default();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer = {
        let this = this.clone();
        queue
            .consume(
                &name,
                move |d: Delivery| {
                    let (tx, this) = (tx.clone(), this.clone());
                    async move {
                        let result = d.ack().await;
                        let healthy = match this.get() {
                            Some(consumer) => Some(consumer.healthy().await),
                            None => None,
                        };
                        let _ = tx.send((text(&d), result, healthy));
                        Ok(())
                    }
                },
                ConsumeOptions {
                    prefetch: 1,
                    dead_letter: None,
                },
            )
            .await?
    };
    let consumer = Arc::new(consumer);
    let _ = this.set(consumer.clone());
    let (_, first, _) = recv(&mut rx, "the first delivery").await?;
    ensure!(first.is_ok(), "the first ack answered {first:?}");
    ensure!(consumer.healthy().await, "healthy before any refusal");
    if !f.refuse_settlements(&name, 4) {
        consumer.stop().await;
        bail!("the backend declares a fault hook but refused to arm it");
    }
    queue
        .produce(&name, "job2", ProduceOptions::default())
        .await?;
    let (body, refused, healthy) = recv(&mut rx, "a delivery whose ack is refused").await?;
    ensure_eq!(
        body.as_str(),
        "job2",
        "the delivery after the refusals began"
    );
    ensure!(
        matches!(refused, Err(Error::Refused(_))),
        "the refused ack answered {refused:?}"
    );
    ensure_eq!(
        healthy,
        Some(false),
        "health right after a refused settlement"
    );
    // The message was handed back, never moved past: it comes again and its ack now lands.
    let (body, landed, healthy) = recv(&mut rx, "the message handed back").await?;
    ensure_eq!(body.as_str(), "job2", "the message handed back");
    ensure!(
        landed.is_ok(),
        "the ack after the refusals answered {landed:?}"
    );
    ensure_eq!(healthy, Some(true), "health once a settlement landed again");
    consumer.stop().await;
    Ok(())
}
