//! The sandbox's time limits against a hostile component (the probe, told to misbehave): a loop
//! calling the host, a blocking WASI sleep, a call holding the instance past its timeout, and
//! `describe`, `init` and `close` that never return. Each case is contained within its limit,
//! other instances keep answering meanwhile, calls queued behind it run on the replacement, and
//! nothing runs on once its Broker is dropped. The time to recovery is printed (`--nocapture`).
//!
//! Bounds here are generous (seconds against limits of a few hundred milliseconds): they prove
//! containment, not speed.

use std::time::{Duration, Instant};

use wrpc_broker::bindings::log::RecordIn;
use wrpc_broker::{Broker, Error, Limits};
use wrpc_broker_contract::components;

/// How long a contained case may take at most (its limit is far below).
const CONTAINED: Duration = Duration::from_secs(10);

fn record() -> RecordIn {
    RecordIn {
        value: b"x".to_vec(),
        headers: vec![],
        key: None,
    }
}

fn limits(cpu_slice_ms: u64, call_timeout_ms: u64) -> Limits {
    Limits {
        cpu_slice: Duration::from_millis(cpu_slice_ms),
        call_timeout: Duration::from_millis(call_timeout_ms),
        ..Limits::default()
    }
}

async fn probe(limits: Limits, options: &[(&str, &str)]) -> wrpc_broker::Result<Broker> {
    Broker::builder()
        .component_file(components::PROBE)
        .options(options.iter().copied())
        .limits(limits)
        .open()
        .await
}

async fn append(broker: &Broker, topic: &str) -> wrpc_broker::Result<Vec<String>> {
    broker
        .adapter()
        .log_append(topic.into(), vec![record()])
        .await
}

/// Run `topic` on a probe with `limits` while well-behaved calls queue behind it and another
/// instance keeps answering; returns the hostile call's error. Every queued call must succeed on
/// the replacement.
async fn contained(case: &str, limits: Limits, topic: &str) -> Error {
    let hostile = probe(limits, &[]).await.unwrap();
    let bystander = probe(Limits::default(), &[]).await.unwrap();
    let started = Instant::now();
    let attack = tokio::spawn({
        let hostile = hostile.clone();
        let topic = topic.to_string();
        async move { append(&hostile, &topic).await }
    });
    // Let the attack take the instance, then queue well-behaved calls behind it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let queued: Vec<_> = (0..20)
        .map(|_| {
            let hostile = hostile.clone();
            tokio::spawn(async move { append(&hostile, "fine").await })
        })
        .collect();
    // Another instance answers all along.
    let (mut answered, mut slowest) = (0, Duration::ZERO);
    while !attack.is_finished() && started.elapsed() < CONTAINED {
        let asked = Instant::now();
        append(&bystander, "fine").await.unwrap();
        slowest = slowest.max(asked.elapsed());
        answered += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let error = tokio::time::timeout(CONTAINED, attack)
        .await
        .unwrap_or_else(|_| panic!("{case}: not contained within {CONTAINED:?}"))
        .unwrap()
        .unwrap_err();
    let stopped = started.elapsed();
    for call in queued {
        assert_eq!(call.await.unwrap().unwrap(), ["0"], "{case}: a queued call");
    }
    let recovered = started.elapsed();
    assert!(answered > 0, "{case}: the other instance answered nothing");
    assert!(hostile.adapter().generation() >= 2, "{case}: not replaced");
    eprintln!(
        "recovery[{case}]: stopped after {stopped:?}, 20 queued calls answered by generation {} \
         after {recovered:?}; the other instance answered {answered} calls meanwhile, slowest {slowest:?}",
        hostile.adapter().generation()
    );
    error
}

#[tokio::test]
async fn a_loop_calling_the_host_traps_at_the_cpu_slice() {
    let e = contained("spin calling host.now-ms", limits(300, 30_000), "spin-host").await;
    assert!(matches!(e, Error::Trapped(_)), "{e}");
    assert!(e.to_string().contains("CPU slice exhausted"), "{e}");
}

#[tokio::test]
async fn a_blocking_wasi_sleep_traps_at_the_cpu_slice() {
    let e = contained(
        "std::thread::sleep(60 s)",
        limits(300, 30_000),
        "block:60000",
    )
    .await;
    assert!(matches!(e, Error::Trapped(_)), "{e}");
    assert!(e.to_string().contains("wasi:io/poll"), "{e}");
    // A short blocking sleep within the slice is allowed.
    let broker = probe(limits(2_000, 30_000), &[]).await.unwrap();
    assert_eq!(append(&broker, "block:20").await.unwrap(), ["0"]);
}

#[tokio::test]
async fn the_call_timeout_fires_while_the_guest_holds_the_instance() {
    // The slice (3 s) is far longer than the call timeout (300 ms): the timeout answers first,
    // though the guest never lets the host's event loop run.
    let broker = probe(limits(3_000, 300), &[]).await.unwrap();
    let started = Instant::now();
    let e = append(&broker, "spin-host").await.unwrap_err();
    let answered = started.elapsed();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    assert!(answered < Duration::from_millis(2_500), "{answered:?}");
    // Then the slice stops the guest and a new instance answers.
    let recovered = wait_for_generation(&broker, 2).await;
    assert_eq!(append(&broker, "fine").await.unwrap(), ["0"]);
    eprintln!(
        "recovery[call timeout while held]: timeout after {answered:?}, replaced after {recovered:?}"
    );
}

#[tokio::test]
async fn a_cooperative_call_past_its_timeout_answers_timeout_and_the_instance_serves_on() {
    let broker = probe(limits(300, 300), &[]).await.unwrap();
    let e = append(&broker, "yield-forever").await.unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    assert_eq!(append(&broker, "fine").await.unwrap(), ["0"]);
    assert_eq!(broker.adapter().generation(), 1);
}

async fn wait_for_generation(broker: &Broker, generation: u32) -> Duration {
    let started = Instant::now();
    let mut generations = broker.adapter().generations();
    tokio::time::timeout(CONTAINED, generations.wait_for(|g| *g >= generation))
        .await
        .expect("replaced in time")
        .unwrap();
    started.elapsed()
}

#[tokio::test]
async fn an_init_that_never_returns_fails_the_open() {
    for (how, expected) in [
        ("hang", "did not start"),
        ("spin-host", "CPU slice exhausted"),
        ("block", "wasi:io/poll"),
        ("panic", "the probe's init was told to panic"),
    ] {
        let started = Instant::now();
        let e = probe(limits(300, 1_000), &[("hostile.init", how)])
            .await
            .unwrap_err();
        let failed = started.elapsed();
        assert!(e.to_string().contains(expected), "init {how}: {e}");
        assert!(failed < CONTAINED, "init {how}: {failed:?}");
        eprintln!("recovery[init {how}]: open failed after {failed:?}: {e}");
    }
}

#[tokio::test]
async fn a_replacement_whose_init_hangs_times_the_queued_call_out() {
    let options = [("hostile.init", "hang"), ("hostile.initFrom", "2")];
    let broker = probe(limits(300, 1_000), &options).await.unwrap();
    let e = append(&broker, "trap").await.unwrap_err();
    assert!(matches!(e, Error::Trapped(_)), "{e}");
    // Generation 2 never finishes init: the next call answers `timeout`, not never.
    let started = Instant::now();
    let e = append(&broker, "fine").await.unwrap_err();
    assert!(matches!(e, Error::Timeout(_)), "{e}");
    assert!(started.elapsed() < CONTAINED);
}

#[tokio::test]
async fn a_describe_that_never_returns_fails_the_open() {
    let started = Instant::now();
    let e = Broker::builder()
        .component_file(components::PROBE_HOSTILE_DESCRIBE)
        .limits(limits(300, 30_000))
        .open()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("describe"), "{e}");
    assert!(e.to_string().contains("CPU slice exhausted"), "{e}");
    assert!(started.elapsed() < CONTAINED);
    eprintln!(
        "recovery[describe spin]: open failed after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_close_that_never_returns_still_ends_the_instance() {
    for how in ["hang", "spin-host", "block"] {
        let broker = probe(limits(300, 1_000), &[("hostile.close", how)])
            .await
            .unwrap();
        let adapter = broker.adapter();
        let started = Instant::now();
        drop(broker);
        tokio::time::timeout(CONTAINED, adapter.finished())
            .await
            .unwrap_or_else(|_| panic!("close {how}: the instance still runs"));
        eprintln!(
            "recovery[close {how}]: instance ended {:?} after the drop",
            started.elapsed()
        );
    }
}

#[tokio::test]
async fn nothing_runs_on_once_the_broker_is_dropped() {
    for topic in ["spin-host", "yield-forever", "block:60000"] {
        // Slice and timeout longer than the wait below: only the drop can end it in time.
        let broker = probe(limits(30_000, 60_000), &[]).await.unwrap();
        let adapter = broker.adapter();
        // The call holds the adapter, not the Broker: dropping the Broker closes it.
        let call = tokio::spawn({
            let adapter = adapter.clone();
            let topic = topic.to_string();
            async move { adapter.log_append(topic, vec![record()]).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = Instant::now();
        drop(broker);
        tokio::time::timeout(CONTAINED, adapter.finished())
            .await
            .unwrap_or_else(|_| panic!("{topic}: the instance still runs after the drop"));
        let e = call.await.unwrap().unwrap_err();
        assert!(matches!(e, Error::Closed(_)), "{topic}: {e}");
        eprintln!(
            "recovery[drop during {topic}]: instance ended {:?} after the drop",
            started.elapsed()
        );
    }
}
