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

/// How long making a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a plain command may wait for its reply before the connection counts as lost.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle dedicated connections kept for blocking commands.
const POOL_MAX: usize = 16;

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
        (Some("LOADING"), _) => CallError::ConnectionLost(e.to_string()),
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
    /// Commands to refuse (tests); shared by every driver of one URL in this process.
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

    /// One command on the shared connection.
    pub(crate) async fn command(&self, args: &[Vec<u8>]) -> Result<Value, CallError> {
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
    /// reply stays in its place as a `Value::ServerError`).
    pub(crate) async fn pipeline(
        &self,
        commands: &[Vec<Vec<u8>>],
    ) -> Result<Vec<Value>, CallError> {
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

    /// One blocking command on a dedicated connection from the pool. The connection goes back
    /// to the pool only when the reply arrived; a call dropped midway takes it down with it.
    pub(crate) async fn blocking(&self, args: &[Vec<u8>]) -> Result<Value, CallError> {
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
/// counts as a lost connection (try again), anything else is the server's answer.
fn reply_error(value: Value) -> CallError {
    let text = server_text(value);
    if text.starts_with("LOADING") {
        CallError::ConnectionLost(text)
    } else {
        CallError::Server(text)
    }
}

/// The fault injector: rules that refuse matching commands a number of times.
#[derive(Default)]
pub(crate) struct Faults {
    rules: Mutex<Vec<(String, u32)>>,
}

/// The fault injectors by URL: every driver connected to one URL shares one, so a test can
/// inject faults into host instances it opened through [`crate::BrokerBuilder::url`].
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

    pub(crate) fn refuse_next(&self, pattern: &str, count: u32) {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        rules.retain(|(p, _)| p != pattern);
        if count > 0 {
            rules.push((pattern.to_string(), count));
        }
    }

    /// `Err(refused)` when a rule matches `args` (and counts it down).
    fn check(&self, args: &[Vec<u8>]) -> Result<(), CallError> {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        if rules.is_empty() {
            return Ok(());
        }
        let text = args
            .iter()
            .map(|a| String::from_utf8_lossy(a))
            .collect::<Vec<_>>()
            .join(" ");
        let Some(i) = rules
            .iter()
            .position(|(p, _)| glob(p.as_bytes(), text.as_bytes()))
        else {
            return Ok(());
        };
        rules[i].1 -= 1;
        let pattern = if rules[i].1 == 0 {
            rules.remove(i).0
        } else {
            rules[i].0.clone()
        };
        Err(CallError::Refused(format!(
            "refused by fault injection (rule `{pattern}`)"
        )))
    }
}

/// Whether `text` matches the glob `pattern` (`*`: any run, `?`: any one byte).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn glob_matches_runs_and_single_characters() {
        assert!(glob(
            b"EVALSHA * {wrpc}:q:a *wrpc-settle*",
            b"EVALSHA abc 2 {wrpc}:q:a x wrpc-settle ack"
        ));
        assert!(!glob(
            b"EVALSHA * {wrpc}:q:a *wrpc-settle*",
            b"XREADGROUP GROUP wrpc c {wrpc}:q:a >"
        ));
        assert!(glob(b"a?c", b"abc"));
        assert!(!glob(b"a?c", b"abbc"));
        assert!(glob(b"*", b""));
    }
}
