//! `/openapi.json`: the OpenAPI 3.0 document of the HTTP API.

use serde_json::{Value, json};

fn name(param: &str, what: &str) -> Value {
    json!({ "name": param, "in": "path", "required": true, "description": what,
            "schema": { "type": "string", "minLength": 1 } })
}

fn query(param: &str, what: &str, schema: Value) -> Value {
    json!({ "name": param, "in": "query", "required": false, "description": what, "schema": schema })
}

fn bytes_body(what: &str) -> Value {
    json!({ "description": what, "required": false,
            "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } })
}

fn json_ok(what: &str, schema: Value) -> Value {
    json!({ "description": what, "content": { "application/json": { "schema": schema } } })
}

/// A stream of Server-Sent Events, each `{event, id, data}` (data: a JSON object as text).
fn events(what: &str) -> Value {
    json!({ "description": what, "content": { "text/event-stream": { "schema": {
        "type": "object", "required": ["data"],
        "properties": { "event": { "type": "string" }, "id": { "type": "string" }, "data": { "type": "string" } } } } } })
}

/// The errors every operation may answer, as `{status, error}`.
fn errors(mut responses: Value, codes: &[&str]) -> Value {
    let error = json!({ "$ref": "#/components/responses/Error" });
    for code in [
        "400", "401", "403", "413", "500", "501", "502", "503", "504",
    ]
    .iter()
    .chain(codes)
    {
        responses[*code] = error.clone();
    }
    responses
}

/// The whole document.
pub fn document() -> Value {
    let flag =
        |field: &str| json!({ "type": "object", "properties": { field: { "type": "boolean" } } });
    json!({
        "openapi": "3.0.3",
        "info": { "title": "wrpc-broker serve", "version": env!("CARGO_PKG_VERSION"),
                  "description": "The four capabilities of a wrpc-broker host over HTTP: log, queue, direct, backplane." },
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": { "Error": { "type": "object", "required": ["status", "error"],
                "properties": { "status": { "type": "integer" }, "error": { "type": "string" } } } },
            "responses": { "Error": { "description": "An error: its status and a one-line reason",
                "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } } } }
        },
        "security": [ { "bearer": [] } ],
        "paths": {
            "/v1/log/{topic}": {
                "parameters": [ name("topic", "the feed") ],
                "post": { "summary": "Append an entry; returns its id (a resume token)",
                    "parameters": [ query("key", "the entry's key", json!({ "type": "string" })) ],
                    "requestBody": bytes_body("the value"),
                    "responses": errors(json!({ "201": json_ok("appended", json!({ "type": "object",
                        "required": ["id"], "properties": { "id": { "type": "string" } } })) }), &[]) },
                "get": { "summary": "Read the feed as Server-Sent Events; each event's id resumes strictly after it",
                    "parameters": [
                        { "name": "Last-Event-ID", "in": "header", "required": false, "schema": { "type": "string" } },
                        query("last_event_id", "as the Last-Event-ID header", json!({ "type": "string" })),
                        query("from", "where to start without an id", json!({ "type": "string", "enum": ["earliest", "latest"] }))
                    ],
                    "responses": errors(json!({ "200": events("entries, then live ones") }), &["410"]) }
            },
            "/v1/queue/{queue}": {
                "parameters": [ name("queue", "the queue") ],
                "post": { "summary": "Produce a message", "requestBody": bytes_body("the body"),
                    "responses": errors(json!({ "202": json_ok("queued", flag("queued")) }), &[]) }
            },
            "/v1/queue/{queue}/depth": {
                "parameters": [ name("queue", "the queue") ],
                "get": { "summary": "Messages waiting", "responses": errors(json!({ "200": json_ok("the depth",
                    json!({ "type": "object", "properties": { "queue": { "type": "string" }, "depth": { "type": "integer" } } })) }), &[]) }
            },
            "/v1/queue/{queue}/consume": {
                "parameters": [ name("queue", "the queue"),
                    query("prefetch", "unsettled deliveries at once", json!({ "type": "integer", "minimum": 1, "maximum": 1024 })),
                    query("dead_letter", "where dead letters go", json!({ "type": "string" })) ],
                "get": { "summary": "Consume over a WebSocket (deliveries out, settlements in)",
                    "responses": errors(json!({ "101": { "description": "switching to the WebSocket protocol" } }), &["426"]) }
            },
            "/v1/direct/{address}": {
                "parameters": [ name("address", "the address") ],
                "post": { "summary": "Send a packet (503 when nobody listens)",
                    "parameters": [ query("timeout_ms", "how long the send may take", json!({ "type": "integer", "minimum": 1, "maximum": 300000 })) ],
                    "requestBody": bytes_body("the body"),
                    "responses": errors(json!({ "202": json_ok("sent", flag("sent")) }), &[]) }
            },
            "/v1/direct/{address}/request": {
                "parameters": [ name("address", "the address") ],
                "post": { "summary": "Send a request and wait for the reply",
                    "parameters": [ query("timeout_ms", "how long to wait for the reply", json!({ "type": "integer", "minimum": 1, "maximum": 300000 })) ],
                    "requestBody": bytes_body("the body"),
                    "responses": errors(json!({ "200": { "description": "the reply's body",
                        "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } } }), &[]) }
            },
            "/v1/direct/{address}/listen": {
                "parameters": [ name("address", "the address"),
                    query("group", "listeners of one group compete", json!({ "type": "string" })) ],
                "get": { "summary": "Listen over a WebSocket (packets out, replies in)",
                    "responses": errors(json!({ "101": { "description": "switching to the WebSocket protocol" } }), &["426"]) }
            },
            "/v1/backplane/{channel}": {
                "parameters": [ name("channel", "the channel") ],
                "post": { "summary": "Publish (at most once to each subscriber)", "requestBody": bytes_body("the payload"),
                    "responses": errors(json!({ "202": json_ok("published", flag("published")) }), &[]) },
                "get": { "summary": "Subscribe as Server-Sent Events", "responses": errors(json!({ "200": events("payloads") }), &[]) }
            },
            "/healthz": { "get": { "summary": "The process runs", "security": [],
                "responses": { "200": json_ok("alive", json!({ "type": "object" })) } } },
            "/readyz": { "get": { "summary": "Every consumer and listener is healthy", "security": [],
                "responses": { "200": json_ok("ready", json!({ "type": "object" })), "503": { "$ref": "#/components/responses/Error" } } } },
            "/metrics": { "get": { "summary": "Prometheus metrics", "security": [],
                "responses": { "200": { "description": "text exposition format", "content": { "text/plain": { "schema": { "type": "string" } } } } } } },
            "/openapi.json": { "get": { "summary": "This document", "security": [],
                "responses": { "200": json_ok("the document", json!({ "type": "object" })) } } }
        }
    })
}
