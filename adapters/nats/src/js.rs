//! JetStream through the core driver: its API is request/reply on `$JS.API.<call>` with JSON
//! bodies, a stored publish is a request answered by a PubAck, and settlements are requests on
//! the delivery's `$JS.ACK.…` subject. Calls that fail because the server is away (timeout,
//! unavailable, JetStream not answering yet after a restart) are tried again for a while, so a
//! server restart looks like a slow call, not an error.

use futures::StreamExt;
use futures::stream::FuturesOrdered;
use serde_json::{Value, json};
use wrpc_broker_guest::{Error, Headers, host};

use crate::codec;
use crate::wrpc::nats::client::{self, NatsError};
use crate::{Config, nats_error};

/// How long one JetStream request waits for its reply.
const REQUEST_MS: u32 = 5_000;
/// Pauses between tries of a call the server did not answer (≈ 15 s in all).
const PATIENCE_MS: [u32; 14] = [
    20, 50, 100, 200, 400, 800, 1000, 1000, 1000, 1500, 2000, 2000, 2500, 3000,
];

/// A JetStream error answer (`{"error": {code, err_code, description}}`).
#[derive(Debug)]
pub(crate) struct ApiError {
    /// HTTP-like code (404, 400, 503, …).
    pub(crate) code: u64,
    /// JetStream's own code (10059 stream not found, 10058 stream exists, 10014 consumer not
    /// found, …).
    pub(crate) err_code: u64,
    /// The server's words.
    pub(crate) description: String,
}

/// Why a JetStream call failed.
#[derive(Debug)]
pub(crate) enum Fail {
    /// JetStream answered with an error.
    Api(ApiError),
    /// The driver failed (after the retries for an absent server).
    Nats(NatsError),
}

impl Fail {
    /// As a broker error.
    pub(crate) fn into_error(self, what: &str) -> Error {
        match self {
            Fail::Api(e) => Error::internal(format!(
                "{what}: JetStream answered {} ({}): {}",
                e.code, e.err_code, e.description
            )),
            Fail::Nats(e) => nats_error(e),
        }
    }

    /// Whether JetStream said the stream does not exist.
    pub(crate) fn stream_missing(&self) -> bool {
        matches!(self, Fail::Api(e) if e.err_code == 10059)
            || matches!(self, Fail::Nats(NatsError::NoResponders(_)))
    }
}

/// Whether a driver error means "the server is away for now": worth another try.
fn transient(e: &NatsError) -> bool {
    matches!(
        e,
        NatsError::Timeout(_) | NatsError::Unavailable(_) | NatsError::NoResponders(_)
    )
}

/// A request, tried again while the server is away. `no_responders_final`: a 503 is an answer
/// (a publish to a subject no stream listens on), not a reason to wait.
pub(crate) async fn request(
    subject: &str,
    headers: Headers,
    payload: Vec<u8>,
    no_responders_final: bool,
) -> Result<client::Message, NatsError> {
    let one = client::Outgoing {
        subject: subject.to_string(),
        headers,
        payload,
    };
    request_all(vec![one], no_responders_final, None)
        .await
        .pop()
        .expect("one answer per request")
}

/// Requests sent together in one driver call; those the server did not answer (timeout,
/// unavailable, no responders unless `no_responders_final`) are tried again together while it
/// is away, after the pauses of [`PATIENCE_MS`]. One answer per request, in order; with
/// `keep`, each with only the headers it names (the driver's `request-all-keeping`).
pub(crate) async fn request_all(
    requests: Vec<client::Outgoing>,
    no_responders_final: bool,
    keep: Option<&[&str]>,
) -> Vec<Result<client::Message, NatsError>> {
    let mut answers: Vec<Option<Result<client::Message, NatsError>>> =
        requests.iter().map(|_| None).collect();
    let mut open: Vec<usize> = (0..requests.len()).collect();
    let mut pauses = PATIENCE_MS.iter();
    let again = |e: &NatsError| {
        transient(e) && !(no_responders_final && matches!(e, NatsError::NoResponders(_)))
    };
    while !open.is_empty() {
        let sent = open.iter().map(|&i| requests[i].clone()).collect();
        let got = match keep {
            None => client::request_all(sent, REQUEST_MS).await,
            Some(keep) => client::request_all_keeping(sent, REQUEST_MS, codec::names(keep)).await,
        };
        let mut unanswered = Vec::new();
        for (i, answer) in open.into_iter().zip(got) {
            if answer.as_ref().is_err_and(again) {
                unanswered.push(i);
            }
            answers[i] = Some(answer);
        }
        open = match pauses.next() {
            Some(pause) if !unanswered.is_empty() => {
                host::sleep(*pause).await;
                unanswered
            }
            _ => Vec::new(),
        };
    }
    answers
        .into_iter()
        .map(|a| a.expect("every request was sent once at least"))
        .collect()
}

/// How many windows of requests (a page's direct gets, a batch's publishes) are out at once.
const WINDOWS_IN_FLIGHT: usize = 2;

/// A range of positions sent in windows of `size`, [`WINDOWS_IN_FLIGHT`] windows out at once
/// and answered in order: the next window goes out while the last one's answers are taken in.
/// Dropping it drops the windows still out.
pub(crate) struct Windows<F: Future> {
    out: FuturesOrdered<F>,
    next: u64,
    end: u64,
    size: u64,
}

impl<F: Future> Windows<F> {
    /// Windows of `size` positions over `range`, none sent yet.
    pub(crate) fn new(range: std::ops::Range<u64>, size: usize) -> Self {
        Self {
            out: FuturesOrdered::new(),
            next: range.start,
            end: range.end,
            size: size as u64,
        }
    }

    /// Send what fits of the rest (`send(from, to)` makes a window's requests), then the answers
    /// of the oldest window out; `None` once every window was answered.
    pub(crate) async fn next(&mut self, mut send: impl FnMut(u64, u64) -> F) -> Option<F::Output> {
        while self.next < self.end && self.out.len() < WINDOWS_IN_FLIGHT {
            let to = (self.next + self.size).min(self.end);
            self.out.push_back(send(self.next, to));
            self.next = to;
        }
        self.out.next().await
    }
}

/// Parse a JSON answer; an `error` member becomes [`Fail::Api`].
fn answer(payload: &[u8]) -> Result<Value, Fail> {
    let value: Value = serde_json::from_slice(payload).map_err(|e| {
        Fail::Api(ApiError {
            code: 500,
            err_code: 0,
            description: format!("unreadable JetStream answer: {e}"),
        })
    })?;
    if let Some(error) = value.get("error") {
        return Err(Fail::Api(ApiError {
            code: error.get("code").and_then(Value::as_u64).unwrap_or(0),
            err_code: error.get("err_code").and_then(Value::as_u64).unwrap_or(0),
            description: error
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        }));
    }
    Ok(value)
}

/// Call `$JS.API.<call>` with a JSON body (none when `Null`).
pub(crate) async fn api(call: &str, body: &Value) -> Result<Value, Fail> {
    let payload = if body.is_null() {
        Vec::new()
    } else {
        body.to_string().into_bytes()
    };
    let reply = request(&format!("$JS.API.{call}"), Vec::new(), payload, false)
        .await
        .map_err(Fail::Nats)?;
    answer(&reply.payload)
}

/// The stream `name`'s info, creating it with `config` (a JSON stream config) when missing.
pub(crate) async fn stream_info_or_create(
    name: &str,
    config: impl Fn() -> Value,
) -> Result<Value, Fail> {
    match api(&format!("STREAM.INFO.{name}"), &Value::Null).await {
        Err(Fail::Api(e)) if e.err_code == 10059 => {}
        other => return other,
    }
    match api(&format!("STREAM.CREATE.{name}"), &config()).await {
        // Another instance created it meanwhile (with its own epoch in the description): 10058
        // "name in use with a different configuration", or 10065 "subjects overlap" when the
        // two creates crossed in the server.
        Err(Fail::Api(e)) if e.err_code == 10058 || e.err_code == 10065 => {
            api(&format!("STREAM.INFO.{name}"), &Value::Null).await
        }
        other => {
            if other.is_ok() {
                crate::debug(&format!("created stream {name}"));
            }
            other
        }
    }
}

/// The stream config shared by the streams this adapter creates.
pub(crate) fn stream_config(
    config: &Config,
    name: &str,
    subject: &str,
    description: String,
) -> Value {
    json!({
        "name": name,
        "subjects": [subject],
        "description": description,
        "storage": config.storage,
        "num_replicas": config.replicas,
        "discard": "old",
        "duplicate_window": 120_000_000_000u64,
    })
}

/// Stored publishes one window of a batch sends (one `request-all` call).
const PUBLISHES_IN_FLIGHT: usize = 256;
/// JetStream's "wrong last msg ID": a `Nats-Expected-Last-Msg-Id` check failed.
const WRONG_LAST_MSG_ID: u64 = 10070;

/// Stored publishes of `messages` (headers, payload) to `subject`, in order; the sequence of
/// each. They are pipelined in windows of [`PUBLISHES_IN_FLIGHT`], [`WINDOWS_IN_FLIGHT`]
/// windows at once, and kept in order by the server: each message but the first of a run
/// carries `Nats-Expected-Last-Msg-Id` = the message before it, so once one fails (or another
/// publisher's message lands between two), every later one is refused and a new run starts
/// from the first refused. Each message has one `Nats-Msg-Id` for all its tries, so a message
/// stored whose PubAck was lost is stored once. A missing stream is made with `create` (once)
/// and the publishes go on.
pub(crate) async fn publish_all<Fut>(
    subject: &str,
    stream: &str,
    messages: Vec<(Headers, Vec<u8>)>,
    mut create: impl FnMut() -> Fut,
) -> Result<Vec<u64>, Error>
where
    Fut: Future<Output = Result<(), Error>>,
{
    // One fresh id per batch, a record's its index after it: unique as the batch's is.
    let batch = host::generate_id();
    let ids: Vec<String> = (0..messages.len())
        .map(|i| format!("{batch}-{i}"))
        .collect();
    // Messages `from..to` of a run that began at `run`.
    let window = |run: usize, from: u64, to: u64| {
        let sends = (from as usize..to as usize)
            .map(|i| {
                let (headers, payload) = &messages[i];
                let mut headers = headers.clone();
                codec::push(&mut headers, codec::MSG_ID, &ids[i]);
                codec::push(&mut headers, codec::EXPECTED_STREAM, stream);
                if i > run {
                    codec::push(&mut headers, codec::EXPECTED_LAST_MSG_ID, &ids[i - 1]);
                }
                client::Outgoing {
                    subject: subject.to_string(),
                    headers,
                    payload: payload.clone(),
                }
            })
            .collect();
        request_all(sends, true, None)
    };
    let mut seqs = Vec::with_capacity(messages.len());
    let mut created = false;
    'runs: while seqs.len() < messages.len() {
        let run = seqs.len();
        let mut windows = Windows::new(run as u64..messages.len() as u64, PUBLISHES_IN_FLIGHT);
        while let Some(replies) = windows.next(|from, to| window(run, from, to)).await {
            for reply in replies {
                // A new run drops the window still out: its messages are refused, the chain
                // they expect broken.
                match reply.map_err(Fail::Nats).and_then(|m| pub_ack(&m)) {
                    Ok(seq) => seqs.push(seq),
                    Err(e) if e.stream_missing() && !created => {
                        create().await?;
                        created = true;
                        continue 'runs;
                    }
                    // The message before it was not the stream's last: a new run from this one.
                    Err(Fail::Api(e)) if e.err_code == WRONG_LAST_MSG_ID && seqs.len() > run => {
                        crate::debug(&format!(
                            "publish to {stream}: sent again from {}",
                            seqs.len()
                        ));
                        continue 'runs;
                    }
                    Err(e) => return Err(e.into_error(&format!("publish to {stream}"))),
                }
            }
        }
    }
    Ok(seqs)
}

/// What a stored publish's answer holds that the adapter reads: a PubAck's `seq`, or an
/// `error` (read again through [`answer`]). Typed, so no JSON tree is built per record.
#[derive(serde::Deserialize)]
struct PubAck {
    seq: Option<u64>,
    error: Option<serde::de::IgnoredAny>,
}

/// The stream sequence in a stored publish's PubAck.
fn pub_ack(reply: &client::Message) -> Result<u64, Fail> {
    if let Ok(PubAck {
        seq: Some(seq),
        error: None,
    }) = serde_json::from_slice(&reply.payload)
    {
        return Ok(seq);
    }
    let ack = answer(&reply.payload)?;
    Err(Fail::Api(ApiError {
        code: 500,
        err_code: 0,
        description: format!("a PubAck without seq: {ack}"),
    }))
}
