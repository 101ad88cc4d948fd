//! `wrpc-broker serve` end to end, through clients nobody here wrote: curl for HTTP and
//! Server-Sent Events, the `websockets` package (Python, pinned in scripts/test.sh) for a queue
//! consumer. The server is the real binary, stopped with SIGTERM, reloaded by editing its file
//! and by SIGHUP.

#[path = "serve/support.rs"]
mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{
    ADMIN, READER, Server, append, bearer, curl, events, json, post, values, write_config,
};

#[test]
fn every_capability_answers_curl_with_its_contract_and_its_errors() {
    let server = Server::start(
        "[broker]\nurl = \"memory://\"\noptions = { \"retention.maxEntries\" = \"3\" }",
    );
    let feed = server.url("/v1/log/orders.eu");
    let first = append(&server, "orders.eu", "one");
    append(&server, "orders.eu", "two");
    // A reader token reads `orders.*` from the start, and resumes strictly after an id.
    let all = events(&feed, READER, "1", &[]);
    assert_eq!(values(&all), ["one", "two"], "{all:?}");
    assert_eq!(all[0].0, first, "an event's id is the entry's resume token");
    let resumed = events(
        &feed,
        READER,
        "1",
        &["-H", &format!("Last-Event-ID: {first}")],
    );
    assert_eq!(values(&resumed), ["two"]);
    // Its errors: 401, 403 (write, and another feed), 400 for a malformed id, 410 once trimmed.
    assert_eq!(curl(&feed, &["-X", "POST", "--data-binary", "x"]).0, 401);
    let (status, body) = post(&feed, READER, "x");
    assert_eq!(
        (status, json(&body)["status"].as_u64()),
        (403, Some(403)),
        "{body}"
    );
    assert_eq!(
        curl(&server.url("/v1/log/invoices"), &["-H", &bearer(READER)]).0,
        403
    );
    let (status, body) = curl(
        &format!("{feed}?last_event_id=nonsense"),
        &["-H", &bearer(READER)],
    );
    assert_eq!(status, 400, "{body}");
    assert!(!json(&body)["error"].as_str().unwrap_or("").contains('\n'));
    for n in 0..5 {
        append(&server, "orders.eu", &format!("more {n}"));
    }
    let (status, body) = curl(
        &format!("{feed}?last_event_id={first}"),
        &["-H", &bearer(READER)],
    );
    assert_eq!(status, 410, "{body}");
    // 413 past the body limit, as JSON.
    let big = "x".repeat(5000);
    let (status, body) = post(&feed, ADMIN, &big);
    assert_eq!(
        (status, json(&body)["status"].as_u64()),
        (413, Some(413)),
        "{body}"
    );

    // Direct: 503 with nobody listening; the queue: produce and depth; the backplane over SSE.
    let (status, body) = post(&server.url("/v1/direct/nobody"), ADMIN, "hi");
    assert_eq!(status, 503, "{body}");
    for n in 0..3 {
        assert_eq!(
            post(&server.url("/v1/queue/jobs"), ADMIN, &format!("job {n}")).0,
            202
        );
    }
    let (_, body) = curl(&server.url("/v1/queue/jobs/depth"), &["-H", &bearer(ADMIN)]);
    assert_eq!(json(&body)["depth"], 3, "{body}");
    let room = server.url("/v1/backplane/room:lobby");
    let subscriber = std::thread::spawn({
        let room = room.clone();
        move || events(&room, ADMIN, "2", &[])
    });
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(post(&room, ADMIN, "hello").0, 202);
    let got = subscriber.join().expect("the subscriber");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(json(&got[0].1)["payload"], "hello");

    // Health, metrics and the OpenAPI document.
    assert_eq!(curl(&server.url("/readyz"), &[]).0, 200);
    let (_, metrics) = curl(&server.url("/metrics"), &[]);
    assert!(
        metrics.contains(
            "wrpc_serve_operations_total{capability=\"log\",operation=\"append\",outcome=\"ok\"} 7"
        ) && metrics.contains("wrpc_serve_queue_depth{queue=\"jobs\"} 3")
            && metrics.contains("wrpc_serve_operation_seconds_bucket"),
        "{metrics}"
    );
    let (_, doc) = curl(&server.url("/openapi.json"), &[]);
    assert!(json(&doc)["paths"]["/v1/log/{topic}"]["get"].is_object());
    let (status, body) = curl(&server.url("/v1/nothing"), &[]);
    assert_eq!((status, json(&body)["status"].as_u64()), (404, Some(404)));
    let (status, _) = server.terminate();
    assert!(status.success(), "exit after SIGTERM: {status}");
}

fn python_client(
    server: &Server,
    queue: &str,
    prefetch: u32,
    count: usize,
    hold: bool,
) -> serde_json::Value {
    let url = server
        .url(&format!("/v1/queue/{queue}/consume?prefetch={prefetch}"))
        .replace("http://", "ws://");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/serve/queue_client.py");
    let mut command = Command::new("python3");
    command.arg(script).args([&url, ADMIN, &count.to_string()]);
    if hold {
        command.arg("hold");
    }
    let output = command.output().expect("running python3");
    assert!(
        output.status.success(),
        "the Python client failed: {}\nserve log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        server.log()
    );
    json(String::from_utf8_lossy(&output.stdout).trim())
}

/// Queue `bodies` on `queue`; one socket takes a delivery and closes without settling it, then
/// another consumes until every body but `dead` is acked: the held delivery, the consumer's
/// report, and the acked bodies sorted.
fn hold_one_then_consume(
    server: &Server,
    queue: &str,
    prefetch: u32,
    bodies: &[impl AsRef<str>],
) -> (serde_json::Value, serde_json::Value, Vec<String>) {
    for body in bodies {
        let url = server.url(&format!("/v1/queue/{queue}"));
        assert_eq!(post(&url, ADMIN, body.as_ref()).0, 202);
    }
    let held = python_client(server, queue, prefetch, 1, true);
    assert_eq!(held["attempt"], 1, "{held}");
    let got = python_client(server, queue, prefetch, bodies.len(), false);
    let mut acked: Vec<String> = serde_json::from_value(got["acked"].clone()).expect("acked");
    acked.sort();
    (held, got, acked)
}

#[test]
fn a_python_websocket_client_consumes_with_retry_and_dead_letter() {
    let server = Server::start("[broker]\nurl = \"memory://\"");
    // One delivery held by a socket that closes without settling it comes back, attempt 1.
    let (held, got, acked) =
        hold_one_then_consume(&server, "work", 4, &["a", "retry", "b", "dead", "c"]);
    assert_eq!(acked, ["a", "b", "c", "retry"], "{got}");
    assert_eq!(got["attempts"]["retry"], serde_json::json!([1, 2]), "{got}");
    let held_body = held["held"].as_str().expect("a body");
    assert_eq!(
        got["attempts"][held_body][0], 1,
        "released with its attempt unchanged: {got}"
    );
    let depth = |queue: &str| {
        let (_, body) = curl(
            &server.url(&format!("/v1/queue/{queue}/depth")),
            &["-H", &bearer(ADMIN)],
        );
        json(&body)["depth"].as_u64()
    };
    server.wait_for(|| depth("work") == Some(0), "the queue to be empty");
    assert_eq!(depth("work.dead"), Some(1), "the dead letter");
}

#[test]
fn a_socket_closed_with_deliveries_on_their_way_hands_every_one_back() {
    let server = Server::start("[broker]\nurl = \"memory://\"");
    let bodies: Vec<String> = (0..300).map(|i| format!("m{i:03}")).collect();
    // The server has up to 256 deliveries on their way to a socket that closes after one.
    let (_, _, acked) = hold_one_then_consume(&server, "burst", 256, &bodies);
    assert_eq!(
        acked, bodies,
        "every message handed back, none acked unseen"
    );
}

#[test]
fn an_edited_config_swaps_the_adapter_migrates_the_broker_and_a_bad_one_is_refused() {
    let prefix = format!("serve{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let memory =
        format!("[broker]\nurl = \"memory://{prefix}\"\noptions = {{ prefix = \"{prefix}\" }}");
    let server = Server::start(&memory);
    append(&server, "orders.a", "before");
    // A new adapter file: swapped in.
    let wasm = server.dir.join("memory.wasm");
    std::fs::write(
        &wasm,
        wrpc_broker::drivers::embedded_adapter("memory://").expect("embedded"),
    )
    .expect("the adapter file");
    write_config(&server, &format!("{memory}\ncomponent = \"memory.wasm\""));
    server.wait_for(|| server.log().contains("config applied"), "the swap");
    assert!(
        server.log().contains("swapped the adapter"),
        "{}",
        server.log()
    );
    append(&server, "orders.a", "after swap");
    let read = events(&server.url("/v1/log/orders.a"), ADMIN, "1", &[]);
    assert_eq!(values(&read), ["before", "after swap"]);
    // A bad config: refused, the running one stays.
    std::fs::write(server.dir.join("serve.toml"), "listen = 42").expect("a bad config");
    server.wait_for(|| server.log().contains("config refused"), "the refusal");
    append(&server, "orders.a", "still served");
    // Another broker URL, applied on SIGHUP too: migrated, the log goes on on Redis.
    let redis = format!(
        "[broker]\nurl = \"redis://127.0.0.1:6379\"\noptions = {{ prefix = \"{prefix}\" }}"
    );
    write_config(&server, &redis);
    let pid = server.child.id().to_string();
    Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .expect("kill");
    // The second "config applied" (the swap's was the first; its line has a `migrated=[]`
    // field, so "migrated" alone is in the log before the migration ran).
    server.wait_for(
        || server.log().matches("config applied").count() >= 2,
        "the migration",
    );
    let id = append(&server, "orders.a", "on redis");
    assert!(!id.is_empty());
    let (_, metrics) = curl(&server.url("/metrics"), &[]);
    assert!(
        metrics.contains("wrpc_serve_swaps_total 1")
            && metrics.contains("wrpc_serve_migrations_total 1")
            && metrics.contains("wrpc_serve_reloads_refused_total 1"),
        "{metrics}"
    );
}

#[test]
fn sigterm_hands_unsettled_work_back_and_a_restarted_server_resumes_the_feed() {
    let prefix = format!("serve{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let redis = format!(
        "[broker]\nurl = \"redis://127.0.0.1:6379\"\noptions = {{ prefix = \"{prefix}\" }}"
    );
    let server = Server::start(&redis);
    for n in 0..3 {
        append(&server, "orders.r", &format!("entry {n}"));
    }
    let read = events(&server.url("/v1/log/orders.r"), ADMIN, "1", &[]);
    let last = read.last().expect("an entry").0.clone();
    assert_eq!(post(&server.url("/v1/queue/jobs"), ADMIN, "job").0, 202);
    // A consumer that takes the job and never settles it, then the server stops.
    let url = server
        .url("/v1/queue/jobs/consume")
        .replace("http://", "ws://");
    let mut holder = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import json,time\nfrom websockets.sync.client import connect\n\
             ws = connect('{url}', additional_headers={{'Authorization': 'Bearer {ADMIN}'}})\n\
             print(json.loads(ws.recv(timeout=20))['body'], flush=True)\ntime.sleep(60)\n"
        ))
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().expect("stdout")),
        &mut line,
    )
    .expect("the held job");
    assert_eq!(line.trim(), "job");
    let (dir, port) = (server.dir.clone(), server.port);
    let started = Instant::now();
    let (status, log) = server.terminate();
    assert!(status.success(), "exit after SIGTERM: {status}\n{log}");
    eprintln!("serve stopped {:?} after SIGTERM", started.elapsed());
    let _ = holder.kill();
    let _ = holder.wait();
    let server = Server::start_in(dir, port);
    // The job went back to Redis; the feed resumes after the last id seen, without a gap.
    let (_, body) = curl(&server.url("/v1/queue/jobs/depth"), &["-H", &bearer(ADMIN)]);
    assert_eq!(json(&body)["depth"], 1, "the unsettled job is back: {body}");
    append(&server, "orders.r", "entry 3");
    let resumed = events(
        &server.url("/v1/log/orders.r"),
        ADMIN,
        "1",
        &["-H", &format!("Last-Event-ID: {last}")],
    );
    assert_eq!(values(&resumed), ["entry 3"]);
}

#[test]
fn a_websocket_listener_answers_requests_and_a_capability_can_sit_on_another_broker() {
    let server = Server::start(
        "[broker]\nurl = \"memory://\"\n[backplane]\nurl = \"redis://127.0.0.1:6379\"",
    );
    assert!(
        server.log().contains("capabilities=backplane") && server.log().contains("redis"),
        "it logs what it serves: {}",
        server.log()
    );
    let url = server
        .url("/v1/direct/svc/listen?group=workers")
        .replace("http://", "ws://");
    let mut listener = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import json\nfrom websockets.sync.client import connect\n\
             ws = connect('{url}', additional_headers={{'Authorization': 'Bearer {ADMIN}'}})\n\
             print('listening', flush=True)\n\
             for _ in range(2):\n    p = json.loads(ws.recv(timeout=20))\n    \
             print(p['body'], p['request'], flush=True)\n    \
             if p['request']: ws.send(json.dumps({{'type': 'reply', 'id': p['id'], 'body': p['body'].upper()}}))\n\
             import time; time.sleep(1)\n"
        ))
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut out = std::io::BufReader::new(listener.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).expect("listening");
    assert_eq!(line.trim(), "listening");
    server.wait_for(
        || post(&server.url("/v1/direct/svc"), ADMIN, "note").0 == 202,
        "the listener to be registered",
    );
    let (status, reply) = post(
        &server.url("/v1/direct/svc/request?timeout_ms=5000"),
        ADMIN,
        "ping",
    );
    assert_eq!((status, reply.as_str()), (200, "PING"), "{}", server.log());
    let _ = listener.wait();
    let mut seen = String::new();
    std::io::Read::read_to_string(&mut out, &mut seen).expect("its output");
    assert_eq!(
        seen.lines().collect::<Vec<_>>(),
        ["note False", "ping True"]
    );
    // The backplane on Redis: a subscriber over SSE gets what is published.
    let room = server.url("/v1/backplane/room:redis");
    let subscriber = std::thread::spawn({
        let room = room.clone();
        move || events(&room, ADMIN, "2", &[])
    });
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(post(&room, ADMIN, "over redis").0, 202);
    let got = subscriber.join().expect("the subscriber");
    assert_eq!(got.len(), 1, "{got:?}");
}

/// Schemathesis (PyPI, pinned in scripts/test.sh) against the OpenAPI document: no 5xx, and no
/// status, content type or body outside what the document says. The direct operations answer
/// 503 when nobody listens, as their contract says, so there the 5xx check is left out (their
/// 503 must still be a documented response with an Error body).
#[test]
fn schemathesis_finds_no_server_error_and_no_response_outside_the_document() {
    let server = Server::start("[broker]\nurl = \"memory://\"");
    let doc = server.url("/openapi.json");
    let conformance =
        "status_code_conformance,content_type_conformance,response_schema_conformance";
    for (filter, pattern, checks) in [
        (
            "--exclude-path-regex",
            "^/v1/direct/",
            format!("not_a_server_error,{conformance}"),
        ),
        (
            "--include-path-regex",
            "^/v1/direct/",
            conformance.to_string(),
        ),
    ] {
        let output = Command::new("schemathesis")
            .args([
                "run",
                &doc,
                "-H",
                &bearer(ADMIN),
                "--checks",
                &checks,
                filter,
                pattern,
            ])
            .args(["-n", "10", "--seed", "1", "--request-timeout", "2"])
            .env("NO_COLOR", "1")
            // Its cache of crashes goes to the working directory: not the repository's.
            .current_dir(std::env::temp_dir())
            .output()
            .expect("running schemathesis (scripts/test.sh installs it)");
        let out = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && out.contains("passed"),
            "schemathesis {filter} {pattern}:\n{out}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

fn chromium() -> &'static str {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            Command::new("which")
                .arg(c)
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("chromium (scripts/test.sh installs Debian's)")
}

/// Debian's Chromium, headless, follows a feed with its own `EventSource` across a restart of
/// `serve`: it reconnects by itself with `Last-Event-ID` and gets every entry once, in order.
/// The page is a file (origin `null`), let in by the config's `cors_origins`.
#[test]
fn a_browser_eventsource_follows_a_feed_across_a_restart_without_gap_or_duplicate() {
    let prefix = format!("serve{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let redis = format!(
        "open\n[broker]\nurl = \"redis://127.0.0.1:6379\"\noptions = {{ prefix = \"{prefix}\" }}"
    );
    let server = Server::start(&redis);
    let topic = "orders.browser";
    for n in 1..=3 {
        append(&server, topic, &n.to_string());
    }
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/serve/feed.html");
    let url = format!(
        "file://{}?base={}&topic={topic}",
        page.display(),
        server.base
    );
    let profile = server.dir.join("chromium");
    let mut browser = Command::new(chromium())
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-web-security",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(&url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting chromium");
    // What the page reported last: the longest list it posted to `<topic>.seen`.
    let seen = |server: &Server| -> Vec<String> {
        let reports = events(
            &server.url(&format!("/v1/log/{topic}.seen")),
            ADMIN,
            "1",
            &[],
        );
        reports
            .iter()
            .filter_map(|(_, data)| json(data)["value"].as_str().map(str::to_string))
            .filter_map(|list| serde_json::from_str::<Vec<String>>(&list).ok())
            .max_by_key(Vec::len)
            .unwrap_or_default()
    };
    server.wait_for(
        || seen(&server).len() == 3,
        "the browser to read the first entries",
    );
    let (dir, port) = (server.dir.clone(), server.port);
    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");
    std::thread::sleep(Duration::from_secs(1));
    let server = Server::start_in(dir, port);
    for n in 4..=5 {
        append(&server, topic, &n.to_string());
    }
    server.wait_for(
        || seen(&server).len() >= 5,
        "the browser to reconnect and read on",
    );
    std::thread::sleep(Duration::from_secs(1));
    let _ = browser.kill();
    let _ = browser.wait();
    assert_eq!(
        seen(&server),
        ["1", "2", "3", "4", "5"],
        "every entry once, in order"
    );
}
