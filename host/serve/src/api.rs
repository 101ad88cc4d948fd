//! The HTTP API: one route per operation of each capability (see [`crate::openapi`]), plus
//! `/healthz`, `/readyz`, `/metrics` and `/openapi.json`. Bodies are the raw bytes of a
//! payload, value or message; what the API sends back is JSON, with bytes as UTF-8 text where
//! they are valid UTF-8 and as base64 (`<field>_base64`) where not.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderName, Method, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use futures::Stream;
use serde_json::{Map, Value, json};
use tower_http::cors::{AllowOrigin, CorsLayer};
use wrpc_broker::{AppendOptions, Packet, ProduceOptions, ReadFrom, SendOptions};

use crate::auth::Access;
use crate::error::ApiError;
use crate::gateway::Shared;

/// The router of the whole API on `gateway`, with bodies capped at `max_body` bytes.
pub fn router(gateway: Shared, max_body: usize) -> Router {
    Router::new()
        .route("/v1/log/{topic}", post(append).get(read))
        .route("/v1/queue/{queue}", post(produce))
        .route("/v1/queue/{queue}/depth", get(depth))
        .route("/v1/queue/{queue}/consume", get(crate::ws::consume))
        .route("/v1/direct/{address}", post(send))
        .route("/v1/direct/{address}/request", post(request))
        .route("/v1/direct/{address}/listen", get(crate::ws::listen))
        .route("/v1/backplane/{channel}", post(publish).get(subscribe))
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({ "status": "ok" })) }),
        )
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .route(
            "/openapi.json",
            get(|| async { axum::Json(crate::openapi::document()) }),
        )
        .fallback(|| async { ApiError::new(404, "no such route (see /openapi.json)") })
        .layer(DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::map_response(json_errors))
        .layer(cors(gateway.clone()))
        .with_state(gateway)
}

/// CORS for the origins of the config in force (read per request, so a reload changes them).
fn cors(gateway: Shared) -> CorsLayer {
    let allowed = AllowOrigin::predicate(move |origin, _| {
        let origins = gateway.config().cors_origins;
        let origin = origin.to_str().unwrap_or_default();
        origins.iter().any(|o| o == "*" || o == origin)
    });
    CorsLayer::new()
        .allow_origin(allowed)
        .allow_methods([Method::GET, Method::POST])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static("last-event-id"),
        ])
}

/// Every error answer as JSON `{status, error}`, also those axum makes itself (413 past the
/// body limit, 405, a malformed query).
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if status.as_u16() < 400 || is_json {
        return response;
    }
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    let reason = match text.trim() {
        "" => status.canonical_reason().unwrap_or("error").to_string(),
        text => text.to_string(),
    };
    ApiError::new(status.as_u16(), reason).into_response()
}

/// Check the request's token for `access` to `name` of `capability`.
pub(crate) fn allow(
    gateway: &Shared,
    headers: &HeaderMap,
    capability: &str,
    access: Access,
    name: &str,
) -> Result<(), ApiError> {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    gateway
        .config()
        .tokens
        .check(authorization, capability, access, name)
}

/// Put `bytes` into `object` as `field` (UTF-8) or `field_base64`.
pub(crate) fn put_bytes(object: &mut Map<String, Value>, field: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => object.insert(field.into(), Value::String(text.into())),
        Err(_) => object.insert(
            format!("{field}_base64"),
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
        ),
    };
}

/// Headers as a JSON list of `[name, value]` pairs (values as text where UTF-8, else base64).
pub(crate) fn headers_json(headers: &[(String, Vec<u8>)]) -> Value {
    Value::Array(
        headers
            .iter()
            .map(|(name, value)| {
                let mut pair = Map::new();
                pair.insert("name".into(), Value::String(name.clone()));
                put_bytes(&mut pair, "value", value);
                Value::Object(pair)
            })
            .collect(),
    )
}

/// Time `call`, count it in the metrics by its outcome, and turn its error into the API's.
async fn observed<T>(
    gateway: &Shared,
    capability: &str,
    operation: &str,
    call: impl Future<Output = wrpc_broker::Result<T>>,
) -> Result<T, ApiError> {
    let started = Instant::now();
    let outcome = call.await;
    gateway
        .metrics
        .observe(capability, operation, started, &outcome);
    outcome.map_err(ApiError::from)
}

async fn append(
    State(gateway): State<Shared>,
    Path(topic): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    allow(&gateway, &headers, "log", Access::Write, &topic)?;
    let log = gateway.broker("log")?.log()?;
    let options = AppendOptions {
        key: query.get("key").map(|k| k.as_bytes().to_vec()),
        ..AppendOptions::default()
    };
    let id = observed(
        &gateway,
        "log",
        "append",
        log.append(&topic, body.to_vec(), options),
    )
    .await?;
    Ok((StatusCode::CREATED, axum::Json(json!({ "id": id }))).into_response())
}

/// Where a read starts: after `Last-Event-ID` (header, or `last_event_id` in the query), else
/// `from=earliest` (the default) or `from=latest`.
fn read_from(query: &HashMap<String, String>, headers: &HeaderMap) -> Result<ReadFrom, ApiError> {
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| query.get("last_event_id").cloned());
    if let Some(id) = last.filter(|id| !id.is_empty()) {
        return Ok(ReadFrom::After(id));
    }
    match query.get("from").map(String::as_str) {
        None | Some("earliest") => Ok(ReadFrom::Earliest),
        Some("latest") => Ok(ReadFrom::Latest),
        Some(other) => Err(ApiError::new(
            400,
            format!("from `{other}`: expected earliest or latest (or a Last-Event-ID)"),
        )),
    }
}

/// Events as a Server-Sent Events response that ends when the server stops.
fn sse(gateway: &Shared, events: impl Stream<Item = Event> + Send + 'static) -> Response {
    let stopping = gateway.stopping.clone().cancelled_owned();
    let events = futures::StreamExt::map(
        futures::StreamExt::take_until(events, stopping),
        Ok::<_, Infallible>,
    );
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

async fn read(
    State(gateway): State<Shared>,
    Path(topic): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    allow(&gateway, &headers, "log", Access::Read, &topic)?;
    let from = read_from(&query, &headers)?;
    let log = gateway.broker("log")?.log()?;
    let reader = observed(&gateway, "log", "read", log.read(&topic, from)).await?;
    let events = futures::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        match reader.next_entry().await {
            Some(Ok(entry)) => {
                let mut data = Map::new();
                data.insert("partition".into(), json!(entry.position.partition));
                data.insert("offset".into(), json!(entry.position.offset));
                put_bytes(&mut data, "value", &entry.value);
                if let Some(key) = &entry.key {
                    put_bytes(&mut data, "key", key);
                }
                data.insert("headers".into(), headers_json(&entry.headers));
                let event = Event::default()
                    .event("entry")
                    .id(entry.id)
                    .data(Value::Object(data).to_string());
                Some((event, Some(reader)))
            }
            Some(Err(e)) => {
                let e = ApiError::from(e);
                let data = json!({ "status": e.status, "error": e.reason }).to_string();
                Some((Event::default().event("error").data(data), None))
            }
            None => None,
        }
    });
    Ok(sse(&gateway, events))
}

async fn produce(
    State(gateway): State<Shared>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    allow(&gateway, &headers, "queue", Access::Write, &queue)?;
    let handle = gateway.broker("queue")?.queue()?;
    let produced = handle.produce(&queue, body.to_vec(), ProduceOptions::default());
    observed(&gateway, "queue", "produce", produced).await?;
    gateway.seen_queue(&queue);
    Ok((StatusCode::ACCEPTED, axum::Json(json!({ "queued": true }))).into_response())
}

async fn depth(
    State(gateway): State<Shared>,
    Path(queue): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    allow(&gateway, &headers, "queue", Access::Read, &queue)?;
    let handle = gateway.broker("queue")?.queue()?;
    let depth = observed(&gateway, "queue", "depth", handle.depth(&queue)).await?;
    Ok(axum::Json(json!({ "queue": queue, "depth": depth })).into_response())
}

fn timeout_ms(query: &HashMap<String, String>, default: u64) -> Result<Duration, ApiError> {
    match query.get("timeout_ms") {
        None => Ok(Duration::from_millis(default)),
        Some(ms) => match ms.parse::<u64>() {
            Ok(ms) if (1..=300_000).contains(&ms) => Ok(Duration::from_millis(ms)),
            _ => Err(ApiError::new(
                400,
                format!("timeout_ms `{ms}`: expected 1 to 300000"),
            )),
        },
    }
}

async fn send(
    State(gateway): State<Shared>,
    Path(address): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    allow(&gateway, &headers, "direct", Access::Write, &address)?;
    let direct = gateway.broker("direct")?.direct()?;
    let packet = Packet {
        body: body.to_vec(),
        headers: vec![],
        correlation_id: None,
        reply_to: None,
    };
    let options = SendOptions {
        timeout: timeout_ms(&query, 5_000)?,
    };
    observed(
        &gateway,
        "direct",
        "send",
        direct.send(&address, packet, options),
    )
    .await?;
    Ok((StatusCode::ACCEPTED, axum::Json(json!({ "sent": true }))).into_response())
}

async fn request(
    State(gateway): State<Shared>,
    Path(address): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    allow(&gateway, &headers, "direct", Access::Write, &address)?;
    let direct = gateway.broker("direct")?.direct()?;
    let timeout = timeout_ms(&query, 5_000)?;
    let reply = direct.request(&address, body.to_vec(), timeout);
    let reply = observed(&gateway, "direct", "request", reply).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        reply.body,
    )
        .into_response())
}

async fn publish(
    State(gateway): State<Shared>,
    Path(channel): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    allow(&gateway, &headers, "backplane", Access::Write, &channel)?;
    let backplane = gateway.broker("backplane")?.backplane()?;
    let published = backplane.publish(&channel, body.to_vec());
    observed(&gateway, "backplane", "publish", published).await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({ "published": true })),
    )
        .into_response())
}

async fn subscribe(
    State(gateway): State<Shared>,
    Path(channel): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    allow(&gateway, &headers, "backplane", Access::Read, &channel)?;
    let backplane = gateway.broker("backplane")?.backplane()?;
    let subscription = observed(
        &gateway,
        "backplane",
        "subscribe",
        backplane.subscribe(&channel),
    )
    .await?;
    let events = futures::StreamExt::map(subscription, |payload| {
        let mut data = Map::new();
        put_bytes(&mut data, "payload", &payload);
        Event::default()
            .event("payload")
            .data(Value::Object(data).to_string())
    });
    Ok(sse(&gateway, events))
}

async fn ready(State(gateway): State<Shared>) -> Response {
    let unhealthy = gateway.health.unhealthy().await;
    if unhealthy.is_empty() {
        axum::Json(json!({ "status": "ready" })).into_response()
    } else {
        ApiError::new(503, format!("not ready: {}", unhealthy.join(", "))).into_response()
    }
}

async fn metrics(State(gateway): State<Shared>) -> Response {
    let queues: Vec<String> = gateway
        .queues_seen
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .cloned()
        .collect();
    if let Ok(queue) = gateway.broker("queue").and_then(|b| Ok(b.queue()?)) {
        for name in queues {
            if let Ok(depth) = queue.depth(&name).await {
                let depth = i64::try_from(depth).unwrap_or(i64::MAX);
                gateway
                    .metrics
                    .queue_depth
                    .with_label_values(&[&name])
                    .set(depth);
            }
        }
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        gateway.metrics.render(),
    )
        .into_response()
}
