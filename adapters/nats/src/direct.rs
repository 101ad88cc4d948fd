//! `wrpc:broker/direct` on core NATS: address `a` is the subject `P.dx.<enc(a)>` (`inbox()`
//! mints `P.inbox.<generate-id>`), a listener is a SUB on it, in queue group `enc(group)` when
//! grouped (members compete; every ungrouped SUB gets every packet). The body is the payload;
//! headers, correlation id and reply-to ride in NATS headers.
//!
//! A send is a PUB whose NATS reply subject is `P.nr.<instance>.<n>`, unique to this send,
//! followed by a marker PUB to `P.nr.<instance>.m<n>`; the instance has one wildcard SUB on
//! `P.nr.<instance>.>`. The server answers a PUB nobody subscribes to with a 503 status on its
//! reply subject before it routes the marker, so when the marker arrives the send knows whether
//! anyone took the packet: a 503 makes that send `unavailable`. Core NATS holds nothing, so a
//! packet nobody took is gone at once (discard is implicit). A listener is healthy while its
//! subscription stream is open.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::pin::pin;
use std::rc::Rc;

use futures::future::{Either, select};
use wit_bindgen::{StreamReader, StreamResult};

use crate::codec;
use crate::exports::wrpc::broker::direct::{Guest, ListenerId, Packet};
use crate::wrpc::nats::client::{self, Message};
use crate::{Component, DEFAULT_PREFIX, config, nats_error};
use wrpc_broker_guest::relay;
use wrpc_broker_guest::signal::Latch;
use wrpc_broker_guest::{Error, host};

/// How long a send waits for its marker when the caller gave no timeout.
const DEFAULT_SEND_MS: u32 = 5_000;

/// One send waiting for its marker.
#[derive(Default)]
struct Waiter {
    /// Whether the server answered 503 (nobody subscribed).
    no_responders: Cell<bool>,
    /// Set when the marker arrived (or the mux ended).
    done: Latch,
}

/// The instance's no-responders mux: one wildcard subscription and the sends waiting on it.
struct Mux {
    /// `P.nr.<instance>`.
    base: String,
    /// Sends by number.
    waiters: RefCell<BTreeMap<u64, Rc<Waiter>>>,
    /// Set once the subscription is live.
    ready: Latch,
    /// Set once the subscription ended: the next send makes a new mux.
    ended: Latch,
    /// The first send's subscribe error, for the sends that waited on it.
    failed: RefCell<Option<Error>>,
}

thread_local! {
    /// The no-responders mux, made by the first send.
    static MUX: RefCell<Option<Rc<Mux>>> = const { RefCell::new(None) };
    /// The next send number.
    static NEXT_SEND: Cell<u64> = const { Cell::new(1) };
}

/// The live mux, subscribing first if there is none.
async fn mux() -> Result<Rc<Mux>, Error> {
    let current = MUX.with_borrow(|m| m.clone().filter(|m| !m.ended.is_set()));
    let mux = match current {
        Some(mux) => mux,
        None => {
            let base = format!("{}.nr.{}", config()?.prefix, host::generate_id());
            let mux = Rc::new(Mux {
                base,
                waiters: RefCell::new(BTreeMap::new()),
                ready: Latch::new(),
                ended: Latch::new(),
                failed: RefCell::new(None),
            });
            MUX.set(Some(mux.clone()));
            match client::subscribe(format!("{}.>", mux.base), None).await {
                Ok((_, answers)) => {
                    mux.ready.set();
                    wit_bindgen::spawn_local(route(mux.clone(), answers));
                }
                Err(e) => {
                    *mux.failed.borrow_mut() = Some(nats_error(e));
                    mux.ended.set();
                    mux.ready.set();
                }
            }
            mux.clone()
        }
    };
    mux.ready.wait().await;
    let failed = mux.failed.borrow().clone();
    match failed {
        Some(e) => Err(e),
        None => Ok(mux),
    }
}

/// Route 503 answers and markers to the waiting sends, until the subscription ends.
async fn route(mux: Rc<Mux>, mut answers: StreamReader<Message>) {
    let prefix = format!("{}.", mux.base);
    loop {
        let (result, batch) = answers.read(Vec::with_capacity(crate::BATCH)).await;
        for m in batch {
            let Some(token) = m.subject.strip_prefix(&prefix) else {
                continue;
            };
            let (marker, number) = match token.strip_prefix('m') {
                Some(n) => (true, n),
                None => (false, token),
            };
            let Ok(number) = number.parse::<u64>() else {
                continue;
            };
            let Some(waiter) = mux.waiters.borrow().get(&number).cloned() else {
                continue;
            };
            if marker {
                waiter.done.set();
            } else if m.status == Some(503) {
                waiter.no_responders.set(true);
            }
        }
        if !matches!(result, StreamResult::Complete(_)) {
            break;
        }
    }
    mux.ended.set();
    for waiter in mux.waiters.borrow().values() {
        waiter.done.set();
    }
}

/// A broker packet as NATS headers.
fn headers_of(p: &Packet) -> wrpc_broker_guest::Headers {
    let mut headers = Vec::new();
    codec::push_packed(&mut headers, &p.headers);
    if let Some(id) = &p.correlation_id {
        codec::push(
            &mut headers,
            codec::CORRELATION_ID,
            codec::b64(id.as_bytes()),
        );
    }
    if let Some(to) = &p.reply_to {
        codec::push(&mut headers, codec::REPLY_TO, codec::b64(to.as_bytes()));
    }
    headers
}

/// A text field of a packet from its base64url header.
fn text_field(m: &Message, name: &str) -> Option<String> {
    String::from_utf8(codec::unb64(codec::get(&m.headers, name)?)?).ok()
}

/// A NATS message as a broker packet.
fn packet(m: Message) -> Packet {
    Packet {
        headers: codec::unpack(&m.headers),
        correlation_id: text_field(&m, codec::CORRELATION_ID),
        reply_to: text_field(&m, codec::REPLY_TO),
        body: m.payload,
    }
}

/// Turn a batch read from a subscription into the batch the listener's stream gets.
fn deliver(batch: Vec<Message>) -> Vec<Packet> {
    batch
        .into_iter()
        .filter(|m| m.status.is_none())
        .map(packet)
        .collect()
}

/// Stop every live listener (`close`).
pub(crate) async fn stop_all() {
    relay::stop_all_listeners().await;
}

impl Guest for Component {
    fn inbox() -> String {
        let prefix = config().map_or_else(|_| DEFAULT_PREFIX.to_string(), |c| c.prefix.clone());
        wrpc_broker_guest::ids::prefixed(&format!("{prefix}.inbox."))
    }

    async fn send(address: String, message: Packet, timeout_ms: u32) -> Result<(), Error> {
        let subject = config()?.subject("dx", &address)?;
        let mux = mux().await?;
        let number = NEXT_SEND.replace(NEXT_SEND.get() + 1);
        let waiter = Rc::new(Waiter::default());
        mux.waiters.borrow_mut().insert(number, waiter.clone());
        let sent = async {
            let reply = format!("{}.{number}", mux.base);
            client::publish(subject, headers_of(&message), message.body, Some(reply))
                .await
                .map_err(nats_error)?;
            let marker = format!("{}.m{number}", mux.base);
            client::publish(marker, Vec::new(), Vec::new(), None)
                .await
                .map_err(nats_error)?;
            let wait = if timeout_ms == 0 {
                DEFAULT_SEND_MS
            } else {
                timeout_ms
            };
            match select(pin!(waiter.done.wait()), pin!(host::sleep(wait))).await {
                Either::Left(_) if mux.ended.is_set() && !waiter.no_responders.get() => Err(
                    Error::unavailable(format!("{address}: the connection to NATS was lost")),
                ),
                Either::Left(_) if waiter.no_responders.get() => Err(Error::unavailable(format!(
                    "nobody listens on {address} (NATS answered 503 on {}.{number})",
                    mux.base
                ))),
                Either::Left(_) => Ok(()),
                Either::Right(_) => Err(Error::Timeout(format!(
                    "{address}: NATS did not confirm the send within {wait} ms"
                ))),
            }
        };
        let result = sent.await;
        mux.waiters.borrow_mut().remove(&number);
        result
    }

    async fn listen(
        address: String,
        group: Option<String>,
    ) -> Result<(ListenerId, StreamReader<Packet>), Error> {
        let config = config()?;
        if address.is_empty() {
            return Err(Error::bad_request("empty address"));
        }
        let subject = config.subject("dx", &address)?;
        let group = match group {
            Some(g) => Some(config.enc("group", &g)?),
            None => None,
        };
        let (subscription, mut from) = client::subscribe(subject, group)
            .await
            .map_err(nats_error)?;
        let (tx, rx) = crate::wit_stream::new::<Packet>();
        // Stopped: the server stops routing to us first (confirmed: a send after `stop` sees
        // nobody), then what it routed before is handed over.
        let id = relay::spawn_listener(move |stop| async move {
            let relayed = relay::pump(&mut from, tx, deliver);
            relay::until_stopped(relayed, &stop, || client::unsubscribe(subscription)).await;
        });
        Ok((id, rx))
    }

    fn healthy(listener: ListenerId) -> Option<bool> {
        relay::listener_healthy(listener)
    }

    async fn stop(listener: ListenerId) {
        relay::stop_listener(listener).await;
    }
}
