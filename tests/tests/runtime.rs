//! The component runtime: capability discovery, refused imports, traps, the CPU slice, the
//! wall-clock timeout, concurrency inside one instance, the compile cache, and calls from
//! another runtime.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wrpc_broker::bindings::log::RecordIn;
use wrpc_broker::runtime::{Origin, Runtime};
use wrpc_broker::{Broker, Capabilities, Error, Limits, MemoryStore};
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
async fn capabilities_come_from_exports() {
    let only_log = Broker::open(components::PROBE_ONLY_LOG, [("", ""); 0])
        .await
        .unwrap();
    assert_eq!(
        only_log.capabilities(),
        Capabilities {
            log: true,
            ..Default::default()
        }
    );
    let e = only_log.backplane().unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("backplane"), "{e}");

    let all = probe(Limits::default()).await;
    assert_eq!(
        all.capabilities().names(),
        ["backplane", "log", "queue", "direct"]
    );
}

#[tokio::test]
async fn an_import_the_host_does_not_provide_is_refused_by_name() {
    let e = Broker::open(components::PROBE_FORBIDDEN_IMPORT, [("", ""); 0])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Load(_)), "{e}");
    assert!(e.to_string().contains("wrpc:probe/secrets"), "{e}");
}

#[tokio::test]
async fn a_driver_the_operator_did_not_configure_is_refused_by_name() {
    // The memory adapter imports `wrpc:memory/store`; opening its file without a store fails.
    let e = Broker::open(components::MEMORY, [("", ""); 0])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("wrpc:memory/store"), "{e}");
    assert!(e.to_string().contains("did not configure"), "{e}");
    // With the store it loads.
    Broker::builder()
        .component_file(components::MEMORY)
        .memory_store(MemoryStore::new())
        .open()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_trap_fails_the_call_and_a_new_instance_serves_the_next() {
    let broker = probe(Limits::default()).await;
    let adapter = broker.adapter();
    assert_eq!(adapter.generation(), 1);
    let e = adapter
        .log_append("trap".into(), vec![record()])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Trapped(_)), "{e}");
    assert!(
        e.to_string().contains("unreachable") || e.to_string().contains("trap"),
        "{e}"
    );
    let ids = adapter
        .log_append("fine".into(), vec![record(), record()])
        .await
        .unwrap();
    assert_eq!(ids, ["0", "1"]);
    assert_eq!(adapter.generation(), 2);
}

#[tokio::test]
async fn the_cpu_slice_stops_a_looping_call() {
    let broker = probe(Limits {
        cpu_slice: Duration::from_millis(200),
        ..Limits::default()
    })
    .await;
    let adapter = broker.adapter();
    let e = adapter
        .log_append("spin".into(), vec![record()])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("CPU slice"), "{e}");
    assert_eq!(
        adapter
            .log_append("fine".into(), vec![record()])
            .await
            .unwrap(),
        ["0"]
    );
}

#[tokio::test]
async fn the_wall_clock_timeout_stops_a_slow_call() {
    let broker = probe(Limits {
        call_timeout: Duration::from_millis(200),
        ..Limits::default()
    })
    .await;
    let adapter = broker.adapter();
    let e = adapter
        .log_append("sleep:5000".into(), vec![record()])
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    // The instance is not poisoned: the next call answers.
    assert_eq!(
        adapter
            .log_append("fine".into(), vec![record()])
            .await
            .unwrap(),
        ["0"]
    );
}

#[tokio::test]
async fn calls_interleave_inside_one_instance() {
    let broker = probe(Limits::default()).await;
    let adapter = broker.adapter();
    let started = Instant::now();
    let calls = (0..100).map(|_| {
        let adapter = adapter.clone();
        tokio::spawn(async move { adapter.log_append("sleep:10".into(), vec![record()]).await })
    });
    for call in futures::future::join_all(calls).await {
        call.unwrap().unwrap();
    }
    // One after another these would take at least 100 × 10 ms; interleaved they overlap.
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_millis(1000),
        "100 sleeping calls took {elapsed:?}"
    );
}

#[tokio::test]
async fn the_second_load_of_a_file_comes_from_the_cache() {
    let dir = std::env::temp_dir().join(format!("wrpc-broker-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let runtime = Runtime::new(&dir).unwrap();
    let drivers = Default::default();
    let first = runtime.load_file(components::PROBE, &drivers).unwrap();
    let second = runtime.load_file(components::PROBE, &drivers).unwrap();
    assert_eq!(first.origin, Origin::Compiled);
    assert_eq!(second.origin, Origin::Cached);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    let _ = Arc::new(second);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_call_from_another_runtime_that_ends_leaves_the_instance_whole() {
    let broker = probe(Limits::default()).await;
    let adapter = broker.adapter();
    adapter
        .log_append("x".into(), vec![record()])
        .await
        .unwrap();
    // A thread with a runtime of its own calls while the instance is idle (so it polls the
    // instance itself), gives up on the call while the guest awaits the host's sleep, and
    // shuts its runtime down.
    let other_adapter = adapter.clone();
    std::thread::spawn(move || {
        let other = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        other.block_on(async {
            let call = other_adapter.log_append("sleep:300".into(), vec![record()]);
            let gave_up = tokio::time::timeout(Duration::from_millis(50), call).await;
            assert!(gave_up.is_err(), "the sleeping call was still on its way");
        });
    })
    .join()
    .unwrap();
    // The sleep it started belongs to this runtime's timers, not to the one that ended: the
    // instance goes on answering.
    for _ in 0..3 {
        let ids = adapter.log_append("x".into(), vec![record()]).await;
        assert!(ids.is_ok(), "{ids:?}");
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let ids = adapter.log_append("x".into(), vec![record()]).await;
    assert!(
        ids.is_ok(),
        "after the abandoned call's sleep ran out: {ids:?}"
    );
}
