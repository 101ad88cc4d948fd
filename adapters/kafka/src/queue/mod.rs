//! `wrpc:broker/queue` on topics and a consumer group: queue `q` is the topic `P.q.<enc>`
//! (`queue.partitions` partitions) consumed by the group `P.q.<enc>`, which also subscribes to
//! its delay-bucket topics `P.q.<enc>.retry.<ms>` (one partition each). A produce awaits every
//! delivery report (`acks=all`, idempotent). The consumer ([`consumer`]) commits only each
//! partition's settled prefix; retries are copies in the smallest bucket at least their delay,
//! held back by `x-wrpc-not-before`; a dead letter is a copy in the dead-letter queue's topic.
//! Depth is, over the main and bucket topics, each partition's high watermark less the
//! group's committed offset.

mod consumer;

use wit_bindgen::StreamReader;

use crate::exports::wrpc::broker::queue::{
    ConsumeOptions, ConsumerId, Delivery, Guest, Message, Settlement,
};
use crate::wrpc::kafka::client::{self, Outgoing};
use crate::{Component, Config, config, kafka_error, topics};
use consumer::KafkaConsumer;
use wrpc_broker_guest::{Error, Headers, Tag, headers, queue};

wrpc_broker_guest::queue_conversions!(crate::exports::wrpc::broker::queue);

/// The header holding when a retry copy may be delivered (ms since the Unix epoch).
pub(crate) const NOT_BEFORE: &str = "x-wrpc-not-before";

/// A queue's main topic (also its group) and its bucket topics.
pub(crate) struct Names {
    /// The main topic and the group.
    pub(crate) main: String,
    /// The bucket topics, by bucket (ascending).
    pub(crate) buckets: Vec<(u32, String)>,
}

impl Names {
    /// The names of `queue`.
    pub(crate) fn of(config: &Config, queue: &str) -> Result<Names, Error> {
        let main = config.topic("q", queue)?;
        let buckets = config
            .buckets
            .iter()
            .map(|b| (*b, format!("{main}.retry.{b}")))
            .collect();
        Ok(Names { main, buckets })
    }

    /// Every topic the group subscribes to.
    pub(crate) fn topics(&self) -> Vec<String> {
        std::iter::once(self.main.clone())
            .chain(self.buckets.iter().map(|(_, t)| t.clone()))
            .collect()
    }

    /// The bucket topic a retry after `delay_ms` goes to: the smallest at least the delay, or
    /// the largest.
    pub(crate) fn bucket(&self, delay_ms: u32) -> &str {
        self.buckets
            .iter()
            .find(|(b, _)| *b >= delay_ms)
            .or(self.buckets.last())
            .map_or(self.main.as_str(), |(_, t)| t.as_str())
    }

    /// Create the main topic and its buckets if missing.
    pub(crate) async fn ensure(&self, config: &Config) -> Result<(), Error> {
        let mut wanted = vec![(self.main.clone(), config.queue_partitions)];
        wanted.extend(self.buckets.iter().map(|(_, t)| (t.clone(), 1)));
        topics::ensure(config, &wanted, &[]).await
    }
}

/// Produce `body` to `topic` with `headers` and, when `attempt` is above 1, `x-wrpc-attempt`.
pub(crate) async fn put(
    topic: &str,
    headers: &Headers,
    attempt: u32,
    not_before: Option<u64>,
    body: &[u8],
) -> Result<(), Error> {
    let mut headers = headers.clone();
    if attempt > 1 {
        headers = headers::with_attempt(headers, attempt);
    }
    if let Some(at) = not_before {
        headers::set(&mut headers, NOT_BEFORE, at.to_string());
    }
    let record = Outgoing {
        topic: topic.to_string(),
        partition: None,
        key: None,
        value: body.to_vec(),
        headers,
    };
    client::produce(vec![record]).await.map_err(kafka_error)?;
    Ok(())
}

/// The messages of `topic` the group `group` has not committed past.
async fn lag(group: &str, topic: &str) -> Result<u64, Error> {
    let Some(described) = topics::describe(topic).await? else {
        return Ok(0);
    };
    let marks = client::watermarks(topic.to_string())
        .await
        .map_err(kafka_error)?;
    let committed = client::committed(group.to_string(), topic.to_string(), described.partitions)
        .await
        .map_err(kafka_error)?;
    Ok(marks
        .iter()
        .zip(committed.iter().chain(std::iter::repeat(&None)))
        .map(|(m, c)| m.high.saturating_sub(c.unwrap_or(m.low).max(m.low)))
        .sum())
}

impl Guest for Component {
    async fn produce(queue: String, batch: Vec<Message>) -> Result<(), Error> {
        let config = config()?;
        let names = Names::of(&config, &queue)?;
        names.ensure(&config).await?;
        // Spread round-robin from this instance's partition: a batch is shared by competing
        // consumers, and messages produced one at a time by one instance keep their order.
        let partitions = config.queue_partitions.max(1);
        let records = batch
            .into_iter()
            .enumerate()
            .map(|(i, m)| Outgoing {
                topic: names.main.clone(),
                partition: Some((config.home_partition + i as u32) % partitions),
                key: None,
                value: m.body,
                headers: m.headers,
            })
            .collect();
        client::produce(records).await.map_err(kafka_error)?;
        Ok(())
    }

    async fn consume(
        queue: String,
        opts: ConsumeOptions,
    ) -> Result<(ConsumerId, StreamReader<Delivery>), Error> {
        let config = config()?;
        let names = Names::of(&config, &queue)?;
        names.ensure(&config).await?;
        let dead = opts.dead_letter.unwrap_or_else(|| format!("{queue}.dead"));
        let dlq = config.topic("q", &dead)?;
        let consumer = KafkaConsumer::new(config.clone(), names, dlq);
        consumer.join().await?;
        let (tx, rx) = crate::wit_stream::new::<Delivery>();
        Ok((
            queue::start(consumer, opts.prefetch, config.generation, tx)?,
            rx,
        ))
    }

    wrpc_broker_guest::queue_forwarding_exports!();

    async fn depth(queue: String) -> Result<u64, Error> {
        let config = config()?;
        let names = Names::of(&config, &queue)?;
        let mut depth = 0;
        for topic in names.topics() {
            depth += lag(&names.main, &topic).await?;
        }
        Ok(depth)
    }
}
