//! Small helpers the contract tests share: bounded waits, retries, unique names, readable
//! assertions.

use std::time::Duration;

use anyhow::{Context as _, bail};
use futures::{Stream, StreamExt};

/// How long a test waits for something that should arrive.
pub const ARRIVAL: Duration = Duration::from_secs(10);
/// How long a test listens to conclude that nothing arrives.
pub const SILENCE: Duration = Duration::from_millis(300);

/// A name no other test (or earlier run on a real broker) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// The next item of `stream`, or an error saying what did not arrive.
pub async fn next<S: Stream + Unpin>(stream: &mut S, what: &str) -> anyhow::Result<S::Item> {
    next_within(stream, ARRIVAL, what).await
}

/// The next item of `stream` within `within`, or an error saying what did not arrive.
pub async fn next_within<S: Stream + Unpin>(
    stream: &mut S,
    within: Duration,
    what: &str,
) -> anyhow::Result<S::Item> {
    tokio::time::timeout(within, stream.next())
        .await
        .with_context(|| format!("{what}: nothing arrived within {within:?}"))?
        .with_context(|| format!("{what}: the stream ended"))
}

/// Call `f` until it succeeds, for `within` at most (a restarted server may still be loading);
/// the error says `what` failed, and how the last try did.
pub async fn retry<T, E, F, Fut>(within: Duration, what: &str, mut f: F) -> anyhow::Result<T>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match f().await {
            Ok(value) => return Ok(value),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                bail!("{what}: still failing after {within:?}: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Fail if `stream` yields anything within [`SILENCE`].
pub async fn silence<S: Stream + Unpin>(stream: &mut S, what: &str) -> anyhow::Result<()>
where
    S::Item: std::fmt::Debug,
{
    match tokio::time::timeout(SILENCE, stream.next()).await {
        Err(_) => Ok(()),
        Ok(None) => bail!("{what}: the stream ended"),
        Ok(Some(item)) => bail!("{what}: expected nothing, got {item:?}"),
    }
}

/// `ensure!` for equality, with both sides in the message.
#[macro_export]
macro_rules! ensure_eq {
    ($left:expr, $right:expr, $($what:tt)+) => {{
        let (left, right) = (&$left, &$right);
        if left != right {
            anyhow::bail!("{}: expected {:?}, got {:?}", format!($($what)+), right, left);
        }
    }};
}

/// A tokio channel receiver, bounded or not.
pub trait Receive {
    /// What it yields.
    type Item;
    /// The next item; `None` once every sender is gone.
    fn receive(&mut self) -> impl std::future::Future<Output = Option<Self::Item>> + Send;
}

impl<T: Send> Receive for tokio::sync::mpsc::Receiver<T> {
    type Item = T;
    fn receive(&mut self) -> impl std::future::Future<Output = Option<T>> + Send {
        self.recv()
    }
}

impl<T: Send> Receive for tokio::sync::mpsc::UnboundedReceiver<T> {
    type Item = T;
    fn receive(&mut self) -> impl std::future::Future<Output = Option<T>> + Send {
        self.recv()
    }
}

/// The next item of a channel, or an error saying what did not arrive.
pub async fn recv<R: Receive>(rx: &mut R, what: &str) -> anyhow::Result<R::Item> {
    tokio::time::timeout(ARRIVAL, rx.receive())
        .await
        .with_context(|| format!("{what}: nothing arrived within {ARRIVAL:?}"))?
        .with_context(|| format!("{what}: the channel closed"))
}
