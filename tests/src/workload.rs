//! The pieces of the under-load tests (hot swap, migration): consumers that record which
//! numbered messages they handled, and a reader that checks a feed of numbered entries arrives
//! 0, 1, 2, … with no gap.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use wrpc_broker::{ConsumeOptions, Consumer, Queue, Reader};

/// The numbers of the messages handled so far.
pub type Handled = Arc<Mutex<HashSet<usize>>>;

/// `count` consumers of `name` whose handler parses the body as a number, spends `work` on it
/// (none when zero) and records it.
pub async fn numbered_consumers(
    queue: &Queue,
    name: &str,
    count: usize,
    options: ConsumeOptions,
    work: Duration,
) -> anyhow::Result<(Vec<Consumer>, Handled)> {
    let handled: Handled = Arc::default();
    let mut consumers = Vec::new();
    for _ in 0..count {
        consumers.push(numbered_consumer(queue, name, &handled, options.clone(), work).await?);
    }
    Ok((consumers, handled))
}

/// One consumer of `name` like those of [`numbered_consumers`], recording into `handled` (which
/// consumers of other host instances may share).
pub async fn numbered_consumer(
    queue: &Queue,
    name: &str,
    handled: &Handled,
    options: ConsumeOptions,
    work: Duration,
) -> anyhow::Result<Consumer> {
    let handled = handled.clone();
    let handler = move |d: wrpc_broker::Delivery| {
        let handled = handled.clone();
        async move {
            let n: usize = String::from_utf8_lossy(&d.body).parse()?;
            if !work.is_zero() {
                tokio::time::sleep(work).await;
            }
            handled.lock().unwrap().insert(n);
            Ok(())
        }
    };
    Ok(queue.consume(name, handler, options).await?)
}

/// Follow `reader`, checking each entry is the next number; ends with how many were read once
/// the total sent on the returned channel was reached.
pub fn follow_in_order(
    mut reader: Reader,
) -> (
    watch::Sender<Option<usize>>,
    JoinHandle<anyhow::Result<usize>>,
) {
    let (total_tx, mut total_rx) = watch::channel(None::<usize>);
    let reading = tokio::spawn(async move {
        let mut next = 0usize;
        loop {
            if total_rx.borrow().is_some_and(|total| next == total) {
                return anyhow::Ok(next);
            }
            let entry = tokio::select! {
                entry = tokio::time::timeout(Duration::from_secs(30), reader.next_entry()) => entry,
                _ = total_rx.changed() => continue,
            };
            let entry = entry
                .with_context(|| format!("the reader stalled at entry {next}"))?
                .context("the reader ended")?
                .with_context(|| format!("the reader failed at entry {next}"))?;
            let n: usize = String::from_utf8_lossy(&entry.value).parse()?;
            ensure!(
                n == next,
                "the reader got entry {n} where {next} was due (gap or disorder)"
            );
            next += 1;
        }
    });
    (total_tx, reading)
}

/// Wait until `total` distinct messages were handled, for 60 s at most.
pub async fn until_all_handled(handled: &Handled, total: usize) -> anyhow::Result<()> {
    until_handled(handled, total, Duration::from_secs(60)).await
}

/// Wait until at least `count` distinct messages were handled, for `within` at most.
pub async fn until_handled(
    handled: &Handled,
    count: usize,
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while handled.lock().unwrap().len() < count {
        ensure!(
            Instant::now() < deadline,
            "{} of {count} messages handled within {within:?}",
            handled.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}
