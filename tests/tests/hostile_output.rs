//! What a hostile component makes the host say and hold: a panic's message in the trap (for the
//! call that panicked and every call in flight), a memory bomb stopped at the instance's cap,
//! lines of `host.log` and stdout cut at 64 KiB under the adapter's own target from its first
//! instance on, and anything but a component refused as such.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use wrpc_broker::bindings::log::RecordIn;
use wrpc_broker::{Broker, Error, Limits};
use wrpc_broker_contract::components;

fn record() -> RecordIn {
    RecordIn {
        value: b"x".to_vec(),
        headers: vec![],
        key: None,
    }
}

async fn probe(limits: Limits) -> Broker {
    Broker::builder()
        .component_file(components::PROBE)
        .limits(limits)
        .open()
        .await
        .expect("the probe opens")
}

#[tokio::test]
async fn a_panic_reports_its_message_to_every_call_in_flight() {
    let broker = probe(Limits::default()).await;
    let adapter = broker.adapter();
    let inflight: Vec<_> = (0..10)
        .map(|_| {
            let adapter = adapter.clone();
            tokio::spawn(
                async move { adapter.log_append("sleep:500".into(), vec![record()]).await },
            )
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let e = adapter
        .log_append("panic:the reactor overheated (42)".into(), vec![record()])
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::Trapped(_)), "{e}");
    assert!(text.contains("the reactor overheated (42)"), "{text}");
    assert!(text.starts_with("adapter trapped: "), "{text}");
    assert!(!text.contains('\n'), "one line: {text}");
    assert!(!text.contains("backtrace"), "{text}");
    for call in inflight {
        let e = call.await.unwrap().unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::Trapped(_)), "{e}");
        assert!(
            text.contains("the reactor overheated (42)"),
            "in flight: {text}"
        );
        assert!(!text.contains("no message"), "in flight: {text}");
    }
    assert_eq!(
        adapter
            .log_append("fine".into(), vec![record()])
            .await
            .unwrap(),
        ["0"]
    );
    eprintln!(
        "recovery[panic]: calls in flight answered and generation {} serving {:?} after the panic",
        adapter.generation(),
        started.elapsed()
    );
    assert_eq!(
        adapter
            .last_trap()
            .as_deref()
            .map(|t| t.contains("overheated")),
        Some(true)
    );
}

#[tokio::test]
async fn a_memory_bomb_traps_at_the_instance_cap() {
    let broker = probe(Limits {
        memory_bytes: 64 << 20,
        ..Limits::default()
    })
    .await;
    let adapter = broker.adapter();
    let held = adapter.memory_bytes();
    assert!(held > 0 && held < 64 << 20, "{held}");
    let started = Instant::now();
    let e = adapter
        .log_append("grow:100".into(), vec![record()])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Trapped(_)), "{e}");
    assert!(e.to_string().contains("memory limit"), "{e}");
    assert!(e.to_string().contains("Limits::memory_bytes"), "{e}");
    assert!(e.to_string().contains("64.0 MiB"), "{e}");
    assert_eq!(
        adapter
            .log_append("fine".into(), vec![record()])
            .await
            .unwrap(),
        ["0"]
    );
    // Within the cap, growing works and is counted.
    adapter
        .log_append("grow:8".into(), vec![record()])
        .await
        .unwrap();
    assert!(
        adapter.memory_bytes() >= 8 << 20,
        "{}",
        adapter.memory_bytes()
    );
    eprintln!(
        "recovery[memory bomb]: replaced and serving after {:?}",
        started.elapsed()
    );
}

/// Every event on this thread: (target, message length, message start).
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(String, usize, String)>>>);

struct Message(Option<String>);

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0 = Some(value.to_string());
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" && self.0.is_none() {
            self.0 = Some(format!("{value:?}"));
        }
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut message = Message(None);
        event.record(&mut message);
        let text = message.0.unwrap_or_default();
        let start: String = text.chars().take(40).collect();
        let mut events = self.0.lock().unwrap();
        events.push((event.metadata().target().to_string(), text.len(), start));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[tokio::test]
async fn log_lines_are_cut_and_go_to_the_adapters_target_from_the_first_instance() {
    let capture = Capture::default();
    let _guard = tracing::subscriber::set_default(capture.clone());
    let broker = probe(Limits::default()).await;
    broker
        .adapter()
        .log_append("log-line:1024".into(), vec![record()])
        .await
        .unwrap();
    drop(broker);
    let events = capture.0.lock().unwrap().clone();
    // What the probe said while its first instance was being described.
    let describe = events
        .iter()
        .find(|(_, _, start)| start.starts_with("probe: describe"))
        .expect("the describe line");
    assert_eq!(describe.0, "broker.probe");
    assert!(
        !events
            .iter()
            .any(|(target, ..)| target == "broker.starting")
    );
    // A 1 MiB line, from host.log and from stdout, is cut at 64 KiB.
    let long: Vec<_> = events
        .iter()
        .filter(|(_, _, start)| start.starts_with("xxxx"))
        .collect();
    assert_eq!(long.len(), 2, "{long:?}");
    for (target, len, _) in long {
        assert_eq!(target, "broker.probe");
        assert!(*len < 64 * 1024 + 64, "a line of {len} bytes");
    }
}

#[tokio::test]
async fn anything_but_a_component_is_refused_as_such() {
    let dir = std::env::temp_dir().join(format!("wrpc-not-a-component-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let random: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    for (name, bytes) in [
        ("random.wasm", random),
        ("text.wasm", b"(component)".to_vec()),
        ("module.wasm", b"\0asm\x01\0\0\0".to_vec()),
        ("empty.wasm", Vec::new()),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let e = Broker::open(&path, [("", ""); 0]).await.unwrap_err();
        assert!(matches!(e, Error::Load(_)), "{name}: {e}");
        assert!(
            e.to_string().contains("not a WebAssembly component"),
            "{name}: {e}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
