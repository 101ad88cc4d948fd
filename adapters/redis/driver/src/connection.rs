//! The connections of one Redis broker: the shared multiplexed connection every plain command
//! and pipeline goes through (re-established after a loss, counted by a generation), a pool of
//! dedicated connections for blocking commands, and the fault injector tests use.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError, Value};

use super::RedisConfig;
use super::pubsub::Unsubscribed;
use wrpc_broker_runtime::faults::SettlementRefusals;

/// How long making a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a plain command may wait for its reply before the connection counts as lost.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle dedicated connections kept for blocking commands.
const POOL_MAX: usize = 16;
/// How long a call waits out a server still loading its data set: restarted, Redis accepts
/// connections before it serves, and answers every command `LOADING` until it has read its
/// files. Nothing ran, so the call is sent again; past this it fails as a lost connection.
const LOADING_WAIT: Duration = Duration::from_secs(5);
/// The pause between two tries while the server loads.
const LOADING_PAUSE: Duration = Duration::from_millis(20);

/// A live subscription as [`Connections`] keeps it.
pub(crate) struct LiveSubscription {
    channel: Vec<u8>,
    sink: redis::aio::PubSubSink,
    unsubscribed: Arc<Unsubscribed>,
}

/// Why a call failed, before it becomes the WIT `redis-error`.
#[derive(Debug, Clone)]
pub(crate) enum CallError {
    /// The connection was lost or could not be made.
    ConnectionLost(String),
    /// The server refused the whole call while it loads its data set (nothing ran).
    Loading(String),
    /// An error reply to the command.
    Server(String),
    /// Refused by fault injection.
    Refused(String),
    /// A malformed call.
    Invalid(String),
}

/// Read a client error: a lost connection, or the server's error reply.
pub(crate) fn classify(e: &RedisError) -> CallError {
    if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() || e.is_timeout()
    {
        return CallError::ConnectionLost(e.to_string());
    }
    match (e.code(), e.detail()) {
        (Some("LOADING"), _) => CallError::Loading(e.to_string()),
        (Some(code), Some(detail)) => CallError::Server(format!("{code} {detail}")),
        (Some(code), None) => CallError::Server(code.to_string()),
        _ => CallError::ConnectionLost(e.to_string()),
    }
}

/// The connections of one broker, shared by every adapter instance lent this driver.
pub(crate) struct Connections {
    client: Client,
    /// The shared connection and the generation it belongs to; `None` after a loss.
    shared: tokio::sync::Mutex<Option<(u64, MultiplexedConnection)>>,
    /// How many times the shared connection was established.
    generation: AtomicU64,
    /// Idle dedicated connections for blocking commands.
    pool: Mutex<Vec<MultiplexedConnection>>,
    /// Live subscriptions: their channel, the sink to unsubscribe with, and the flag that ends
    /// the stream once the unsubscribe is confirmed.
    subscriptions: Mutex<std::collections::HashMap<u64, LiveSubscription>>,
    next_subscription: AtomicU64,
    /// Settlements to refuse (tests); shared by every driver of one URL in this process.
    pub(crate) faults: std::sync::Arc<Faults>,
}

impl Connections {
    /// Parse the URL; no connection is made yet.
    pub(crate) fn open(config: &RedisConfig) -> Result<Self, RedisError> {
        Ok(Self {
            client: Client::open(config.url.as_str())?,
            shared: tokio::sync::Mutex::new(None),
            generation: AtomicU64::new(0),
            pool: Mutex::new(Vec::new()),
            subscriptions: Mutex::new(std::collections::HashMap::new()),
            next_subscription: AtomicU64::new(1),
            faults: Faults::for_url(&config.url),
        })
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The shared connection, made now if there is none; with its generation.
    pub(crate) async fn shared(&self) -> Result<(u64, MultiplexedConnection), CallError> {
        let mut shared = self.shared.lock().await;
        if let Some((generation, conn)) = shared.as_ref() {
            return Ok((*generation, conn.clone()));
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(CONNECT_TIMEOUT)
            .set_response_timeout(RESPONSE_TIMEOUT);
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| CallError::ConnectionLost(e.to_string()))?;
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        if generation > 1 {
            tracing::info!(generation, "redis: connection re-established");
        }
        *shared = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    /// The shared connection of `generation` failed: drop it, so the next call reconnects.
    async fn lost(&self, generation: u64, why: &str) {
        let mut shared = self.shared.lock().await;
        if shared.as_ref().is_some_and(|(g, _)| *g == generation) {
            tracing::warn!(generation, "redis: connection lost: {why}");
            *shared = None;
            // Idle blocking connections went down with the server, most likely.
            self.pool.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    /// One command on the shared connection, sent again while the server loads.
    pub(crate) async fn command(&self, args: &[Vec<u8>]) -> Result<Value, CallError> {
        once_loaded(|| self.command_once(args)).await
    }

    async fn command_once(&self, args: &[Vec<u8>]) -> Result<Value, CallError> {
        let cmd = build(args)?;
        self.faults.check(args)?;
        let (generation, mut conn) = self.shared().await?;
        match conn.send_packed_command(&cmd).await {
            Ok(value @ Value::ServerError(_)) => Err(reply_error(value)),
            Ok(value) => Ok(value),
            Err(e) => {
                let e = classify(&e);
                if let CallError::ConnectionLost(why) = &e {
                    self.lost(generation, why).await;
                }
                Err(e)
            }
        }
    }

    /// Several commands in one round trip on the shared connection; one reply each (an error
    /// reply stays in its place as a `Value::ServerError`). Sent again while the server loads
    /// (every reply `LOADING`); if it finished loading midway (some ran, the first did not),
    /// the pipeline fails as a lost connection: resent, what ran would run twice, in another
    /// order.
    pub(crate) async fn pipeline(
        &self,
        commands: &[Vec<Vec<u8>>],
    ) -> Result<Vec<Value>, CallError> {
        once_loaded(|| async {
            let values = self.pipeline_once(commands).await?;
            match values.iter().filter(|v| is_loading(v)).count() {
                0 => Ok(values),
                n if n == values.len() => Err(reply_error(values.into_iter().next().expect("a reply"))),
                n => Err(CallError::ConnectionLost(format!(
                    "the server finished loading its data set during a pipeline: {n} of {} commands refused",
                    values.len()
                ))),
            }
        })
        .await
    }

    async fn pipeline_once(&self, commands: &[Vec<Vec<u8>>]) -> Result<Vec<Value>, CallError> {
        if commands.is_empty() {
            return Err(CallError::Invalid("an empty pipeline".into()));
        }
        let mut pipe = redis::Pipeline::with_capacity(commands.len());
        for args in commands {
            pipe.add_command(build(args)?);
        }
        for args in commands {
            self.faults.check(args)?;
        }
        let (generation, mut conn) = self.shared().await?;
        match conn.send_packed_commands(&pipe, 0, commands.len()).await {
            Ok(values) if values.len() == commands.len() => Ok(values),
            Ok(values) => Err(CallError::ConnectionLost(format!(
                "{} replies to a pipeline of {}",
                values.len(),
                commands.len()
            ))),
            Err(e) => {
                let e = classify(&e);
                if let CallError::ConnectionLost(why) = &e {
                    self.lost(generation, why).await;
                }
                Err(e)
            }
        }
    }

    /// One blocking command on a dedicated connection from the pool, sent again while the
    /// server loads. The connection goes back to the pool only when the reply arrived; a call
    /// dropped midway takes it down with it.
    pub(crate) async fn blocking(&self, args: &[Vec<u8>]) -> Result<Value, CallError> {
        once_loaded(|| self.blocking_once(args)).await
    }

    async fn blocking_once(&self, args: &[Vec<u8>]) -> Result<Value, CallError> {
        let cmd = build(args)?;
        self.faults.check(args)?;
        let pooled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut conn = match pooled {
            Some(conn) => conn,
            None => {
                let config = AsyncConnectionConfig::new().set_connection_timeout(CONNECT_TIMEOUT);
                self.client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map_err(|e| CallError::ConnectionLost(e.to_string()))?
            }
        };
        let answer = conn.send_packed_command(&cmd).await;
        match answer {
            Ok(value @ Value::ServerError(_)) => {
                self.give_back(conn);
                Err(reply_error(value))
            }
            Ok(value) => {
                self.give_back(conn);
                Ok(value)
            }
            Err(e) => {
                let e = classify(&e);
                if !matches!(e, CallError::ConnectionLost(_)) {
                    self.give_back(conn);
                }
                Err(e)
            }
        }
    }

    fn give_back(&self, conn: MultiplexedConnection) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < POOL_MAX {
            pool.push(conn);
        }
    }

    /// A dedicated pub/sub connection subscribed to `channel` (confirmed by the server), the id
    /// to unsubscribe it with, and the flag [`Connections::unsubscribe`] raises.
    pub(crate) async fn subscribe(
        &self,
        channel: &[u8],
    ) -> Result<(u64, redis::aio::PubSubStream, Arc<Unsubscribed>), CallError> {
        self.faults
            .check(&[b"SUBSCRIBE".to_vec(), channel.to_vec()])?;
        let pubsub = tokio::time::timeout(CONNECT_TIMEOUT, self.client.get_async_pubsub())
            .await
            .map_err(|_| CallError::ConnectionLost("connecting for pub/sub timed out".into()))?
            .map_err(|e| classify(&e))?;
        let (mut sink, stream) = pubsub.split();
        tokio::time::timeout(RESPONSE_TIMEOUT, sink.subscribe(channel))
            .await
            .map_err(|_| CallError::ConnectionLost("SUBSCRIBE was not confirmed in time".into()))?
            .map_err(|e| classify(&e))?;
        let id = self.next_subscription.fetch_add(1, Ordering::SeqCst);
        let unsubscribed = Arc::new(Unsubscribed::default());
        self.subscriptions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                id,
                LiveSubscription {
                    channel: channel.to_vec(),
                    sink,
                    unsubscribed: unsubscribed.clone(),
                },
            );
        Ok((id, stream, unsubscribed))
    }

    /// Unsubscribe `id` and wait for the server's confirmation (bounded); then its stream ends
    /// once it has yielded the messages that arrived before (they are buffered by then: one
    /// connection answers in order), and its connection closes with the stream.
    pub(crate) async fn unsubscribe(&self, id: u64) {
        if let Some(mut live) = self.forget(id) {
            let confirmed = tokio::time::timeout(
                RESPONSE_TIMEOUT,
                live.sink.unsubscribe(live.channel.as_slice()),
            )
            .await;
            if !matches!(confirmed, Ok(Ok(()))) {
                tracing::warn!(
                    subscription = id,
                    "redis: UNSUBSCRIBE was not confirmed: {confirmed:?}"
                );
            }
            live.unsubscribed.raise();
        }
    }

    /// Drop the record of subscription `id` (its stream is gone).
    pub(crate) fn forget(&self, id: u64) -> Option<LiveSubscription> {
        self.subscriptions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
    }
}

/// A command from its arguments; the first names it.
fn build(args: &[Vec<u8>]) -> Result<redis::Cmd, CallError> {
    let (name, rest) = args
        .split_first()
        .ok_or_else(|| CallError::Invalid("an empty command".into()))?;
    let mut cmd = redis::cmd(&String::from_utf8_lossy(name));
    for arg in rest {
        cmd.arg(arg.as_slice());
    }
    Ok(cmd)
}

/// An error reply (a `Value::ServerError`) as one line: code, then details.
pub(crate) fn server_text(value: Value) -> String {
    match value {
        Value::ServerError(e) => {
            let e = RedisError::from(e);
            match (e.code(), e.detail()) {
                (Some(code), Some(detail)) => format!("{code} {detail}"),
                (Some(code), None) => code.to_string(),
                _ => e.to_string(),
            }
        }
        other => format!("{other:?}"),
    }
}

/// An error reply to a whole command: a server still loading its data set after a restart
/// is [`CallError::Loading`] (try again), anything else is the server's answer.
fn reply_error(value: Value) -> CallError {
    if is_loading(&value) {
        CallError::Loading(server_text(value))
    } else {
        CallError::Server(server_text(value))
    }
}

/// Whether `value` is the error reply of a server still loading its data set.
fn is_loading(value: &Value) -> bool {
    matches!(value, Value::ServerError(e) if e.code() == "LOADING")
}

/// `call`, sent again while the server answers it is loading (up to [`LOADING_WAIT`]); still
/// loading after that, it fails as a lost connection.
async fn once_loaded<T, F, Fut>(mut call: F) -> Result<T, CallError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CallError>>,
{
    let deadline = tokio::time::Instant::now() + LOADING_WAIT;
    loop {
        match call().await {
            Err(CallError::Loading(_)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(LOADING_PAUSE).await;
            }
            Err(CallError::Loading(why)) => return Err(CallError::ConnectionLost(why)),
            answer => return answer,
        }
    }
}

/// The fault injector: rules that refuse matching commands a number of times.
/// The fault hook of one URL: settlements to refuse, and which loaded scripts acknowledge.
///
/// A settlement here is any command that acknowledges stream entries of a key whose name holds
/// an armed queue's name: `XACK key …`, or a script (`EVAL`, `EVALSHA`, `FCALL` is not tracked)
/// whose text calls `XACK` and whose keys include such a key. Scripts are known by the text
/// the adapter loaded (`SCRIPT LOAD`) or sent (`EVAL`), whatever names it gives its keys.
#[derive(Default)]
pub(crate) struct Faults {
    pub(crate) refusals: SettlementRefusals,
    /// SHA1 (lower-case hex) of every script seen, and whether it calls `XACK`.
    scripts: Mutex<std::collections::HashMap<String, bool>>,
}

/// The fault injectors by URL: every driver connected to one URL shares one, so a test can
/// inject faults into host instances it opened through `wrpc_broker::BrokerBuilder::url`.
static FAULTS: std::sync::LazyLock<
    Mutex<std::collections::HashMap<String, std::sync::Arc<Faults>>>,
> = std::sync::LazyLock::new(Default::default);

impl Faults {
    fn for_url(url: &str) -> std::sync::Arc<Faults> {
        FAULTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(url.to_string())
            .or_default()
            .clone()
    }

    /// Remember a script's text by its SHA1.
    fn saw_script(&self, text: &[u8]) {
        let sha = sha1_smol::Sha1::from(text).digest().to_string();
        let acks = String::from_utf8_lossy(text)
            .to_ascii_uppercase()
            .contains("XACK");
        self.scripts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sha, acks);
    }

    /// The keys `args` acknowledges entries of, if it is a settlement.
    fn acknowledged_keys<'a>(&self, args: &'a [Vec<u8>]) -> Vec<&'a [u8]> {
        let name = args
            .first()
            .map(|a| a.to_ascii_uppercase())
            .unwrap_or_default();
        let script_keys = |acks: bool| -> Vec<&'a [u8]> {
            let count = args
                .get(2)
                .and_then(|n| std::str::from_utf8(n).ok()?.parse::<usize>().ok())
                .unwrap_or(0);
            match acks {
                true => args.iter().skip(3).take(count).map(Vec::as_slice).collect(),
                false => Vec::new(),
            }
        };
        match name.as_slice() {
            b"XACK" => args.get(1).map(Vec::as_slice).into_iter().collect(),
            b"EVAL" => script_keys(args.get(1).is_some_and(|t| {
                String::from_utf8_lossy(t)
                    .to_ascii_uppercase()
                    .contains("XACK")
            })),
            b"EVALSHA" => {
                let sha = args
                    .get(1)
                    .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase());
                let scripts = self.scripts.lock().unwrap_or_else(|e| e.into_inner());
                script_keys(
                    sha.and_then(|sha| scripts.get(&sha).copied())
                        .unwrap_or(false),
                )
            }
            _ => Vec::new(),
        }
    }

    /// `Err(refused)` when `args` settles on an armed queue (and counts it down).
    fn check(&self, args: &[Vec<u8>]) -> Result<(), CallError> {
        let name = args
            .first()
            .map(|a| a.to_ascii_uppercase())
            .unwrap_or_default();
        match (name.as_slice(), args.get(1)) {
            (b"SCRIPT", Some(verb)) if verb.eq_ignore_ascii_case(b"LOAD") => {
                if let Some(text) = args.get(2) {
                    self.saw_script(text);
                }
            }
            (b"EVAL", Some(text)) => self.saw_script(text),
            _ => {}
        }
        if !self.refusals.is_armed() {
            return Ok(());
        }
        let keys: Vec<String> = self
            .acknowledged_keys(args)
            .into_iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        match self
            .refusals
            .refuse(|queue| keys.iter().any(|k| k.contains(queue)))
        {
            Some(why) => Err(CallError::Refused(why)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{CallError, Faults, once_loaded, reply_error};

    #[tokio::test]
    async fn a_loading_server_is_waited_out_and_other_errors_are_not() {
        // The reply a loading server sends, as the client parses it.
        let loading = || {
            let reply = b"-LOADING Redis is loading the dataset in memory\r\n";
            reply_error(redis::parse_redis_value(reply).expect("an error reply"))
        };
        assert!(matches!(loading(), CallError::Loading(_)));
        // Refused twice while loading, then served.
        let mut tries = 0;
        let answer = once_loaded(|| {
            tries += 1;
            let answer = if tries < 3 { Err(loading()) } else { Ok(tries) };
            async move { answer }
        })
        .await;
        assert_eq!(answer.unwrap(), 3);
        // Any other error is answered at once.
        let mut tries = 0;
        let answer: Result<(), _> = once_loaded(|| {
            tries += 1;
            async { Err(CallError::Server("ERR wrong".into())) }
        })
        .await;
        assert!(matches!(answer, Err(CallError::Server(_))));
        assert_eq!(tries, 1);
    }

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn settlements_are_found_by_what_they_do_not_by_key_names() {
        let faults = Faults::default();
        let script = "local n = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) return n";
        faults.check(&args(&["SCRIPT", "LOAD", script])).unwrap();
        faults.refusals.arm("jobs", 3);
        let sha = sha1_smol::Sha1::from(script).digest().to_string();
        // Reads and writes that acknowledge nothing pass.
        faults
            .check(&args(&["XADD", "my/jobs/stream", "*", "b", "x"]))
            .unwrap();
        faults
            .check(&args(&[
                "XREADGROUP",
                "GROUP",
                "g",
                "c",
                "STREAMS",
                "my/jobs/stream",
                ">",
            ]))
            .unwrap();
        // An XACK on any key naming the queue is refused, and so is the acknowledging script.
        assert!(
            faults
                .check(&args(&["XACK", "my/jobs/stream", "g", "1-1"]))
                .is_err()
        );
        assert!(
            faults
                .check(&args(&["EVALSHA", &sha, "1", "jobs:pending", "g", "1-1"]))
                .is_err()
        );
        assert!(
            faults
                .check(&args(&["EVAL", script, "1", "q{jobs}", "g", "1-1"]))
                .is_err()
        );
        // Used up; another queue's key was never concerned.
        faults
            .check(&args(&["XACK", "my/jobs/stream", "g", "1-1"]))
            .unwrap();
        faults.refusals.arm("jobs", 1);
        faults.check(&args(&["XACK", "other", "g", "1-1"])).unwrap();
        faults
            .check(&args(&["EVALSHA", "feed", "1", "jobs", "g"]))
            .unwrap();
    }
}
