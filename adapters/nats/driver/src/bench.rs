//! The native side for NATS: what the NATS adapter sends, sent directly with `async-nats`:
//! JetStream publishes acknowledged by the server for the log, a work-queue stream with a pull
//! consumer (`$JS.API.CONSUMER.MSG.NEXT`, `+ACK` awaited) for the queue, the adapter's direct
//! sends (a PUB and a marker PUB, the marker awaited: nobody subscribed is told) both ways for
//! request/reply, and core PUB/SUB for the backplane. Log reads as the adapter's: pages of
//! stream info plus pipelined direct gets for a catch-up, an ephemeral push consumer for a live
//! tail.

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use futures::stream::FuturesOrdered;
use futures::{FutureExt as _, StreamExt};
use wrpc_broker_runtime::pages::PageSize;

use crate::checked::Checked;

use wrpc_broker_runtime::bench::{
    APPEND_BATCH, CATCH_UP, FAN_OUT_PAYLOADS, NativeBench, QUEUE_BATCH, Sample, Workload, joined,
    shared_subscription, timed, unique,
};

/// Direct gets in one window of the adapter's page (`adapters/nats/src/log.rs`).
const GETS_IN_FLIGHT: u64 = 64;
/// How many windows (of gets or publishes) the adapter has out at once.
const WINDOWS_IN_FLIGHT: usize = 2;
/// Stored publishes in one window of the adapter's batch (`adapters/nats/src/js.rs`).
const PUBLISHES_IN_FLIGHT: usize = 256;

/// A client of the NATS server the broker uses.
pub struct Native {
    client: async_nats::Client,
}

/// A stream name and subject that NATS accepts.
fn stream_name(prefix: &str) -> String {
    unique(prefix).replace('-', "_")
}

/// One stored publish with `headers`, its PubAck checked; `false` when JetStream refused it
/// because the stream's last message was not the one its `Nats-Expected-Last-Msg-Id` names.
async fn stored(
    client: &async_nats::Client,
    subject: &str,
    headers: async_nats::HeaderMap,
    payload: &[u8],
) -> anyhow::Result<bool> {
    let request = async_nats::Request::new()
        .headers(headers)
        .payload(payload.to_vec().into());
    let ack = client.send_request(subject.to_string(), request).await?;
    let text = String::from_utf8_lossy(&ack.payload);
    if text.contains("\"err_code\":10070") {
        return Ok(false);
    }
    ensure!(!text.contains("\"error\""), "publish to {subject}: {text}");
    Ok(true)
}

/// Join `requests`, sent in the order given as the driver's `request-all` sends them: out of
/// the reach of tokio's cooperative budget, which would yield part-way and poll the rest in
/// another order.
fn sent_in_order<F: Future>(
    requests: impl IntoIterator<Item = F>,
) -> impl Future<Output = Vec<F::Output>> {
    tokio::task::unconstrained(futures::future::join_all(requests))
}

/// What the adapter sends with an append: a `Nats-Msg-Id` of its own (a resend is stored once)
/// and `Nats-Expected-Stream`; with `after`, `Nats-Expected-Last-Msg-Id` (the message before it
/// in a pipelined batch).
fn append_headers(stream: &str, id: &str, after: Option<&str>) -> async_nats::HeaderMap {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", id);
    headers.insert("Nats-Expected-Stream", stream);
    if let Some(after) = after {
        headers.insert("Nats-Expected-Last-Msg-Id", after);
    }
    headers
}

/// The headers naming a direct packet's reply address and correlation id (the adapter's
/// `codec::REPLY_TO` and `codec::CORRELATION_ID`).
const REPLY_TO: &str = "x-wrpc-reply-to";
const CORRELATION_ID: &str = "x-wrpc-correlation-id";

/// A direct send as the NATS adapter makes one: the driver's checked publish (`checked.rs`), a
/// PUB with a reply subject of the sender's own and a marker PUB, the marker awaited on the
/// sender's one wildcard subscription (a 503 before it means nobody took the packet).
struct Sender {
    client: async_nats::Client,
    checked: Checked,
}

impl Sender {
    fn new(client: &async_nats::Client) -> Self {
        Self {
            client: client.clone(),
            checked: Checked::default(),
        }
    }

    /// Send `payload` to `subject`; an error when nobody subscribes to it.
    async fn send(
        &mut self,
        subject: &str,
        headers: async_nats::HeaderMap,
        payload: &[u8],
    ) -> anyhow::Result<()> {
        self.checked
            .publish(
                &self.client,
                subject.to_string(),
                headers,
                payload.to_vec().into(),
                Duration::from_secs(5),
            )
            .await
            .map_err(|e| anyhow::anyhow!("send to {subject}: {e:?}"))
    }
}

impl Native {
    /// Connect to `url`.
    pub async fn new(url: &str) -> anyhow::Result<Self> {
        Ok(Self {
            client: async_nats::connect(url).await?,
        })
    }

    async fn api(&self, subject: String, body: String) -> anyhow::Result<()> {
        let reply = self.client.request(subject.clone(), body.into()).await?;
        let text = String::from_utf8_lossy(&reply.payload);
        ensure!(!text.contains("\"error\""), "{subject}: {text}");
        Ok(())
    }

    /// A file stream `name` on subject `{name}.in`; a `limits` one (a log) allows direct gets,
    /// as the adapter's log streams do.
    async fn create_stream(&self, name: &str, retention: &str) -> anyhow::Result<()> {
        let direct = retention == "limits";
        self.api(
            format!("$JS.API.STREAM.CREATE.{name}"),
            format!(r#"{{"name":"{name}","subjects":["{name}.in"],"retention":"{retention}","max_msgs":10000,"storage":"file","allow_direct":{direct}}}"#),
        )
        .await
    }

    async fn delete_stream(&self, name: &str) -> anyhow::Result<()> {
        self.api(format!("$JS.API.STREAM.DELETE.{name}"), String::new())
            .await
    }

    pub async fn log_append(&self, work: &Workload, in_flight: usize) -> anyhow::Result<Sample> {
        let name = stream_name("native_append");
        self.create_stream(&name, "limits").await?;
        let deadline = Instant::now() + work.slice;
        let started = Instant::now();
        let workers = (0..in_flight).map(|worker| {
            let (client, name, payload) = (self.client.clone(), name.clone(), work.payload.clone());
            tokio::spawn(async move {
                let subject = format!("{name}.in");
                let mut latencies = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let id = format!("{worker}-{}", latencies.len());
                    let headers = append_headers(&name, &id, None);
                    ensure!(
                        stored(&client, &subject, headers, &payload).await?,
                        "refused"
                    );
                    latencies.push(t.elapsed());
                }
                anyhow::Ok(latencies)
            })
        });
        let sample = joined(started, workers).await?;
        self.delete_stream(&name).await?;
        Ok(sample)
    }

    /// `count` stored publishes of `payload` to stream `name`, as the adapter sends a batch:
    /// pipelined in windows of [`PUBLISHES_IN_FLIGHT`], [`WINDOWS_IN_FLIGHT`] windows at once,
    /// each message but a run's first expecting the one before it as the stream's last, a new
    /// run from the first refused. `batch` makes the message ids unique in the stream.
    async fn publish_batch(
        &self,
        name: &str,
        batch: usize,
        count: usize,
        payload: &[u8],
    ) -> anyhow::Result<()> {
        let subject = format!("{name}.in");
        let ids: Vec<String> = (0..count).map(|i| format!("{batch}-{i}")).collect();
        let (ids, subject) = (&ids, &subject);
        let window = |run: usize, from: usize, to: usize| {
            let sends = (from..to).map(move |i| {
                let after = (i > run).then(|| ids[i - 1].as_str());
                stored(
                    &self.client,
                    subject,
                    append_headers(name, &ids[i], after),
                    payload,
                )
            });
            sent_in_order(sends)
        };
        let mut done = 0;
        'runs: while done < count {
            let run = done;
            let mut sent = run;
            let mut windows = FuturesOrdered::new();
            loop {
                while sent < count && windows.len() < WINDOWS_IN_FLIGHT {
                    let to = (sent + PUBLISHES_IN_FLIGHT).min(count);
                    windows.push_back(window(run, sent, to));
                    sent = to;
                }
                let Some(answers) = windows.next().await else {
                    break 'runs;
                };
                for stored in answers {
                    if !stored? {
                        continue 'runs;
                    }
                    done += 1;
                }
            }
        }
        Ok(())
    }

    /// Batches of [`APPEND_BATCH`], one at a time, as the adapter sends one.
    pub async fn log_append_batch(&self, work: &Workload) -> anyhow::Result<Sample> {
        let name = stream_name("native_batch");
        self.create_stream(&name, "limits").await?;
        let mut batches = 0;
        let sample = timed(work.slice, || {
            batches += 1;
            let (name, batch) = (&name, batches);
            async move {
                self.publish_batch(name, batch, APPEND_BATCH, &work.payload)
                    .await?;
                Ok(APPEND_BATCH as u64)
            }
        })
        .await;
        self.delete_stream(&name).await?;
        sample
    }

    /// Fill a log stream with [`CATCH_UP`] entries, pipelined as the adapter's batch appends.
    async fn filled(&self, name: &str, work: &Workload) -> anyhow::Result<()> {
        self.create_stream(name, "limits").await?;
        for _ in 0..CATCH_UP / 250 {
            let appends = (0..250).map(|_| {
                self.client
                    .request(format!("{name}.in"), work.payload.clone().into())
            });
            for result in futures::future::join_all(appends).await {
                let ack = result?;
                let text = String::from_utf8_lossy(&ack.payload);
                ensure!(!text.contains("\"error\""), "append to {name}: {text}");
            }
        }
        Ok(())
    }

    /// What the adapter's `range` sends for a page of `limit` entries from `first`: the stream's
    /// info, then one direct get per sequence, in windows of [`GETS_IN_FLIGHT`],
    /// [`WINDOWS_IN_FLIGHT`] windows at once.
    async fn page(&self, name: &str, first: u64, limit: u32) -> anyhow::Result<u64> {
        self.api(format!("$JS.API.STREAM.INFO.{name}"), String::new())
            .await?;
        let subject = format!("$JS.API.DIRECT.GET.{name}");
        let end = first + u64::from(limit);
        let mut windows = FuturesOrdered::new();
        let mut seq = first;
        loop {
            while seq < end && windows.len() < WINDOWS_IN_FLIGHT {
                let last = (seq + GETS_IN_FLIGHT).min(end);
                let gets = (seq..last).map(|s| {
                    self.client
                        .request(subject.clone(), format!(r#"{{"seq":{s}}}"#).into())
                });
                windows.push_back(sent_in_order(gets).map(move |got| (seq, got)));
                seq = last;
            }
            let Some((window, answers)) = windows.next().await else {
                return Ok(u64::from(limit));
            };
            for (at, got) in (window..).zip(answers) {
                let message = got?;
                if let Some(status) = message.status {
                    // Past the last sequence (404): the page is short.
                    ensure!(
                        status.as_u16() == 404,
                        "direct get: {status} {:?}",
                        message.description
                    );
                    return Ok(at - first);
                }
            }
        }
    }

    pub async fn log_catch_up(&self, work: &Workload) -> anyhow::Result<Sample> {
        let name = stream_name("native_catchup");
        self.filled(&name, work).await?;
        let sample = timed(work.slice, || async {
            let (mut read, mut size) = (0, PageSize::default());
            while read < CATCH_UP as u64 {
                let got = self.page(&name, read + 1, size.limit()).await?;
                ensure!(got > 0, "{name}: {read} entries, {CATCH_UP} appended");
                read += got;
                // The host sizes pages by their entries' bytes: a payload each here.
                size.after_page(got as usize, got as usize * work.payload.len());
            }
            Ok(read)
        })
        .await;
        self.delete_stream(&name).await?;
        sample
    }

    pub async fn log_live(&self, work: &Workload) -> anyhow::Result<Sample> {
        // The adapter's tail: an ephemeral push consumer (ack none, memory state) on an inbox.
        let name = stream_name("native_live");
        self.create_stream(&name, "limits").await?;
        let inbox = self.client.new_inbox();
        let mut deliveries = self.client.subscribe(inbox.clone()).await?;
        self.api(
            format!("$JS.API.CONSUMER.CREATE.{name}"),
            format!(r#"{{"stream_name":"{name}","config":{{"deliver_policy":"new","ack_policy":"none","deliver_subject":"{inbox}","idle_heartbeat":1000000000,"mem_storage":true,"num_replicas":1}}}}"#),
        )
        .await?;
        let mut sample = Sample::default();
        let started = Instant::now();
        while started.elapsed() < work.slice {
            let t = Instant::now();
            let headers = append_headers(&name, &sample.ops.to_string(), None);
            ensure!(
                stored(&self.client, &format!("{name}.in"), headers, &work.payload).await?,
                "refused"
            );
            loop {
                let next = tokio::time::timeout(Duration::from_secs(10), deliveries.next()).await;
                let message = next
                    .context("no delivery within 10 s")?
                    .context("the tail ended")?;
                // Idle heartbeats carry a status; entries do not.
                if message.status.is_none() {
                    break;
                }
            }
            sample.latencies.push(t.elapsed());
            sample.ops += 1;
        }
        sample.elapsed = started.elapsed();
        self.delete_stream(&name).await?;
        Ok(sample)
    }

    pub async fn queue_round_trip(&self, work: &Workload, prefetch: u32) -> anyhow::Result<Sample> {
        let name = stream_name("native_queue");
        self.create_stream(&name, "workqueue").await?;
        self.api(
            format!("$JS.API.CONSUMER.DURABLE.CREATE.{name}.c"),
            format!(r#"{{"stream_name":"{name}","config":{{"durable_name":"c","ack_policy":"explicit","ack_wait":30000000000,"max_ack_pending":-1}}}}"#),
        )
        .await?;
        let inbox = self.client.new_inbox();
        let mut deliveries = self.client.subscribe(inbox.clone()).await?;
        let mut sample = Sample::default();
        let started = Instant::now();
        let mut batches = 0;
        while started.elapsed() < work.slice {
            batches += 1;
            self.publish_batch(&name, batches, QUEUE_BATCH as usize, &work.payload)
                .await?;
            let mut done = 0;
            while done < QUEUE_BATCH {
                let pull = format!(r#"{{"batch":{prefetch},"no_wait":true}}"#);
                self.client
                    .publish_with_reply(
                        format!("$JS.API.CONSUMER.MSG.NEXT.{name}.c"),
                        inbox.clone(),
                        pull.into(),
                    )
                    .await?;
                // The pull's deliveries, then their `+ACK`s together (as the adapter settles a
                // batch: its settlements of one batch go to the server at once).
                let mut acks = Vec::new();
                while acks.len() < prefetch as usize {
                    let Ok(Some(message)) =
                        tokio::time::timeout(Duration::from_secs(2), deliveries.next()).await
                    else {
                        break;
                    };
                    if message.status.is_some() {
                        break;
                    }
                    let ack = message
                        .reply
                        .clone()
                        .context("a delivery without an ack subject")?;
                    acks.push(self.client.request(ack, "+ACK".into()));
                }
                done += acks.len() as u64;
                for acked in futures::future::join_all(acks).await {
                    acked?;
                }
            }
            sample.ops += QUEUE_BATCH;
        }
        sample.elapsed = started.elapsed();
        self.delete_stream(&name).await?;
        Ok(sample)
    }

    pub async fn request_reply(&self, work: &Workload) -> anyhow::Result<Sample> {
        // Both sides send as the adapter does (`Sender`); the reply goes to the requester's
        // inbox, named in a header, as the host's request and reply do.
        let subject = stream_name("native_rr");
        let inbox = self.client.new_inbox();
        let mut requests = self.client.subscribe(subject.clone()).await?;
        let mut replies = self.client.subscribe(inbox.clone()).await?;
        let mut replier = Sender::new(&self.client);
        let responder = tokio::spawn(async move {
            while let Some(request) = requests.next().await {
                let header = |name| {
                    let headers = request.headers.as_ref()?;
                    headers.get(name).map(|v| v.as_str().to_string())
                };
                if let Some(reply_to) = header(REPLY_TO) {
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert(CORRELATION_ID, header(CORRELATION_ID).unwrap_or_default());
                    replier.send(&reply_to, headers, &request.payload).await?;
                }
            }
            anyhow::Ok(())
        });
        let mut sender = Sender::new(&self.client);
        let started = Instant::now();
        let mut sample = Sample::default();
        while started.elapsed() < work.slice {
            let t = Instant::now();
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(REPLY_TO, inbox.as_str());
            headers.insert(CORRELATION_ID, sample.ops.to_string());
            sender.send(&subject, headers, &work.payload).await?;
            tokio::time::timeout(Duration::from_secs(5), replies.next())
                .await
                .context("no reply within 5 s")?
                .context("the inbox subscription ended")?;
            sample.latencies.push(t.elapsed());
            sample.ops += 1;
        }
        sample.elapsed = started.elapsed();
        responder.abort();
        Ok(sample)
    }

    pub async fn fan_out(&self, work: &Workload, subscribers: usize) -> anyhow::Result<Sample> {
        // One core subscription for the subject, shared by every local subscriber, as the host.
        let subject = stream_name("native_room");
        let deliveries = self
            .client
            .subscribe(subject.clone())
            .await?
            .map(|message| message.payload);
        self.client.flush().await?;
        // Each publish confirmed before the next, as one backplane publish call of the adapter
        // (a PUB, then the driver's round trip through the server: the contract says a
        // subscriber that exists when the broker took it gets it); the other brokers' native
        // sides await each publish too.
        shared_subscription(work, subscribers, deliveries, || async {
            for _ in 0..FAN_OUT_PAYLOADS {
                self.client
                    .publish(subject.clone(), work.payload.clone().into())
                    .await?;
                crate::bindings::flush(&self.client)
                    .await
                    .map_err(|e| anyhow::anyhow!("flush: {e:?}"))?;
            }
            Ok(())
        })
        .await
    }
}

impl NativeBench for Native {
    wrpc_broker_runtime::native_bench_rows!(
        log_append(in_flight: usize),
        log_append_batch(),
        log_catch_up(),
        log_live(),
        queue_round_trip(prefetch: u32),
        request_reply(),
        fan_out(subscribers: usize),
    );
}
