//! `wrpc:broker/direct` on Redis pub/sub and lists. An address `a` (`inbox()` mints
//! `{P}.inbox.<id>`) has:
//! - for ungrouped listeners, the channel `{P}:dx:<a>`: each one `SUBSCRIBE`s, so a `PUBLISH`
//!   reaches every one of them;
//! - for each group `g`, the list `{P}:dxq:<enc(a)>:<g>` its members pop with `BLPOP` (one pop
//!   per packet: they compete), the presence channel `{P}:dxp:<enc(a)>:<g>` every member stays
//!   subscribed to while it listens, and `g` in the set `{P}:dxg:<a>`. Each member's `BLPOP`
//!   also waits on a wake-up list of its own, `{P}:dxw:<id>`, which its stop pushes to.
//!
//! A stop loses nothing that reached the listener: an ungrouped one unsubscribes (confirmed),
//! then relays what the subscription still holds; a grouped one wakes its pop and hands over
//! the packet it may have taken (the rest stays in the list for the other members).
//!
//! `send` is one Lua script: for each registered group with a live member (`PUBSUB NUMSUB` of
//! its presence channel) `RPUSH` the packet and `PEXPIRE` the list by the send's timeout (a
//! packet nobody took in time is discarded); groups without members are dropped from the set;
//! then `PUBLISH` to the ungrouped channel. No receiver at all: 503. A packet is one
//! length-prefixed blob (body, headers, correlation id, reply-to). Packets from one sender keep
//! their order: one connection, one list or channel per address.

use std::pin::pin;

use crate::exports::wrpc::broker::direct::{Guest, ListenerId, Packet};
use crate::wrpc::redis::client;
use crate::{
    Component, DEFAULT_PREFIX, Reply, args, blocking, config, eval, get, pipeline, put, redis_error,
};
use futures::future::{Either, select};
use wit_bindgen::{StreamReader, StreamWriter};
use wrpc_broker_guest::relay;
use wrpc_broker_guest::signal::Latch;
use wrpc_broker_guest::{Error, host};

/// Deliver a packet. KEYS: group set, ungrouped channel. ARGV: group-list key prefix,
/// presence channel prefix, packet, timeout ms. Returns how many receivers took it.
pub(crate) const SEND: &str = r#"
local n = 0
for _, g in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local live = redis.call('PUBSUB', 'NUMSUB', ARGV[2] .. g)[2]
  if live > 0 then
    local list = ARGV[1] .. g
    redis.call('RPUSH', list, ARGV[3])
    redis.call('PEXPIRE', list, ARGV[4])
    n = n + 1
  else
    redis.call('SREM', KEYS[1], g)
  end
end
return n + redis.call('PUBLISH', KEYS[2], ARGV[3])
"#;

/// How long one `BLPOP` of a grouped listener blocks, in seconds.
const POP_BLOCK_S: &str = "1";
/// How long a stopped listener's wake-up list lives if its `DEL` never comes (ms).
const WAKE_TTL_MS: &str = "10000";
/// The send timeout used when the caller gives none.
const DEFAULT_TIMEOUT_MS: u32 = 30_000;

/// Stop every live listener (`close`).
pub(crate) async fn stop_all() {
    relay::stop_all_listeners().await;
}

fn put_opt(out: &mut Vec<u8>, value: &Option<String>) {
    match value {
        Some(v) => {
            out.push(1);
            put(out, v.as_bytes());
        }
        None => out.push(0),
    }
}

fn get_opt(data: &[u8], at: &mut usize) -> Option<Option<String>> {
    let flag = *data.get(*at)?;
    *at += 1;
    match flag {
        0 => Some(None),
        _ => Some(Some(String::from_utf8(get(data, at)?.to_vec()).ok()?)),
    }
}

/// A packet as one blob.
fn encode(p: &Packet) -> Vec<u8> {
    let mut out = Vec::with_capacity(p.body.len() + 64);
    put(&mut out, &p.body);
    out.extend(crate::encode_headers(&p.headers));
    put_opt(&mut out, &p.correlation_id);
    put_opt(&mut out, &p.reply_to);
    out
}

/// The packet [`encode`] wrote; `None` for anything else.
fn decode(data: &[u8]) -> Option<Packet> {
    let mut at = 0;
    let body = get(data, &mut at)?.to_vec();
    let headers = crate::decode_headers(data, &mut at)?;
    let correlation_id = get_opt(data, &mut at)?;
    let reply_to = get_opt(data, &mut at)?;
    Some(Packet {
        body,
        headers,
        correlation_id,
        reply_to,
    })
}

/// The composite-key form of an address: no `:`, so `<enc(a)>:<group>` splits one way only.
fn enc(address: &str) -> Result<String, Error> {
    wrpc_broker_guest::ids::encode_token(address, "!-$&-9;-~", '%', 1024)
}

/// Pop a group's list until `stop`, the host drops the stream, or the presence subscription
/// (which keeps the group registered) ends. A stop never cancels a `BLPOP` in flight (the server
/// may already have popped a packet for it): it pushes to `wake`, a list of this listener's own
/// that the `BLPOP` also waits on, so the pop returns at once, with a packet if one came first,
/// and that packet is handed over.
async fn pop(
    list: Vec<u8>,
    wake: Vec<u8>,
    presence: &mut StreamReader<Vec<u8>>,
    mut to: StreamWriter<Packet>,
    stop: Latch,
) {
    while !stop.is_set() {
        let call = args!["BLPOP", &list, &wake, POP_BLOCK_S];
        // The presence channel carries no payloads: its read only ends when the connection is.
        let watch = pin!(presence.read(Vec::with_capacity(1)));
        let waker = pin!(async {
            stop.wait().await;
            let wake_up = args!["RPUSH", &wake, "stop"];
            if let Err(e) = pipeline(vec![wake_up, args!["PEXPIRE", &wake, WAKE_TTL_MS]]).await {
                wrpc_broker_guest::warn!("direct: waking a stopped listener's pop: {e:?}");
            }
            std::future::pending::<()>().await
        });
        let popped = match select(pin!(blocking(call)), select(waker, watch)).await {
            Either::Left((popped, _)) => popped,
            // The presence connection was lost.
            Either::Right(_) => break,
        };
        match popped {
            Ok(Reply::Array(parts)) if parts.first().and_then(Reply::bytes) == Some(&list[..]) => {
                if let Some(packet) = parts.get(1).and_then(Reply::bytes).and_then(decode)
                    && !to.write_all(vec![packet]).await.is_empty()
                {
                    break;
                }
            }
            // The wake-up, or the block ran out.
            Ok(_) => {}
            Err(e) if crate::is_connection_lost(&e) => break,
            Err(e) => {
                wrpc_broker_guest::warn!("direct: BLPOP failed: {e:?}");
                host::sleep(100).await;
            }
        }
    }
    stop.set();
    let _ = crate::cmd(args!["DEL", &wake]).await;
}

impl Guest for Component {
    fn inbox() -> String {
        let prefix = config().map_or_else(|_| DEFAULT_PREFIX.to_string(), |c| c.prefix.clone());
        wrpc_broker_guest::ids::prefixed(&format!("{prefix}.inbox."))
    }

    async fn send(address: String, message: Packet, timeout_ms: u32) -> Result<(), Error> {
        let config = config()?;
        let keys = vec![config.key("dxg", &address)?, config.key("dx", &address)?];
        let token = enc(&address)?;
        let timeout = if timeout_ms == 0 {
            DEFAULT_TIMEOUT_MS
        } else {
            timeout_ms
        };
        let argv = args![
            format!("{{{}}}:dxq:{token}:", config.prefix),
            format!("{{{}}}:dxp:{token}:", config.prefix),
            encode(&message),
            timeout
        ];
        let receivers = eval(SEND, keys, argv).await?.int().unwrap_or(0);
        if receivers == 0 {
            return Err(Error::unavailable(format!("nobody listens on `{address}`")));
        }
        Ok(())
    }

    async fn listen(
        address: String,
        group: Option<String>,
    ) -> Result<(ListenerId, StreamReader<Packet>), Error> {
        let config = config()?;
        let channel = config.key("dx", &address)?;
        let (tx, rx) = crate::wit_stream::new::<Packet>();
        let id = match group {
            None => {
                let (subscription, mut from) =
                    client::subscribe(channel).await.map_err(redis_error)?;
                // Confirmed before `stop` returns: a send after it no longer counts us; what was
                // published before is handed over first.
                relay::spawn_listener(move |stop| async move {
                    let decode_all =
                        |blobs: Vec<Vec<u8>>| blobs.iter().filter_map(|b| decode(b)).collect();
                    let relayed = relay::pump(&mut from, tx, decode_all);
                    relay::until_stopped(relayed, &stop, || client::unsubscribe(subscription))
                        .await;
                })
            }
            Some(group) => {
                if group.is_empty() {
                    return Err(Error::bad_request("empty group name"));
                }
                let token = enc(&address)?;
                let presence = format!("{{{}}}:dxp:{token}:{group}", config.prefix);
                let list = format!("{{{}}}:dxq:{token}:{group}", config.prefix).into_bytes();
                let wake =
                    format!("{{{}}}:dxw:{}", config.prefix, host::generate_id()).into_bytes();
                // Present first, then registered: a sender never drops a group that has a member.
                let (subscription, mut presence) = client::subscribe(presence.into_bytes())
                    .await
                    .map_err(redis_error)?;
                if let Err(e) =
                    crate::cmd(args!["SADD", config.key("dxg", &address)?, &group]).await
                {
                    client::unsubscribe(subscription).await;
                    return Err(e);
                }
                relay::spawn_listener(move |stop| async move {
                    pop(list, wake, &mut presence, tx, stop).await;
                    client::unsubscribe(subscription).await;
                })
            }
        };
        Ok((id, rx))
    }

    fn healthy(listener: ListenerId) -> Option<bool> {
        relay::listener_healthy(listener)
    }

    async fn stop(listener: ListenerId) {
        relay::stop_listener(listener).await;
    }
}
