//! `wrpc-broker migrate --from URL --to URL`: move a running host from one broker to another,
//! with live work, and print the migration's progress as it happens.
//!
//! The command is a host of its own: on the `--from` broker it runs the work an application
//! would (a producer, consumers, a log reader following a feed), migrates to the `--to` broker
//! halfway, prints each step (switched, consumers moved, queues drained, readers moved, old
//! adapter closed), and checks at the end that every message was handled and the reader saw
//! every entry of both feeds in order. An operator rehearses a move between two brokers with it
//! before an application host does the same through `Broker::migrate`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use wrpc_broker::{
    AppendOptions, Broker, BrokerBuilder, ConsumeOptions, MigrateOptions, MigrationEvent,
    ProduceOptions, ReadFrom,
};

/// What the command moves and how long it may take.
#[derive(Debug, Clone)]
pub struct MigrateConfig {
    /// The broker the host starts on.
    pub from: String,
    /// The broker it moves to.
    pub to: String,
    /// Queue messages produced over the run (half before the move).
    pub messages: usize,
    /// How long consumers may drain the old broker's queue.
    pub deadline: Duration,
}

/// The longest the command waits for the last messages and entries after the move.
const SETTLE_WAIT: Duration = Duration::from_secs(60);

/// The builder for `url`, in a namespace of its own on a server broker.
fn builder(url: &str, namespace: &str) -> anyhow::Result<BrokerBuilder> {
    Ok(Broker::builder().url(url)?.option("prefix", namespace))
}

/// Run the move and print its progress.
pub async fn run(config: &MigrateConfig) -> anyhow::Result<()> {
    let namespace = format!("mig-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let broker = builder(&config.from, &namespace)?
        .open()
        .await
        .with_context(|| format!("opening {}", config.from))?;
    let to = builder(&config.to, &namespace)?;
    println!(
        "Host on {} ({} adapter); moving to {} halfway through {} queue messages.",
        config.from,
        broker.info().name,
        config.to,
        config.messages
    );
    let (queue, log) = (broker.queue()?, broker.log()?);
    let name = "orders";

    let handled: Arc<Mutex<HashSet<usize>>> = Arc::default();
    let mut consumers = Vec::new();
    for _ in 0..2 {
        let handled = handled.clone();
        let handler = move |d: wrpc_broker::Delivery| {
            let handled = handled.clone();
            async move {
                let n: usize = String::from_utf8_lossy(&d.body).parse()?;
                handled.lock().unwrap_or_else(|e| e.into_inner()).insert(n);
                Ok(())
            }
        };
        consumers.push(
            queue
                .consume(name, handler, ConsumeOptions::default())
                .await?,
        );
    }
    // The reader follows the feed as it grows, as an application's would: 0, 1, 2, … in order.
    let mut reader = log.read(name, ReadFrom::Earliest).await?;
    let (read_tx, mut read) = tokio::sync::watch::channel(0usize);
    let reading = tokio::spawn(async move {
        let mut expected = 0usize;
        while let Some(entry) = reader.next_entry().await {
            let entry = entry.with_context(|| format!("the reader failed at entry {expected}"))?;
            let n: usize = String::from_utf8_lossy(&entry.value).parse()?;
            ensure!(
                n == expected,
                "the reader got entry {n} where {expected} was due"
            );
            expected += 1;
            let _ = read_tx.send(expected);
        }
        anyhow::Ok(())
    });

    // The work runs until the move is done and every message was produced.
    let moved = Arc::new(AtomicBool::new(false));
    let work = {
        let (queue, log, moved, messages) =
            (queue.clone(), log.clone(), moved.clone(), config.messages);
        tokio::spawn(async move {
            let mut appended = 0usize;
            for n in 0..messages {
                queue
                    .produce(name, n.to_string(), ProduceOptions::default())
                    .await
                    .with_context(|| format!("producing message {n}"))?;
                log.append(name, appended.to_string(), AppendOptions::default())
                    .await
                    .with_context(|| format!("appending entry {appended}"))?;
                appended += 1;
                while n + 1 == messages / 2 && !moved.load(Ordering::Relaxed) {
                    log.append(name, appended.to_string(), AppendOptions::default())
                        .await?;
                    appended += 1;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            anyhow::Ok(appended)
        })
    };
    while handled.lock().unwrap_or_else(|e| e.into_inner()).len() < config.messages / 4 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let (progress, mut events) = tokio::sync::mpsc::unbounded_channel();
    let printer = tokio::spawn(async move {
        let started = Instant::now();
        while let Some(event) = events.recv().await {
            let at = started.elapsed();
            match event {
                MigrationEvent::Switched {
                    from,
                    to,
                    generation,
                } => println!(
                    "  {at:>9.1?}  switched: every write goes to {to} (generation {generation}); {from} finishes what it has"
                ),
                MigrationEvent::ConsumersMoved { queues } => println!(
                    "  {at:>9.1?}  consumers moved: they consume on the new broker; {queues} drain the old one"
                ),
                MigrationEvent::QueueDrained(q) if q.drained => println!(
                    "  {at:>9.1?}  queue `{}` drained on the old broker in {:.1?}",
                    q.queue, q.took
                ),
                MigrationEvent::QueueDrained(q) => println!(
                    "  {at:>9.1?}  queue `{}` NOT drained by the deadline: {} messages left on the old broker",
                    q.queue, q.left
                ),
                MigrationEvent::ReadersMoved { moved, left } => println!(
                    "  {at:>9.1?}  readers moved: {moved} finished the old feed and follow the new one; {left} left behind"
                ),
                MigrationEvent::OldClosed => {
                    println!("  {at:>9.1?}  the old adapter is closed")
                }
            }
        }
    });
    let report = broker
        .migrate(
            to,
            MigrateOptions {
                deadline: config.deadline,
                progress: Some(progress),
            },
        )
        .await
        .with_context(|| format!("migrating to {}", config.to))?;
    moved.store(true, Ordering::Relaxed);
    let _ = printer.await;
    let appended = work.await.context("the work task")??;

    // Every message handled at least once; every entry of both feeds read in order.
    let deadline = Instant::now() + SETTLE_WAIT;
    while handled.lock().unwrap_or_else(|e| e.into_inner()).len() < config.messages {
        if Instant::now() > deadline {
            bail!(
                "{} of {} messages handled {SETTLE_WAIT:?} after the move",
                handled.lock().unwrap_or_else(|e| e.into_inner()).len(),
                config.messages
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all_read = tokio::time::timeout(SETTLE_WAIT, read.wait_for(|n| *n >= appended))
        .await
        .is_ok_and(|r| r.is_ok());
    if !all_read {
        reading.abort();
        match reading.await {
            Ok(Err(e)) => return Err(e),
            _ => bail!("the reader read {} of {appended} entries", *read.borrow()),
        }
    }
    reading.abort();
    for consumer in &consumers {
        consumer.stop().await;
    }
    println!(
        "Moved from {} to {} in {:.1?} (writes paused at most {:.1?} while switching); {} messages \
         handled, {appended} entries read in order across both feeds{}.",
        report.from,
        report.to,
        report.total,
        report.switched.saturating_sub(report.ready),
        config.messages,
        if report.complete() {
            String::new()
        } else {
            format!("; NOT complete: {report:?}")
        }
    );
    ensure!(report.complete(), "the migration left work behind");
    Ok(())
}
