//! Queue contracts of settlement: retry, release, dead-letter, handler failures, the
//! first settlement winning, and refused settlements.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use tokio::sync::mpsc;
use wrpc_broker::bindings::queue::Settlement;
use wrpc_broker::{ConsumeOptions, Delivery, Error, ProduceOptions, Queue, Settled};

use super::{raw_consumer, text};
use crate::support::{SILENCE, recv, unique};
use crate::{Factory, ensure_eq};

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

pub(super) async fn retry_redelivers_after_the_delay_with_attempt_plus_one(
    f: Factory,
) -> anyhow::Result<()> {
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

pub(super) async fn release_puts_back_now_with_the_same_attempt(f: Factory) -> anyhow::Result<()> {
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

pub(super) async fn dead_letter_moves_with_reason_and_attempt(f: Factory) -> anyhow::Result<()> {
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

pub(super) async fn a_failing_handler_is_retried_with_backoff_never_released(
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

pub(super) async fn the_first_settlement_wins(f: Factory) -> anyhow::Result<()> {
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

pub(super) async fn the_adapter_refuses_a_second_settlement_of_one_tag(
    f: Factory,
) -> anyhow::Result<()> {
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

pub(super) async fn refused_settlements_hand_the_message_back_and_mark_unhealthy(
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
