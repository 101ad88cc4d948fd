//! The driver's rdkafka clients and its one-shot calls: configuration, produce with delivery
//! reports, topic admin, topic ids (DescribeTopics, which rdkafka does not wrap), watermarks,
//! a group's committed offsets and assign-mode readers. Blocking librdkafka calls run on the
//! blocking pool.

use std::ffi::{CStr, CString};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::bindings as rdsys;
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::KafkaDriver;
use crate::bindings::wit;
use crate::convert;

/// How long a metadata-like call may take.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait before asking again for a partition whose leader is not known yet.
const LEADER_WAIT: Duration = Duration::from_millis(50);
/// Records a reader's stream holds before its task waits for the guest to read.
const READER_BUFFER: usize = 1024;

/// `bootstrap.servers` of a `kafka://host:port[,host:port…]` URL.
pub fn bootstrap_servers(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("kafka://")
        .ok_or_else(|| format!("`{url}` is not a kafka:// URL"))?;
    let servers = rest.trim_end_matches('/');
    if servers.is_empty() || servers.contains('/') {
        return Err(format!("`{url}`: expected kafka://host:port[,host:port…]"));
    }
    Ok(servers.to_string())
}

/// The settings every client of the driver shares.
pub(crate) fn base_config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("client.id", "wrpc-broker")
        .set("socket.keepalive.enable", "true")
        .set("reconnect.backoff.max.ms", "1000")
        .set("topic.metadata.refresh.interval.ms", "5000")
        .set("log_level", "3");
    config
}

/// The idempotent, `acks=all` producer. It sends what it holds at once (`linger.ms=0`): a
/// batch arrives whole from the adapter, and what piles up while requests are in flight still
/// goes together (with 1 ms, every append waited out the linger: 1 in flight 1.8 → 0.48 ms p50).
pub(crate) fn producer(bootstrap: &str) -> Result<FutureProducer, String> {
    base_config(bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "0")
        .set("message.timeout.ms", "30000")
        .create()
        .map_err(|e| format!("cannot make a Kafka producer for {bootstrap}: {e}"))
}

/// The admin client.
pub(crate) fn admin(bootstrap: &str) -> Result<AdminClient<DefaultClientContext>, String> {
    base_config(bootstrap)
        .create()
        .map_err(|e| format!("cannot make a Kafka admin client for {bootstrap}: {e}"))
}

/// The settings of a consumer that fetches with low latency and never commits by itself.
pub(crate) fn consumer_config(bootstrap: &str, group: &str) -> ClientConfig {
    let mut config = base_config(bootstrap);
    config
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "10")
        .set("fetch.min.bytes", "1")
        .set("fetch.error.backoff.ms", "50")
        .set("topic.metadata.refresh.fast.interval.ms", "50")
        .set("retry.backoff.ms", "50")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("max.poll.interval.ms", "300000");
    config
}

/// Run a blocking librdkafka call on the blocking pool.
pub(crate) async fn blocking<R: Send + 'static>(
    call: impl FnOnce() -> Result<R, wit::KafkaError> + Send + 'static,
) -> Result<R, wit::KafkaError> {
    tokio::task::spawn_blocking(call)
        .await
        .unwrap_or_else(|e| Err(wit::KafkaError::Other(format!("a driver task failed: {e}"))))
}

impl KafkaDriver {
    /// Ask for the cluster's metadata (a cluster that is down answers `unavailable`).
    pub(crate) async fn ping(&self) -> Result<(), wit::KafkaError> {
        let driver = self.clone();
        blocking(move || {
            driver
                .shared
                .producer
                .client()
                .fetch_metadata(None, Duration::from_secs(5))
                .map(|_| ())
                .map_err(convert::error)
        })
        .await
    }

    /// Produce `records` in order and await every delivery report.
    pub(crate) async fn produce(
        &self,
        records: Vec<wit::Outgoing>,
    ) -> Result<Vec<wit::Delivered>, wit::KafkaError> {
        let producer = &self.shared.producer;
        let mut reports = Vec::with_capacity(records.len());
        for r in &records {
            let mut record = FutureRecord::<[u8], [u8]>::to(&r.topic)
                .payload(&r.value)
                .headers(convert::headers_out(&r.headers));
            if let Some(key) = &r.key {
                record = record.key(key);
            }
            if let Some(p) = r.partition {
                record = record.partition(convert::partition(p)?);
            }
            loop {
                match producer.send_result(record) {
                    Ok(report) => {
                        reports.push(report);
                        break;
                    }
                    Err((e, back))
                        if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) =>
                    {
                        record = back;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => return Err(convert::error(e)),
                }
            }
        }
        let mut delivered = Vec::with_capacity(reports.len());
        for report in reports {
            match report.await {
                Ok(Ok(d)) => delivered.push(wit::Delivered {
                    partition: u32::try_from(d.partition).unwrap_or(0),
                    offset: u64::try_from(d.offset).unwrap_or(0),
                }),
                Ok(Err((e, _))) => return Err(convert::error(e)),
                Err(_) => return Err(wit::KafkaError::Unavailable("the producer closed".into())),
            }
        }
        Ok(delivered)
    }

    /// Create `topics`; one that exists already is fine.
    pub(crate) async fn create_topics(
        &self,
        topics: Vec<(String, u32)>,
        replication: u32,
        configs: Vec<(String, String)>,
    ) -> Result<(), wit::KafkaError> {
        let replication = i32::try_from(replication.max(1)).unwrap_or(1);
        let mut new = Vec::with_capacity(topics.len());
        for (name, partitions) in &topics {
            let mut topic = NewTopic::new(
                name,
                convert::partition((*partitions).max(1))?,
                TopicReplication::Fixed(replication),
            );
            for (k, v) in &configs {
                topic = topic.set(k, v);
            }
            new.push(topic);
        }
        let options = AdminOptions::new().operation_timeout(Some(CALL_TIMEOUT));
        let answers = self
            .shared
            .admin
            .create_topics(new.iter(), &options)
            .await
            .map_err(convert::error)?;
        for answer in answers {
            match answer {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(convert::error(KafkaError::AdminOp(code)).with_topic(&name));
                }
            }
        }
        Ok(())
    }

    /// Delete `topic`; a missing one is fine.
    pub(crate) async fn delete_topic(&self, topic: String) -> Result<(), wit::KafkaError> {
        let options = AdminOptions::new().operation_timeout(Some(CALL_TIMEOUT));
        let answers = self
            .shared
            .admin
            .delete_topics(&[topic.as_str()], &options)
            .await
            .map_err(convert::error)?;
        for answer in answers {
            match answer {
                Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
                Err((name, code)) => {
                    return Err(convert::error(KafkaError::AdminOp(code)).with_topic(&name));
                }
            }
        }
        Ok(())
    }

    /// The id and partition count of `topic`; none when it does not exist.
    pub(crate) async fn describe_topic(
        &self,
        topic: String,
    ) -> Result<Option<wit::TopicInfo>, wit::KafkaError> {
        let driver = self.clone();
        blocking(move || {
            let name = CString::new(topic)
                .map_err(|_| wit::KafkaError::BadRequest("a topic name with NUL".into()))?;
            let rk = driver.shared.producer.client().native_ptr();
            // SAFETY: `rk` lives as long as the producer (held by `driver`); every object made
            // here is destroyed before returning, and the strings read are copied first.
            unsafe { describe(rk, &name) }
        })
        .await
    }

    /// Every partition's watermarks.
    ///
    /// A partition whose leader is not known yet (a topic created a moment ago, a leader being
    /// elected) is asked again until [`CALL_TIMEOUT`] has passed.
    pub(crate) async fn watermarks(
        &self,
        topic: String,
    ) -> Result<Vec<wit::Marks>, wit::KafkaError> {
        let driver = self.clone();
        blocking(move || {
            watermarks_waiting(driver.shared.producer.client(), &topic)
                .map_err(|e| convert::error(e).with_topic(&topic))
        })
        .await
    }

    /// The offsets `group` committed on each of `partitions` partitions of `topic`.
    pub(crate) async fn committed(
        &self,
        group: String,
        topic: String,
        partitions: u32,
    ) -> Result<Vec<Option<u64>>, wit::KafkaError> {
        let bootstrap = self.shared.bootstrap.clone();
        blocking(move || {
            let consumer: BaseConsumer = consumer_config(&bootstrap, &group)
                .create()
                .map_err(convert::error)?;
            let mut list = TopicPartitionList::new();
            for p in 0..partitions {
                list.add_partition(&topic, convert::partition(p)?);
            }
            let offsets = consumer
                .committed_offsets(list, CALL_TIMEOUT)
                .map_err(convert::error)?;
            Ok((0..partitions)
                .map(|p| {
                    let at = offsets.find_partition(&topic, i32::try_from(p).unwrap_or(0));
                    match at.map(|e| e.offset()) {
                        Some(Offset::Offset(o)) => u64::try_from(o).ok(),
                        _ => None,
                    }
                })
                .collect())
        })
        .await
    }

    /// An assign-mode reader of `topic` at `starts`, feeding `tx` until it fails or `tx` closes.
    pub(crate) async fn read(
        &self,
        topic: String,
        starts: Vec<(u32, u64)>,
    ) -> Result<mpsc::Receiver<wit::Incoming>, wit::KafkaError> {
        let mut config = consumer_config(&self.shared.bootstrap, "wrpc-readers");
        config.set("auto.offset.reset", "error");
        let consumer: StreamConsumer = config.create().map_err(convert::error)?;
        let mut list = TopicPartitionList::new();
        for (p, o) in &starts {
            list.add_partition_offset(
                &topic,
                convert::partition(*p)?,
                Offset::Offset(convert::offset(*o)?),
            )
            .map_err(convert::error)?;
        }
        consumer.assign(&list).map_err(convert::error)?;
        let (tx, rx) = mpsc::channel(READER_BUFFER);
        tokio::spawn(async move {
            {
                let mut records = consumer.stream();
                loop {
                    let next = tokio::select! {
                        next = records.next() => next,
                        () = tx.closed() => break,
                    };
                    match next {
                        Some(Ok(m)) => {
                            if tx.send(convert::incoming(&m)).await.is_err() {
                                break;
                            }
                        }
                        Some(Err(e)) => {
                            tracing::debug!(%topic, "kafka: reader ended: {e}");
                            break;
                        }
                        None => break,
                    }
                }
            }
            let _ = tokio::task::spawn_blocking(move || drop(consumer)).await;
        });
        Ok(rx)
    }
}

impl wit::KafkaError {
    /// The same error, naming `topic`.
    fn with_topic(self, topic: &str) -> Self {
        use wit::KafkaError as E;
        match self {
            E::Unavailable(m) => E::Unavailable(format!("{topic}: {m}")),
            E::UnknownTopic(m) => E::UnknownTopic(format!("{topic}: {m}")),
            E::OutOfRange(m) => E::OutOfRange(format!("{topic}: {m}")),
            E::BadRequest(m) => E::BadRequest(format!("{topic}: {m}")),
            E::Refused(m) => E::Refused(format!("{topic}: {m}")),
            E::Stale(m) => E::Stale(format!("{topic}: {m}")),
            E::Other(m) => E::Other(format!("{topic}: {m}")),
        }
    }
}

/// Every partition's watermarks of `topic` (blocking), asked again every [`LEADER_WAIT`] while
/// a partition's leader is not known yet, until [`CALL_TIMEOUT`] has passed. The native side of
/// the bench asks through it too: a topic it created a moment ago is in the same state.
pub(crate) fn watermarks_waiting<C: rdkafka::client::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
) -> Result<Vec<wit::Marks>, KafkaError> {
    let deadline = Instant::now() + CALL_TIMEOUT;
    loop {
        match watermarks_once(client, topic) {
            Err(e) if convert::leader_unknown(&e) && Instant::now() < deadline => {
                std::thread::sleep(LEADER_WAIT);
            }
            answer => return answer,
        }
    }
}

/// Every partition's watermarks of `topic`, asked once.
fn watermarks_once<C: rdkafka::client::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
) -> Result<Vec<wit::Marks>, KafkaError> {
    let metadata = client.fetch_metadata(Some(topic), CALL_TIMEOUT)?;
    let Some(t) = metadata.topics().first() else {
        return Err(KafkaError::MetadataFetch(
            RDKafkaErrorCode::UnknownTopicOrPartition,
        ));
    };
    if let Some(e) = t.error() {
        return Err(KafkaError::MetadataFetch(e.into()));
    }
    let mut marks = Vec::with_capacity(t.partitions().len());
    for p in 0..t.partitions().len() {
        let p = i32::try_from(p).unwrap_or(i32::MAX);
        let (low, high) = client.fetch_watermarks(topic, p, CALL_TIMEOUT)?;
        marks.push(wit::Marks {
            low: u64::try_from(low).unwrap_or(0),
            high: u64::try_from(high).unwrap_or(0),
        });
    }
    Ok(marks)
}

/// DescribeTopics for one topic on client `rk`: its id (base64) and partition count.
///
/// # Safety
/// `rk` must be a live client handle for the whole call.
unsafe fn describe(
    rk: *mut rdsys::rd_kafka_t,
    name: &CStr,
) -> Result<Option<wit::TopicInfo>, wit::KafkaError> {
    let timeout_ms = i32::try_from(CALL_TIMEOUT.as_millis()).unwrap_or(10_000);
    // SAFETY: the caller keeps `rk` alive; each object is destroyed once, after its last use.
    unsafe {
        let mut names = [name.as_ptr()];
        let topics = rdsys::rd_kafka_TopicCollection_of_topic_names(names.as_mut_ptr(), 1);
        let queue = rdsys::rd_kafka_queue_new(rk);
        rdsys::rd_kafka_DescribeTopics(rk, topics, std::ptr::null(), queue);
        let event = rdsys::rd_kafka_queue_poll(queue, timeout_ms);
        let answer = if event.is_null() {
            Err(wit::KafkaError::Unavailable(format!(
                "DescribeTopics did not answer within {CALL_TIMEOUT:?}"
            )))
        } else {
            let answer = described(event);
            rdsys::rd_kafka_event_destroy(event);
            answer
        };
        rdsys::rd_kafka_queue_destroy(queue);
        rdsys::rd_kafka_TopicCollection_destroy(topics);
        answer
    }
}

/// What a DescribeTopics result event says of its one topic.
///
/// # Safety
/// `event` must be a live DescribeTopics result event.
unsafe fn described(
    event: *mut rdsys::rd_kafka_event_t,
) -> Result<Option<wit::TopicInfo>, wit::KafkaError> {
    // SAFETY: `event` is live; the pointers read from it live as long as it does.
    unsafe {
        let code = rdsys::rd_kafka_event_error(event);
        if code != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            let text = CStr::from_ptr(rdsys::rd_kafka_event_error_string(event));
            return Err(convert::error(KafkaError::AdminOp(code.into()))
                .with_topic(&text.to_string_lossy()));
        }
        let result = rdsys::rd_kafka_event_DescribeTopics_result(event);
        let mut count = 0usize;
        let descriptions = rdsys::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        if count == 0 {
            return Ok(None);
        }
        let description = *descriptions;
        let error = rdsys::rd_kafka_TopicDescription_error(description);
        if !error.is_null() {
            let code = rdsys::rd_kafka_error_code(error);
            if code == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART {
                return Ok(None);
            }
            let text = CStr::from_ptr(rdsys::rd_kafka_error_string(error));
            return Err(wit::KafkaError::Other(text.to_string_lossy().into_owned()));
        }
        let id = rdsys::rd_kafka_TopicDescription_topic_id(description);
        let id = CStr::from_ptr(rdsys::rd_kafka_Uuid_base64str(id))
            .to_string_lossy()
            .into_owned();
        let mut partitions = 0usize;
        rdsys::rd_kafka_TopicDescription_partitions(description, &mut partitions);
        Ok(Some(wit::TopicInfo {
            id,
            partitions: u32::try_from(partitions).unwrap_or(u32::MAX),
        }))
    }
}
