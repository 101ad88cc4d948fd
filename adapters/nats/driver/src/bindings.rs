//! `wrpc:nats/client` for components: each import is a thin call on the driver's
//! `async_nats::Client`; a subscription becomes a guest-read stream fed in batches.

use std::time::Duration;

use async_nats::{HeaderMap, HeaderName, HeaderValue};
use wasmtime::component::{Accessor, HasSelf, Linker, StreamReader};

use super::subscription::Subscription;
use super::{NatsDriver, faults};
use wrpc_broker_runtime::sandbox::Ctx;
use wrpc_broker_runtime::streams::{BatchProducer, FilterMap};

wasmtime::component::bindgen!({
    inline: "package wrpc:host-nats; world driver { import wrpc:nats/client@0.1.0; }",
    path: "../wit",
    imports: { default: trappable },
});

pub(crate) use wrpc::nats::client as wit;

/// How long `subscribe` and `flush` wait for the server's round trip.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// Link `wrpc:nats/client` into `linker`.
pub fn add_to_linker(linker: &mut Linker<Ctx>) -> wasmtime::Result<()> {
    wit::add_to_linker::<_, HasSelf<Ctx>>(linker, |ctx| ctx)
}

/// The connection lent to the calling component.
fn nats(ctx: &mut Ctx) -> wasmtime::Result<NatsDriver> {
    ctx.lent::<NatsDriver>()
        .cloned()
        .ok_or_else(|| wasmtime::Error::msg("the NATS driver is not configured for this adapter"))
}

/// The most requests one `request-all` call takes: each is a future on the host, so a component
/// may not ask for millions at once.
const MAX_REQUESTS_PER_CALL: usize = 4096;

/// The most header names a `…-keeping` call takes (a subscription holds its list as long as it
/// lives).
const MAX_KEPT_NAMES: usize = 64;

/// Refuse a `keep` list over [`MAX_KEPT_NAMES`] names.
fn check_kept(call: &str, keep: &[String]) -> Result<(), wit::NatsError> {
    if keep.len() > MAX_KEPT_NAMES {
        return Err(wit::NatsError::BadRequest(format!(
            "{call}: {} header names to keep, at most {MAX_KEPT_NAMES}",
            keep.len()
        )));
    }
    Ok(())
}

/// The driver lent to the calling component.
fn nats_of<T>(accessor: &Accessor<T, HasSelf<Ctx>>) -> wasmtime::Result<NatsDriver> {
    accessor.with(|mut access| nats(access.get()))
}

/// WIT headers as a NATS header map; a name or value NATS cannot carry is a bad request.
fn header_map(headers: wit::Headers) -> Result<Option<HeaderMap>, wit::NatsError> {
    if headers.is_empty() {
        return Ok(None);
    }
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let bad = |what: &str| wit::NatsError::BadRequest(format!("header `{name}`: {what}"));
        let header: HeaderName = name
            .parse()
            .map_err(|_| bad("not a valid NATS header name"))?;
        let text = String::from_utf8(value).map_err(|_| bad("value is not UTF-8"))?;
        let value: HeaderValue = text.parse().map_err(|_| bad("value holds CR or LF"))?;
        map.append(header, value);
    }
    Ok(Some(map))
}

/// A NATS message as the WIT record.
fn message(m: async_nats::Message) -> wit::Message {
    message_keeping(m, None)
}

/// A NATS message as the WIT record, with only the headers named in `keep` (ASCII
/// case-insensitively) when given.
fn message_keeping(m: async_nats::Message, keep: Option<&[String]>) -> wit::Message {
    faults::saw(&m);
    let kept = |name: &HeaderName| {
        keep.is_none_or(|keep| keep.iter().any(|k| k.eq_ignore_ascii_case(name.as_ref())))
    };
    let headers = m
        .headers
        .iter()
        .flat_map(|map| map.iter())
        .filter(|(name, _)| kept(name))
        .flat_map(|(name, values)| {
            values
                .iter()
                .map(move |v| (name.to_string(), v.as_str().as_bytes().to_vec()))
        })
        .collect();
    wit::Message {
        subject: m.subject.to_string(),
        reply: m.reply.map(|r| r.to_string()),
        headers,
        payload: m.payload.to_vec(),
        status: m.status.map(|s| s.as_u16()),
        description: m.description.unwrap_or_default(),
    }
}

/// A publish the client refused: a subject or a size NATS does not take is a bad request.
pub(crate) fn publish_error(e: async_nats::PublishError) -> wit::NatsError {
    use async_nats::client::PublishErrorKind as Kind;
    match e.kind() {
        Kind::InvalidSubject | Kind::MaxPayloadExceeded => {
            wit::NatsError::BadRequest(e.to_string())
        }
        _ => wit::NatsError::Unavailable(e.to_string()),
    }
}

/// Fail with `refused` when `subject` settles a message of a queue a test armed a refusal for.
fn check_faults(subject: &str) -> Result<(), wit::NatsError> {
    if let Some(why) = faults::refuse(subject) {
        return Err(wit::NatsError::Refused(format!("{subject}: {why}")));
    }
    Ok(())
}

/// Wait until the server has processed everything this connection sent before, bounded by
/// [`FLUSH_TIMEOUT`]. `async_nats::Client::flush` only flushes the socket, so this is a round
/// trip of its own: a request to a fresh inbox nobody subscribes to, which the server answers
/// "no responders" (NATS 2.2 and later, as JetStream) only after it handled every earlier
/// operation (a SUB, an UNSUB, a PUB) of the connection.
pub(crate) async fn flush(client: &async_nats::Client) -> Result<(), wit::NatsError> {
    use async_nats::client::RequestErrorKind as Kind;
    let request = async_nats::Request::new().timeout(Some(FLUSH_TIMEOUT));
    match client.send_request(client.new_inbox(), request).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == Kind::NoResponders => Ok(()),
        Err(e) if e.kind() == Kind::TimedOut => Err(wit::NatsError::Timeout(format!(
            "the server did not answer within {FLUSH_TIMEOUT:?}"
        ))),
        Err(e) => Err(wit::NatsError::Unavailable(format!("flush: {e}"))),
    }
}

/// Subscribe to `subject` (in `group`) and wait until the server has the interest.
async fn subscribe_at_server(
    client: &async_nats::Client,
    subject: &str,
    group: &Option<String>,
) -> Result<async_nats::Subscriber, wit::NatsError> {
    let subscribed = match group {
        Some(group) => {
            client
                .queue_subscribe(subject.to_string(), group.clone())
                .await
        }
        None => client.subscribe(subject.to_string()).await,
    };
    let subscriber = subscribed.map_err(|e| {
        use async_nats::client::SubscribeErrorKind as Kind;
        match e.kind() {
            Kind::InvalidSubject | Kind::InvalidQueueName => {
                wit::NatsError::BadRequest(e.to_string())
            }
            _ => wit::NatsError::Unavailable(e.to_string()),
        }
    })?;
    flush(client).await?;
    Ok(subscriber)
}

/// A member of the share of `subject` in `queue_group`: joined when another component here
/// has it already (the server routes to it already; a hot swap never leaves a gap), else
/// subscribed at the server.
async fn member<T>(
    accessor: &Accessor<T, HasSelf<Ctx>>,
    subject: String,
    queue_group: Option<String>,
) -> wasmtime::Result<Result<(u64, Subscription), wit::NatsError>> {
    let driver = nats_of(accessor)?;
    if let Some(member) = driver.subscriptions.join(&subject, &queue_group) {
        return Ok(Ok(member));
    }
    Ok(subscribe_at_server(&driver.client, &subject, &queue_group)
        .await
        .map(|subscriber| {
            driver
                .subscriptions
                .share(&subject, &queue_group, subscriber)
        }))
}

impl wit::Host for Ctx {
    fn new_inbox(&mut self) -> wasmtime::Result<String> {
        Ok(nats(self)?.client.new_inbox())
    }
}

/// `subscribe` (and `subscribe-keeping`, with `keep`): a member of the subscription, its
/// messages as WIT records.
async fn messages<T>(
    accessor: &Accessor<T, HasSelf<Ctx>>,
    subject: String,
    queue_group: Option<String>,
    keep: Option<Vec<String>>,
) -> wasmtime::Result<Result<(u64, StreamReader<wit::Message>), wit::NatsError>> {
    if let Some(keep) = &keep
        && let Err(e) = check_kept("subscribe-keeping", keep)
    {
        return Ok(Err(e));
    }
    let (id, subscription) = match member(accessor, subject, queue_group).await? {
        Ok(member) => member,
        Err(e) => return Ok(Err(e)),
    };
    let records = move |m| message_keeping(m, keep.as_deref());
    let stream = accessor.with(|mut access| {
        StreamReader::new(&mut access, BatchProducer::new(subscription, records))
    })?;
    Ok(Ok((id, stream)))
}

impl<T> wit::HostWithStore<T> for HasSelf<Ctx> {
    async fn publish(
        accessor: &Accessor<T, Self>,
        subject: String,
        headers: wit::Headers,
        payload: Vec<u8>,
        reply: Option<String>,
    ) -> wasmtime::Result<Result<(), wit::NatsError>> {
        let driver = nats_of(accessor)?;
        let publish = async {
            check_faults(&subject)?;
            let headers = header_map(headers)?.unwrap_or_default();
            let client = &driver.client;
            let sent = match reply {
                Some(reply) => {
                    client
                        .publish_with_reply_and_headers(subject, reply, headers, payload.into())
                        .await
                }
                None => {
                    client
                        .publish_with_headers(subject, headers, payload.into())
                        .await
                }
            };
            sent.map_err(publish_error)
        };
        let result = publish.await;
        Ok(result)
    }

    async fn publish_checked(
        accessor: &Accessor<T, Self>,
        subject: String,
        headers: wit::Headers,
        payload: Vec<u8>,
        timeout_ms: u32,
    ) -> wasmtime::Result<Result<(), wit::NatsError>> {
        let driver = nats_of(accessor)?;
        let publish = async {
            check_faults(&subject)?;
            let headers = header_map(headers)?.unwrap_or_default();
            let timeout = Duration::from_millis(u64::from(timeout_ms.max(1)));
            let client = &driver.client;
            (driver.checked)
                .publish(client, subject, headers, payload.into(), timeout)
                .await
        };
        Ok(publish.await)
    }

    async fn subscribe(
        accessor: &Accessor<T, Self>,
        subject: String,
        queue_group: Option<String>,
    ) -> wasmtime::Result<Result<(u64, StreamReader<wit::Message>), wit::NatsError>> {
        messages(accessor, subject, queue_group, None).await
    }

    async fn subscribe_keeping(
        accessor: &Accessor<T, Self>,
        subject: String,
        queue_group: Option<String>,
        keep: Vec<String>,
    ) -> wasmtime::Result<Result<(u64, StreamReader<wit::Message>), wit::NatsError>> {
        messages(accessor, subject, queue_group, Some(keep)).await
    }

    async fn subscribe_payloads(
        accessor: &Accessor<T, Self>,
        subject: String,
        queue_group: Option<String>,
    ) -> wasmtime::Result<Result<(u64, StreamReader<Vec<u8>>), wit::NatsError>> {
        let (id, subscription) = match member(accessor, subject, queue_group).await? {
            Ok(member) => member,
            Err(e) => return Ok(Err(e)),
        };
        // Payloads alone; a message with a status is left out.
        let payloads = FilterMap::new(subscription, |m: async_nats::Message| {
            m.status.is_none().then(|| m.payload.to_vec())
        });
        let stream = accessor.with(|mut access| {
            StreamReader::new(&mut access, BatchProducer::new(payloads, |p| p))
        })?;
        Ok(Ok((id, stream)))
    }

    async fn unsubscribe(accessor: &Accessor<T, Self>, subscription: u64) -> wasmtime::Result<()> {
        let driver = nats_of(accessor)?;
        if driver.subscriptions.leave(subscription).await
            && let Err(e) = flush(&driver.client).await
        {
            tracing::debug!(subscription, "nats: unsubscribe: {e:?}");
        }
        Ok(())
    }

    async fn request(
        accessor: &Accessor<T, Self>,
        subject: String,
        headers: wit::Headers,
        payload: Vec<u8>,
        timeout_ms: u32,
    ) -> wasmtime::Result<Result<wit::Message, wit::NatsError>> {
        let driver = nats_of(accessor)?;
        let reply = send_request(&driver.client, subject, headers, payload, timeout_ms).await;
        Ok(reply.map(message))
    }

    async fn request_all(
        accessor: &Accessor<T, Self>,
        requests: Vec<wit::Outgoing>,
        timeout_ms: u32,
    ) -> wasmtime::Result<Vec<Result<wit::Message, wit::NatsError>>> {
        let driver = nats_of(accessor)?;
        Ok(request_all(&driver.client, requests, timeout_ms, None).await)
    }

    async fn request_all_keeping(
        accessor: &Accessor<T, Self>,
        requests: Vec<wit::Outgoing>,
        timeout_ms: u32,
        keep: Vec<String>,
    ) -> wasmtime::Result<Vec<Result<wit::Message, wit::NatsError>>> {
        let driver = nats_of(accessor)?;
        Ok(request_all(&driver.client, requests, timeout_ms, Some(&keep)).await)
    }

    async fn flush(accessor: &Accessor<T, Self>) -> wasmtime::Result<Result<(), wit::NatsError>> {
        let driver = nats_of(accessor)?;
        let result = flush(&driver.client).await;
        Ok(result)
    }
}

/// `request-all` (and `request-all-keeping`, with `keep`): every request sent at once, in the
/// order given, each as [`send_request`]; over [`MAX_REQUESTS_PER_CALL`] (each request is a
/// future on the host), or with `keep` over [`MAX_KEPT_NAMES`], nothing is sent and every
/// answer is `bad-request`.
async fn request_all(
    client: &async_nats::Client,
    requests: Vec<wit::Outgoing>,
    timeout_ms: u32,
    keep: Option<&[String]>,
) -> Vec<Result<wit::Message, wit::NatsError>> {
    let refused = if requests.len() > MAX_REQUESTS_PER_CALL {
        Err(wit::NatsError::BadRequest(format!(
            "request-all: {} requests, at most {MAX_REQUESTS_PER_CALL} a call",
            requests.len()
        )))
    } else {
        keep.map_or(Ok(()), |k| check_kept("request-all-keeping", k))
    };
    if let Err(refused) = refused {
        return requests.iter().map(|_| Err(refused.clone())).collect();
    }
    // Unconstrained by tokio's cooperative budget (128 operations a poll): under it the join
    // yields part-way through the sends and polls the rest in another order next time, and a
    // chain of publishes pipelined in one call (`Nats-Expected-Last-Msg-Id`) is refused.
    let sends = requests.into_iter().map(|r| async move {
        send_request(client, r.subject, r.headers, r.payload, timeout_ms)
            .await
            .map(|m| message_keeping(m, keep))
    });
    tokio::task::unconstrained(futures::future::join_all(sends)).await
}

/// Publish with a fresh reply inbox and wait up to `timeout_ms` for the first reply, as NATS
/// gave it (`request` and each of [`request_all`]).
async fn send_request(
    client: &async_nats::Client,
    subject: String,
    headers: wit::Headers,
    payload: Vec<u8>,
    timeout_ms: u32,
) -> Result<async_nats::Message, wit::NatsError> {
    check_faults(&subject)?;
    let mut request = async_nats::Request::new()
        .payload(payload.into())
        .timeout(Some(Duration::from_millis(u64::from(timeout_ms.max(1)))));
    if let Some(headers) = header_map(headers)? {
        request = request.headers(headers);
    }
    client
        .send_request(subject.clone(), request)
        .await
        .map_err(|e| {
            use async_nats::client::RequestErrorKind as Kind;
            match e.kind() {
                Kind::NoResponders => {
                    wit::NatsError::NoResponders(format!("{subject}: no responders"))
                }
                Kind::TimedOut => {
                    wit::NatsError::Timeout(format!("{subject}: no reply within {timeout_ms} ms"))
                }
                Kind::InvalidSubject | Kind::MaxPayloadExceeded => {
                    wit::NatsError::BadRequest(format!("{subject}: {e}"))
                }
                _ => wit::NatsError::Unavailable(format!("{subject}: {e}")),
            }
        })
}

#[cfg(test)]
mod tests;
