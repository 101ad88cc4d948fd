//! Queue contracts of consumers: competing consumers share the work, prefetch bounds
//! what is in flight, and a stopped consumer's unsettled work reaches another.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use wrpc_broker::{ConsumeOptions, Delivery, ProduceOptions};

use super::{produce_n, raw_consumer, recorder, text, until_seen, working_recorder};
use crate::support::{ARRIVAL, SILENCE, recv, unique};
use crate::{Factory, ensure_eq};

pub(super) async fn competing_consumers_on_two_instances_share_the_work(
    f: Factory,
) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let name = unique("shared");
    // Handling takes a little time, as work does: one consumer alone needs 400 / 8 × 5 ms =
    // 250 ms, so the other one (woken by the same produce) gets some even if a loaded machine
    // schedules it late. With instant handlers one consumer could drain the queue before the
    // other ran at all, which says nothing about the adapter.
    let work = Duration::from_millis(5);
    let (ca, seen_a, _) = working_recorder(&a.queue()?, &name, 8, work).await?;
    let (cb, seen_b, _) = working_recorder(&b.queue()?, &name, 8, work).await?;
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

pub(super) async fn prefetch_bounds_unsettled_deliveries_handled_concurrently(
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

pub(super) async fn a_stopped_consumer_hands_unsettled_work_to_another(
    f: Factory,
) -> anyhow::Result<()> {
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

pub(super) async fn a_thousand_messages_with_random_failures_all_handled(
    f: Factory,
) -> anyhow::Result<()> {
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

/// A handler that runs five times the visibility keeps its delivery (the adapter extends what
/// it holds): a competing consumer on another instance never gets a duplicate.
pub(super) async fn a_long_handler_keeps_its_delivery_past_the_visibility(
    f: Factory,
) -> anyhow::Result<()> {
    const VISIBILITY_MS: u64 = 300;
    let visibility = VISIBILITY_MS.to_string();
    let options = [("queue.visibilityMs", visibility.as_str())];
    let (a, b) = (
        f.instance_with(&options).await?,
        f.instance_with(&options).await?,
    );
    let name = unique("long");
    let runs: Arc<Mutex<Vec<(&'static str, u32)>>> = Arc::default();
    let mut consumers = Vec::new();
    for (who, broker) in [("a", &a), ("b", &b)] {
        let runs = runs.clone();
        let handler = move |d: Delivery| {
            let runs = runs.clone();
            async move {
                runs.lock().unwrap().push((who, d.attempt));
                tokio::time::sleep(Duration::from_millis(5 * VISIBILITY_MS)).await;
                Ok(())
            }
        };
        let options = ConsumeOptions {
            prefetch: 1,
            dead_letter: None,
        };
        consumers.push(broker.queue()?.consume(&name, handler, options).await?);
    }
    a.queue()?
        .produce(&name, "slow", ProduceOptions::default())
        .await?;
    tokio::time::sleep(Duration::from_millis(8 * VISIBILITY_MS)).await;
    for consumer in &consumers {
        consumer.stop().await;
    }
    let runs = runs.lock().unwrap().clone();
    ensure!(
        runs.len() == 1 && runs[0].1 == 1,
        "a message whose handler ran {} ms with a visibility of {VISIBILITY_MS} ms ran once, \
         on attempt 1: {runs:?}",
        5 * VISIBILITY_MS
    );
    Ok(())
}
