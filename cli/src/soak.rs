//! `wrpc-broker soak`: every capability at load on one broker for a long time, with a hot swap
//! of the adapter every `--swap-every`, and (with `--chaos FILE`) a second host on a component
//! that traps now and then; every `--every` it prints RSS, open file descriptors, the
//! instances' memory, counts and errors. At the end it checks that nothing was lost: every
//! entry appended was read by a live reader in order, every message produced was handled, every
//! request was answered; it fails on any unexpected error.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::bench::scale::rss_bytes;
use wrpc_broker::{
    AppendOptions, Broker, ConsumeOptions, Error, ListenOptions, ProduceOptions, ReadFrom,
};

/// What to soak and for how long.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// The broker URL.
    pub broker: String,
    /// How long to run.
    pub duration: Duration,
    /// How often to print a line.
    pub every: Duration,
    /// How often to hot-swap the adapter.
    pub swap_every: Duration,
    /// A component that traps now and then (e.g. the memory adapter built with
    /// `chaos-trap-every-500`), run on its own memory store beside the main load.
    pub chaos: Option<std::path::PathBuf>,
}

/// Counters the workers update and the printer reads.
#[derive(Default)]
struct Counts {
    appended: AtomicU64,
    read: AtomicU64,
    produced: AtomicU64,
    handled: AtomicU64,
    published: AtomicU64,
    received: AtomicU64,
    replies: AtomicU64,
    swaps: AtomicU64,
    chaos_calls: AtomicU64,
    chaos_traps: AtomicU64,
    errors: AtomicU64,
}

impl Counts {
    fn error(&self, what: &str, e: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        eprintln!("soak: {what}: {e}");
    }
}

/// Run the soak and print its lines; an error when anything was lost or failed.
pub async fn run(config: &SoakConfig) -> anyhow::Result<()> {
    let broker = Broker::connect(&config.broker).await?;
    let wasm = wrpc_broker::drivers::embedded_adapter(&config.broker)
        .context("no embedded adapter for this broker")?
        .to_vec();
    let counts = Arc::new(Counts::default());
    let stop = Instant::now() + config.duration;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let mut workers = Vec::new();

    // Log: an appender and a live reader that must see every entry, in order.
    let (log, topic) = (broker.log()?, format!("soak-log-{tag}"));
    let mut reader = broker.log()?.read(&topic, ReadFrom::Latest).await?;
    workers.push(tokio::spawn({
        let (log, topic, counts) = (log.clone(), topic.clone(), counts.clone());
        async move {
            let mut n: u64 = 0;
            while Instant::now() < stop {
                let batch = (0..10)
                    .map(|i| ((n + i).to_be_bytes().to_vec(), AppendOptions::default()))
                    .collect();
                match log.append_batch(&topic, batch).await {
                    Ok(_) => {
                        n += 10;
                        counts.appended.fetch_add(10, Ordering::Relaxed);
                    }
                    Err(e) => counts.error("log append", e),
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            n
        }
    }));
    let reading = tokio::spawn({
        let counts = counts.clone();
        async move {
            let mut expected: u64 = 0;
            loop {
                let entry = tokio::time::timeout(Duration::from_secs(5), reader.next_entry()).await;
                match entry {
                    Ok(Some(Ok(entry))) => {
                        let got = u64::from_be_bytes(entry.value[..8].try_into().unwrap_or([0; 8]));
                        if got != expected {
                            counts
                                .error("log reader", format!("read #{got}, expected #{expected}"));
                            expected = got;
                        }
                        expected += 1;
                        counts.read.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Some(Err(e))) => counts.error("log reader", e),
                    Ok(None) => return expected,
                    Err(_) if Instant::now() > stop => return expected,
                    Err(_) => {}
                }
            }
        }
    });

    // Queue: a producer and a consumer that handles (acks) everything.
    let (queue, queue_name) = (broker.queue()?, format!("soak-queue-{tag}"));
    let consumer = queue
        .consume(
            &queue_name,
            {
                let counts = counts.clone();
                move |_delivery| {
                    counts.handled.fetch_add(1, Ordering::Relaxed);
                    async { Ok(()) }
                }
            },
            ConsumeOptions {
                prefetch: 64,
                dead_letter: None,
            },
        )
        .await?;
    workers.push(tokio::spawn({
        let (queue, name, counts) = (queue.clone(), queue_name.clone(), counts.clone());
        async move {
            while Instant::now() < stop {
                let batch = (0..20)
                    .map(|_| (b"job".to_vec(), ProduceOptions::default()))
                    .collect();
                match queue.produce_batch(&name, batch).await {
                    Ok(()) => {
                        counts.produced.fetch_add(20, Ordering::Relaxed);
                    }
                    Err(e) => counts.error("queue produce", e),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            0
        }
    }));

    // Backplane: a publisher and a subscriber (best effort: received is reported, not checked).
    let (backplane, channel) = (broker.backplane()?, format!("soak-room-{tag}"));
    let mut subscription = backplane.subscribe(&channel).await?;
    let receiving = tokio::spawn({
        let counts = counts.clone();
        async move {
            while let Some(_payload) = subscription.recv().await {
                counts.received.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    workers.push(tokio::spawn({
        let (backplane, channel, counts) = (backplane.clone(), channel.clone(), counts.clone());
        async move {
            while Instant::now() < stop {
                match backplane.publish(&channel, b"hello".to_vec()).await {
                    Ok(()) => {
                        counts.published.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => counts.error("backplane publish", e),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            0
        }
    }));

    // Direct: request/reply, every request must be answered.
    let address = format!("soak-rr-{tag}");
    let listener = broker
        .direct()?
        .listen(
            &address,
            |incoming| async move {
                incoming
                    .reply(incoming.packet.body.clone())
                    .await
                    .map_err(Into::into)
            },
            ListenOptions::default(),
        )
        .await?;
    workers.push(tokio::spawn({
        let (direct, address, counts) = (broker.direct()?, address.clone(), counts.clone());
        async move {
            while Instant::now() < stop {
                match direct
                    .request(&address, b"ping".to_vec(), Duration::from_secs(10))
                    .await
                {
                    Ok(_) => {
                        counts.replies.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => counts.error("direct request", e),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            0
        }
    }));

    // A trapping component beside it, on its own store.
    let chaos = match &config.chaos {
        Some(path) => Some(
            Broker::builder()
                .component_file(path)
                .memory_store(wrpc_broker::MemoryStore::new())
                .open()
                .await
                .with_context(|| format!("opening the chaos component {}", path.display()))?,
        ),
        None => None,
    };
    if let Some(chaos) = &chaos {
        let (log, counts) = (chaos.log()?, counts.clone());
        workers.push(tokio::spawn(async move {
            while Instant::now() < stop {
                match log
                    .append("chaos", b"x".to_vec(), AppendOptions::default())
                    .await
                {
                    Ok(_) => {
                        counts.chaos_calls.fetch_add(1, Ordering::Relaxed);
                    }
                    // The host retries a call its trap failed; one that still fails says so.
                    Err(Error::Trapped(_)) => {
                        counts.chaos_traps.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => counts.error("chaos append", e),
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            0
        }));
    }

    let started = Instant::now();
    let mut next_swap = started + config.swap_every;
    let mut next_print = started;
    println!("{}", header());
    while Instant::now() < stop {
        let now = Instant::now();
        if now >= next_swap {
            match broker.swap_bytes("soak swap", &wasm, [("", ""); 0]).await {
                Ok(_) => {
                    counts.swaps.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => counts.error("swap", e),
            }
            next_swap += config.swap_every;
        }
        if now >= next_print {
            println!("{}", line(started, &counts, &broker, chaos.as_ref()));
            next_print += config.every;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for worker in workers {
        worker.await?;
    }
    let read_to = reading.await?;
    // Let the consumer catch up with what it has left (a backlog is not a loss) while it makes
    // progress; 30 s without one ends the wait. Then stop everything.
    let produced = counts.produced.load(Ordering::Relaxed);
    let (mut last, mut progressed) = (counts.handled.load(Ordering::Relaxed), Instant::now());
    while last < produced && progressed.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = counts.handled.load(Ordering::Relaxed);
        if now > last {
            (last, progressed) = (now, Instant::now());
        }
    }
    consumer.stop().await;
    listener.stop().await;
    drop(backplane);
    receiving.abort();
    println!("{}", line(started, &counts, &broker, chaos.as_ref()));
    let (appended, handled) = (
        counts.appended.load(Ordering::Relaxed),
        counts.handled.load(Ordering::Relaxed),
    );
    let errors = counts.errors.load(Ordering::Relaxed);
    println!(
        "soak: {appended} appended, {read_to} read in order; {produced} produced, {handled} handled; \
         {} requests answered; {} swaps; chaos: {} calls answered, {} traps survived, {} calls \
         failed by a trap; {errors} errors",
        counts.replies.load(Ordering::Relaxed),
        counts.swaps.load(Ordering::Relaxed),
        counts.chaos_calls.load(Ordering::Relaxed),
        chaos
            .as_ref()
            .map_or(0, |c| c.adapter().generation().saturating_sub(1)),
        counts.chaos_traps.load(Ordering::Relaxed),
    );
    if errors > 0 || read_to != appended || handled < produced {
        bail!("the soak lost work or met errors (see above)");
    }
    Ok(())
}

fn header() -> String {
    format!(
        "{:>7} {:>9} {:>5} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>5} {:>11} {:>6}",
        "time",
        "RSS MiB",
        "fds",
        "wasm MiB",
        "appended",
        "read",
        "handled",
        "replies",
        "received",
        "swaps",
        "chaos traps",
        "errors"
    )
}

fn line(started: Instant, counts: &Counts, broker: &Broker, chaos: Option<&Broker>) -> String {
    let wasm = broker.adapter().memory_bytes() + chaos.map_or(0, |c| c.adapter().memory_bytes());
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    format!(
        "{:>6}s {:>9.1} {:>5} {:>9.1} {:>9} {:>9} {:>9} {:>8} {:>8} {:>5} {:>11} {:>6}",
        started.elapsed().as_secs(),
        rss_bytes() as f64 / (1 << 20) as f64,
        open_fds(),
        wasm as f64 / (1 << 20) as f64,
        load(&counts.appended),
        load(&counts.read),
        load(&counts.handled),
        load(&counts.replies),
        load(&counts.received),
        load(&counts.swaps),
        chaos.map_or(0, |c| c.adapter().generation().saturating_sub(1)),
        load(&counts.errors),
    )
}

/// Open file descriptors of the process (Linux `/proc/self/fd`), 0 elsewhere.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}
