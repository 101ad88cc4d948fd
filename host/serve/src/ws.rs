//! The WebSocket routes: consuming a queue and listening on a direct address. Frames are JSON
//! text.
//!
//! Queue (`/v1/queue/{queue}/consume?prefetch=16&dead_letter=q`): the server sends
//! `{"type":"delivery","tag":1,"attempt":1,"body":"…","headers":[…]}`; the client settles with
//! `{"type":"ack","tag":1}`, `{"type":"retry","tag":1,"delay_ms":500}`,
//! `{"type":"release","tag":1}` or `{"type":"dead_letter","tag":1,"reason":"…"}`, answered by
//! `{"type":"settled","tag":1,"outcome":"applied"}` (or `already_settled`, or an `error`
//! frame). At most `prefetch` deliveries are unsettled at once; a closed socket releases what
//! it held (redelivered, attempt unchanged).
//!
//! Direct (`/v1/direct/{address}/listen?group=g`): the server sends
//! `{"type":"packet","id":1,"body":"…","request":true}`; the client answers a request with
//! `{"type":"reply","id":1,"body":"…"}`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};
use wrpc_broker::{ConsumeOptions, Delivery, Incoming, ListenOptions, Settled};

use crate::api::{allow, headers_json, put_bytes};
use crate::auth::Access;
use crate::error::ApiError;
use crate::gateway::Shared;

/// A frame the client sends.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ClientFrame {
    Ack { tag: u64 },
    Retry { tag: u64, delay_ms: u64 },
    Release { tag: u64 },
    DeadLetter { tag: u64, reason: String },
    Reply { id: u64, body: String },
}

fn text(value: Value) -> Message {
    Message::Text(value.to_string().into())
}

fn error_frame(reason: impl Into<String>) -> Message {
    text(json!({ "type": "error", "error": reason.into() }))
}

/// A delivery held for the client, and the handler waiting for its settlement.
type Held = (Delivery, oneshot::Sender<()>);

/// `GET /v1/queue/{queue}/consume`: a consumer whose deliveries go to the socket.
pub(crate) async fn consume(
    ws: WebSocketUpgrade,
    State(gateway): State<Shared>,
    Path(queue): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    allow(&gateway, &headers, "queue", Access::Read, &queue)?;
    let prefetch = match query.get("prefetch").map(|p| p.parse::<u32>()) {
        None => 16,
        Some(Ok(p)) if (1..=1024).contains(&p) => p,
        Some(_) => return Err(ApiError::new(400, "prefetch: expected 1 to 1024")),
    };
    let handle = gateway.broker("queue")?.queue()?;
    let (deliveries, mut arrived) = mpsc::channel::<Held>(prefetch as usize);
    let handler = move |delivery: Delivery| {
        let deliveries = deliveries.clone();
        async move {
            let (settled, wait) = oneshot::channel();
            match deliveries.send((delivery, settled)).await {
                // Settled by the socket, or released when it closed. The sender dropped
                // unanswered is a failure, not a success: the consumer must not ack it.
                Ok(()) => wait
                    .await
                    .map_err(|_| anyhow::anyhow!("the socket went away with the delivery"))?,
                // The socket is gone: hand the message back.
                Err(mpsc::error::SendError((delivery, _))) => {
                    let _ = delivery.release().await;
                }
            }
            anyhow::Ok(())
        }
    };
    let options = ConsumeOptions {
        prefetch,
        dead_letter: query.get("dead_letter").cloned(),
    };
    let consumer = Arc::new(handle.consume(&queue, handler, options).await?);
    gateway.seen_queue(&queue);
    gateway.health.add_consumer(&queue, &consumer);
    Ok(ws.on_upgrade(move |mut socket| async move {
        let mut held: HashMap<u64, Held> = HashMap::new();
        let mut next_tag = 0u64;
        let stopping = gateway.stopping.clone();
        loop {
            tokio::select! {
                _ = stopping.cancelled() => break,
                Some((delivery, settled)) = arrived.recv() => {
                    next_tag += 1;
                    let mut frame = Map::new();
                    frame.insert("type".into(), json!("delivery"));
                    frame.insert("tag".into(), json!(next_tag));
                    frame.insert("attempt".into(), json!(delivery.attempt));
                    put_bytes(&mut frame, "body", &delivery.body);
                    frame.insert("headers".into(), headers_json(&delivery.headers));
                    held.insert(next_tag, (delivery, settled));
                    if socket.send(text(Value::Object(frame))).await.is_err() {
                        break;
                    }
                }
                message = socket.recv() => {
                    let Some(Ok(message)) = message else { break };
                    let Some(reply) = settle(&mut held, message).await else { continue };
                    if socket.send(reply).await.is_err() {
                        break;
                    }
                }
            }
        }
        // Closed: what the socket held and what the handlers queued for it go back; a
        // handler that sends after this releases its delivery itself.
        arrived.close();
        let mut handed_back: Vec<Held> = held.into_values().collect();
        while let Some(queued) = arrived.recv().await {
            handed_back.push(queued);
        }
        for (delivery, settled) in handed_back {
            let _ = delivery.release().await;
            let _ = settled.send(());
        }
        consumer.stop().await;
        let _ = socket.send(Message::Close(None)).await;
    }))
}

/// Apply a settlement frame; the frame to answer with, if any.
async fn settle(held: &mut HashMap<u64, Held>, message: Message) -> Option<Message> {
    let frame = match message {
        Message::Text(frame) => frame,
        Message::Close(_) | Message::Ping(_) | Message::Pong(_) => return None,
        Message::Binary(_) => return Some(error_frame("frames are JSON text")),
    };
    let frame: ClientFrame = match serde_json::from_str(&frame) {
        Ok(frame) => frame,
        Err(e) => return Some(error_frame(format!("bad frame: {e}"))),
    };
    let tag = match &frame {
        ClientFrame::Ack { tag }
        | ClientFrame::Retry { tag, .. }
        | ClientFrame::Release { tag }
        | ClientFrame::DeadLetter { tag, .. } => *tag,
        ClientFrame::Reply { .. } => return Some(error_frame("a queue socket takes settlements")),
    };
    let Some((delivery, settled)) = held.remove(&tag) else {
        return Some(error_frame(format!("no unsettled delivery with tag {tag}")));
    };
    let outcome = match frame {
        ClientFrame::Ack { .. } => delivery.ack().await,
        ClientFrame::Retry { delay_ms, .. } => {
            delivery.retry(Duration::from_millis(delay_ms)).await
        }
        ClientFrame::Release { .. } => delivery.release().await,
        ClientFrame::DeadLetter { reason, .. } => delivery.dead_letter(&reason).await,
        ClientFrame::Reply { .. } => unreachable!("answered above"),
    };
    let _ = settled.send(());
    Some(match outcome {
        Ok(Settled::Applied) => text_frame(tag, "applied"),
        Ok(Settled::AlreadySettled { .. }) => text_frame(tag, "already_settled"),
        Err(e) => {
            let e = ApiError::from(e);
            text(json!({ "type": "error", "tag": tag, "status": e.status, "error": e.reason }))
        }
    })
}

fn text_frame(tag: u64, outcome: &str) -> Message {
    text(json!({ "type": "settled", "tag": tag, "outcome": outcome }))
}

/// `GET /v1/direct/{address}/listen`: a listener whose packets go to the socket.
pub(crate) async fn listen(
    ws: WebSocketUpgrade,
    State(gateway): State<Shared>,
    Path(address): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    allow(&gateway, &headers, "direct", Access::Read, &address)?;
    let direct = gateway.broker("direct")?.direct()?;
    let (packets, mut arrived) = mpsc::channel::<Incoming>(64);
    let handler = move |incoming: Incoming| {
        let packets = packets.clone();
        async move {
            let _ = packets.send(incoming).await;
            anyhow::Ok(())
        }
    };
    let options = ListenOptions {
        group: query.get("group").cloned(),
        ..ListenOptions::default()
    };
    let listener = Arc::new(direct.listen(&address, handler, options).await?);
    gateway.health.add_listener(&address, &listener);
    Ok(ws.on_upgrade(move |mut socket: WebSocket| async move {
        let mut requests: HashMap<u64, Incoming> = HashMap::new();
        let mut next_id = 0u64;
        let stopping = gateway.stopping.clone();
        loop {
            tokio::select! {
                _ = stopping.cancelled() => break,
                Some(incoming) = arrived.recv() => {
                    next_id += 1;
                    let mut frame = Map::new();
                    frame.insert("type".into(), json!("packet"));
                    frame.insert("id".into(), json!(next_id));
                    put_bytes(&mut frame, "body", &incoming.packet.body);
                    frame.insert("headers".into(), headers_json(&incoming.packet.headers));
                    frame.insert("request".into(), json!(incoming.packet.reply_to.is_some()));
                    if incoming.packet.reply_to.is_some() {
                        requests.insert(next_id, incoming);
                    }
                    if socket.send(text(Value::Object(frame))).await.is_err() {
                        break;
                    }
                }
                message = socket.recv() => {
                    let Some(Ok(message)) = message else { break };
                    let Message::Text(frame) = message else { continue };
                    let answer = match serde_json::from_str::<ClientFrame>(&frame) {
                        Ok(ClientFrame::Reply { id, body }) => match requests.remove(&id) {
                            Some(incoming) => match incoming.reply(body.into_bytes()).await {
                                Ok(()) => None,
                                Err(e) => Some(error_frame(e.to_string())),
                            },
                            None => Some(error_frame(format!("no request with id {id}"))),
                        },
                        Ok(_) => Some(error_frame("a listener socket takes replies")),
                        Err(e) => Some(error_frame(format!("bad frame: {e}"))),
                    };
                    if let Some(answer) = answer
                        && socket.send(answer).await.is_err()
                    {
                        break;
                    }
                }
            }
        }
        listener.stop().await;
        let _ = socket.send(Message::Close(None)).await;
    }))
}
