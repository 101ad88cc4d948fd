//! The instance's channels. Publishing, declaring and binding share one confirm channel
//! ([`shared`]), opened on first use and opened again when the broker closed it (a channel error,
//! a lost connection); passive declares that may fail get a channel of their own ([`probe`]), so
//! a 404 never closes the shared one. Consumers each open a channel of their own ([`open`]), so a
//! `basic.qos` and an `ack(multiple)` concern that consumer only.

use std::cell::Cell;
use std::future::Future;

use crate::amqp_error;
use crate::wrpc::amqp::client::{self, AmqpError};
use wrpc_broker_guest::{Error, host};

/// A channel the instance keeps open for many calls.
pub(crate) struct Kept {
    /// Whether it is in confirm mode.
    confirms: bool,
    /// The open channel, if any.
    id: Cell<Option<u64>>,
}

/// How long a channel is waited for while the broker is unreachable, in milliseconds.
pub(crate) const UNREACHABLE_MS: u64 = 15_000;
/// The pause between tries, in milliseconds.
pub(crate) const RETRY_MS: u32 = 200;

thread_local! {
    static SHARED: &'static Kept = Box::leak(Box::new(Kept::new(true)));
    static PROBE: &'static Kept = Box::leak(Box::new(Kept::new(false)));
}

/// The shared confirm channel.
pub(crate) fn shared() -> &'static Kept {
    SHARED.with(|k| *k)
}

/// The channel for passive declares.
pub(crate) fn probe() -> &'static Kept {
    PROBE.with(|k| *k)
}

/// Open a channel; while the broker is unreachable (a restart), tried again every
/// [`RETRY_MS`] for up to [`UNREACHABLE_MS`].
async fn open_channel(confirms: bool) -> Result<u64, AmqpError> {
    let deadline = host::now_ms() + UNREACHABLE_MS;
    loop {
        match client::open_channel(confirms).await {
            Err(AmqpError::Unavailable(why)) if host::now_ms() < deadline => {
                crate::debug(&format!("no channel ({why}), trying again"));
                host::sleep(RETRY_MS).await;
            }
            answer => return answer,
        }
    }
}

/// Open a channel of its own with `basic.qos(prefetch)`.
pub(crate) async fn open(prefetch: u16) -> Result<u64, Error> {
    let id = open_channel(false).await.map_err(amqp_error)?;
    if let Err(e) = client::qos(id, prefetch).await {
        client::close_channel(id).await;
        return Err(amqp_error(e));
    }
    Ok(id)
}

impl Kept {
    fn new(confirms: bool) -> Self {
        Self {
            confirms,
            id: Cell::new(None),
        }
    }

    /// The open channel, opening one when there is none (another call may open one meanwhile:
    /// the first one set is kept).
    async fn get(&self) -> Result<u64, Error> {
        if let Some(id) = self.id.get() {
            return Ok(id);
        }
        let id = open_channel(self.confirms).await.map_err(amqp_error)?;
        match self.id.get() {
            Some(kept) => {
                client::close_channel(id).await;
                Ok(kept)
            }
            None => {
                self.id.set(Some(id));
                Ok(id)
            }
        }
    }

    /// Forget channel `id` (closed by the broker) and close it on the driver.
    async fn drop_channel(&self, id: u64) {
        if self.id.get() == Some(id) {
            self.id.set(None);
        }
        client::close_channel(id).await;
    }

    /// Make `op` on the channel; when the channel was closed, once more on a new one, and
    /// while the error passes by itself (a restarting broker), again every [`RETRY_MS`] for up
    /// to [`UNREACHABLE_MS`].
    pub(crate) async fn call<T, F, Fut>(&self, op: F) -> Result<T, Error>
    where
        F: Fn(u64) -> Fut,
        Fut: Future<Output = Result<T, AmqpError>>,
    {
        let deadline = host::now_ms() + UNREACHABLE_MS;
        let mut reopened = false;
        loop {
            let id = self.get().await?;
            let e = match op(id).await {
                Err(e) => e,
                answer => return answer.map_err(amqp_error),
            };
            if let AmqpError::Closed(why) = &e {
                crate::debug(&format!(
                    "channel {id} closed ({} {}), reopening",
                    why.code, why.text
                ));
                self.drop_channel(id).await;
            }
            if crate::transient(&e) && host::now_ms() < deadline {
                host::sleep(RETRY_MS).await;
            } else if matches!(e, AmqpError::Closed(_)) && !reopened {
                reopened = true;
            } else {
                return Err(amqp_error(e));
            }
        }
    }

    /// Make `op` once; a closed channel is replaced for the next call, and the error returned
    /// as the driver's (a passive declare of a missing queue answers 404 this way).
    pub(crate) async fn try_once<T, F, Fut>(&self, op: F) -> Result<T, AmqpError>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = Result<T, AmqpError>>,
    {
        let id = self
            .get()
            .await
            .map_err(|e| AmqpError::Unavailable(format!("{e:?}")))?;
        let answer = op(id).await;
        if let Err(AmqpError::Closed(_)) = &answer {
            self.drop_channel(id).await;
        }
        answer
    }
}

thread_local! {
    static LISTEN: &'static Kept = Box::leak(Box::new(Kept::new(false)));
}

/// The channel the backplane and direct listeners consume on (without acks).
pub(crate) fn listen() -> &'static Kept {
    LISTEN.with(|k| *k)
}
