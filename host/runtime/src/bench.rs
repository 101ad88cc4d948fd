//! What a broker's native side of `wrpc-broker bench` is: the calls its adapter makes, made
//! directly with the broker's own client, so each bench row reads as a ratio component / native.
//! A driver offers one through [`crate::driver::Driver::native_bench`]; an operation a native
//! side does not have answers `None` (the row shows `-`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, broadcast};

/// The work of one half-round, the same on both sides.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Payload bytes of every message, entry and body.
    pub payload: Vec<u8>,
    /// How long the operation runs.
    pub slice: Duration,
}

/// Entries a catch-up read goes through.
pub const CATCH_UP: usize = 10_000;
/// Messages per queue round.
pub const QUEUE_BATCH: u64 = 1000;
/// Entries in one batch of the large-batch append row.
pub const APPEND_BATCH: usize = 1000;
/// Payloads published per fan-out round.
pub const FAN_OUT_PAYLOADS: u64 = 100;

/// The measurements of one side (component or native) of one operation.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Operations completed.
    pub ops: u64,
    /// Wall time they took.
    pub elapsed: Duration,
    /// Per-operation latencies (a subset is fine).
    pub latencies: Vec<Duration>,
}

impl Sample {
    /// Operations per second.
    pub fn rate(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q` quantile of the latencies (0.5 = median).
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.latencies.is_empty() {
            return None;
        }
        let mut sorted = self.latencies.clone();
        sorted.sort();
        let index = ((sorted.len() - 1) as f64 * q).round() as usize;
        Some(sorted[index])
    }

    /// Add another run of the same operation.
    pub fn merge(&mut self, other: Sample) {
        self.ops += other.ops;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
    }
}

/// What a native operation returns: its sample, or `None` when this side has no such row.
pub type BenchFuture<'a> =
    Pin<Box<dyn Future<Output = anyhow::Result<Option<Sample>>> + Send + 'a>>;

fn none<'a>() -> BenchFuture<'a> {
    Box::pin(async { Ok(None) })
}

/// A broker's native side: each bench operation done with its own client, issuing what its
/// adapter issues. Every method defaults to "no such row".
pub trait NativeBench: Send + Sync {
    /// Appends to one log, `in_flight` at a time.
    fn log_append<'a>(&'a self, work: &'a Workload, in_flight: usize) -> BenchFuture<'a> {
        let _ = (work, in_flight);
        none()
    }

    /// Appends batches of [`APPEND_BATCH`] entries to one log, one batch at a time.
    fn log_append_batch<'a>(&'a self, work: &'a Workload) -> BenchFuture<'a> {
        let _ = work;
        none()
    }

    /// Reads [`CATCH_UP`] entries from the start of a filled log, repeatedly.
    fn log_catch_up<'a>(&'a self, work: &'a Workload) -> BenchFuture<'a> {
        let _ = work;
        none()
    }

    /// Appends one entry and waits for a live reader to get it, repeatedly.
    fn log_live<'a>(&'a self, work: &'a Workload) -> BenchFuture<'a> {
        let _ = work;
        none()
    }

    /// Produces [`QUEUE_BATCH`] messages and consumes and acks them at `prefetch`, repeatedly.
    fn queue_round_trip<'a>(&'a self, work: &'a Workload, prefetch: u32) -> BenchFuture<'a> {
        let _ = (work, prefetch);
        none()
    }

    /// One request and its echoed reply, repeatedly.
    fn request_reply<'a>(&'a self, work: &'a Workload) -> BenchFuture<'a> {
        let _ = work;
        none()
    }

    /// Publishes [`FAN_OUT_PAYLOADS`] payloads to `subscribers` subscribers, repeatedly.
    fn fan_out<'a>(&'a self, work: &'a Workload, subscribers: usize) -> BenchFuture<'a> {
        let _ = (work, subscribers);
        none()
    }
}

/// A name no earlier bench run used (`bench-<prefix>-<uuid>`).
pub fn unique(prefix: &str) -> String {
    format!("bench-{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Run `op` repeatedly for `slice`, timing each; `op` returns the operations it did.
pub async fn timed<F, Fut>(slice: Duration, mut op: F) -> anyhow::Result<Sample>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<u64>>,
{
    let started = Instant::now();
    let mut sample = Sample::default();
    while started.elapsed() < slice {
        let t = Instant::now();
        sample.ops += op().await?;
        sample.latencies.push(t.elapsed());
    }
    sample.elapsed = started.elapsed();
    Ok(sample)
}

/// Implements [`NativeBench`] methods, inside an `impl NativeBench for T` block, by calling
/// `T`'s inherent async methods of the same names and arguments (after the workload), which
/// return `anyhow::Result<Sample>`: `native_bench_rows!(log_append(in_flight: usize), log_live());`
#[macro_export]
macro_rules! native_bench_rows {
    ($($name:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {$(
        fn $name<'a>(
            &'a self,
            work: &'a $crate::bench::Workload
            $(, $arg: $ty)*
        ) -> $crate::bench::BenchFuture<'a> {
            Box::pin(async move { Self::$name(self, work $(, $arg)*).await.map(Some) })
        }
    )*};
}

/// One in-flight worker of a bench: a spawned task returning the latency of each operation.
pub type Worker = tokio::task::JoinHandle<anyhow::Result<Vec<std::time::Duration>>>;

/// Join `workers` into one sample: every operation they did since `started`.
pub async fn joined(
    started: Instant,
    workers: impl IntoIterator<Item = Worker>,
) -> anyhow::Result<Sample> {
    let mut sample = Sample::default();
    for worker in futures::future::join_all(workers).await {
        let latencies = worker??;
        sample.ops += latencies.len() as u64;
        sample.latencies.extend(latencies);
    }
    sample.elapsed = started.elapsed();
    Ok(sample)
}

/// A count of deliveries that a round waits on: the deliverer that brings it to the round's
/// target wakes the round at once. (A round that looked every 200 µs slept in the timer's
/// millisecond ticks, up to a millisecond per round that the row then measured.)
#[derive(Debug)]
pub struct Tally {
    count: AtomicU64,
    /// What the waiting round needs; `u64::MAX` while none waits.
    target: AtomicU64,
    reached: Notify,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            count: AtomicU64::new(0),
            target: AtomicU64::new(u64::MAX),
            reached: Notify::new(),
        }
    }
}

impl Tally {
    /// Count `n` more deliveries.
    pub fn add(&self, n: u64) {
        let now = self.count.fetch_add(n, Ordering::SeqCst) + n;
        if now >= self.target.load(Ordering::SeqCst) {
            self.reached.notify_one();
        }
    }

    /// Deliveries so far.
    pub fn get(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Wait until the count reaches `target`, or `patience` has passed; the count then.
    pub async fn reach(&self, target: u64, patience: Duration) -> u64 {
        let deadline = tokio::time::Instant::now() + patience;
        self.target.store(target, Ordering::SeqCst);
        loop {
            let now = self.get();
            // A permit left by an earlier round only makes this look again.
            if now >= target
                || tokio::time::timeout_at(deadline, self.reached.notified())
                    .await
                    .is_err()
            {
                self.target.store(u64::MAX, Ordering::SeqCst);
                return self.get();
            }
        }
    }
}

/// One fan-out round: `publish` sends [`FAN_OUT_PAYLOADS`] payloads, then the round waits (10 s
/// at most) for `received` to grow by one per payload and subscriber; the deliveries that came
/// (what was lost, as at-most-once allows, is not counted).
pub async fn fan_out_round<Fut>(
    received: &Tally,
    subscribers: usize,
    publish: Fut,
) -> anyhow::Result<u64>
where
    Fut: Future<Output = anyhow::Result<()>>,
{
    let before = received.get();
    publish.await?;
    let target = before + FAN_OUT_PAYLOADS * subscribers as u64;
    Ok(received.reach(target, Duration::from_secs(10)).await - before)
}

/// Local fan-out as the host does it: what one broker subscription receives, handed to
/// `subscribers` local receivers through one broadcast channel, each counting its deliveries in
/// [`LocalFanOut::received`]. The native side of a many-subscriber backplane row.
pub struct LocalFanOut<T> {
    sender: broadcast::Sender<T>,
    received: Arc<Tally>,
    receivers: Vec<tokio::task::JoinHandle<()>>,
}

impl<T: Clone + Send + 'static> LocalFanOut<T> {
    /// `subscribers` receivers, each with the host's buffer of 4096 payloads.
    pub fn new(subscribers: usize) -> Self {
        let (sender, _) = broadcast::channel(4096);
        let received = Arc::new(Tally::default());
        let receivers = (0..subscribers)
            .map(|_| {
                let (mut rx, received) = (sender.subscribe(), received.clone());
                tokio::spawn(async move {
                    loop {
                        match rx.recv().await {
                            Ok(_) => received.add(1),
                            Err(broadcast::error::RecvError::Lagged(_)) => {}
                            Err(broadcast::error::RecvError::Closed) => break,
                        }
                    }
                })
            })
            .collect();
        Self {
            sender,
            received,
            receivers,
        }
    }

    /// Hand `payload` to every receiver.
    pub fn deliver(&self, payload: T) {
        let _ = self.sender.send(payload);
    }

    /// Deliveries so far, over all receivers.
    pub fn received(&self) -> &Arc<Tally> {
        &self.received
    }
}

/// The native side of a backplane row on a server: `deliveries` (one broker subscription's
/// payloads) handed to `subscribers` local receivers as the host does, while rounds of
/// `publish` (each sending [`FAN_OUT_PAYLOADS`] payloads) run for the workload's slice.
pub async fn shared_subscription<D, T, P, Fut>(
    work: &Workload,
    subscribers: usize,
    deliveries: D,
    mut publish: P,
) -> anyhow::Result<Sample>
where
    D: futures::Stream<Item = T> + Send + 'static,
    T: Clone + Send + 'static,
    P: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    use futures::StreamExt;
    let fan = Arc::new(LocalFanOut::new(subscribers));
    let listening = {
        let fan = fan.clone();
        tokio::spawn(async move {
            let mut deliveries = std::pin::pin!(deliveries);
            while let Some(payload) = deliveries.next().await {
                fan.deliver(payload);
            }
        })
    };
    let sample = timed(work.slice, || {
        fan_out_round(fan.received(), subscribers, publish())
    })
    .await;
    listening.abort();
    let mut sample = sample?;
    sample.latencies.clear();
    Ok(sample)
}

impl<T> Drop for LocalFanOut<T> {
    fn drop(&mut self) {
        for receiver in &self.receivers {
            receiver.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_round_wakes_when_its_deliveries_come_and_gives_up_after_its_patience() {
        let tally = Arc::new(Tally::default());
        // Rounds patient for an hour: one that missed its wake-up would hang, and the minute
        // runs out.
        let rounds = async {
            for round in 1..=200u64 {
                let adder = tally.clone();
                let deliveries = tokio::spawn(async move {
                    for _ in 0..10 {
                        adder.add(1);
                        tokio::task::yield_now().await;
                    }
                });
                let reached = tally.reach(round * 10, Duration::from_secs(3600)).await;
                assert!(reached >= round * 10, "round {round} woke at {reached}");
                deliveries.await.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(60), rounds)
            .await
            .expect("a round missed its wake-up");
        assert_eq!(tally.get(), 2000);
        let waited = Instant::now();
        assert_eq!(tally.reach(2001, Duration::from_millis(50)).await, 2000);
        assert!(waited.elapsed() >= Duration::from_millis(50));
    }
}
