//! Results outside the component/native table: append latency during hot swaps, and
//! component load times.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use wrpc_broker::AppendOptions;
use wrpc_broker::runtime::Runtime;

use wrpc_broker::runtime::bench::{Sample, unique};

use super::{BenchConfig, Setup};

/// Results outside the component/native table (no swap and load when `--only` picked rows).
pub struct Extras {
    /// Load times, cold and cached.
    pub load: Option<LoadTimes>,
    /// Append latency during hot swaps and outside them.
    pub swap: Option<SwapPause>,
    /// Resident memory per idle reader, tail and consumer (`--scale`).
    pub scale: Vec<super::scale::ScaleRow>,
}

/// Append latency while the adapter is swapped underneath, against the rest of the run.
#[derive(Debug, Clone, Default)]
pub struct SwapPause {
    /// Swaps done.
    pub swaps: usize,
    /// How long each swap took end to end.
    pub durations: Vec<Duration>,
    /// Latencies of appends that overlapped a swap.
    pub during: Sample,
    /// Latencies of the other appends.
    pub outside: Sample,
}

/// Append one at a time for the whole duration while swapping every 100 ms; split the append
/// latencies by whether they overlapped a swap.
pub(super) async fn swap_pause(setup: &Setup, config: &BenchConfig) -> anyhow::Result<SwapPause> {
    let wasm = match &config.adapter {
        Some(path) => std::fs::read(path)?,
        None => wrpc_broker::drivers::embedded_adapter(&config.broker)
            .context("no embedded adapter")?
            .to_vec(),
    };
    let log = setup.a.log()?;
    let topic = unique("swap");
    let run_for = config.duration.max(Duration::from_secs(1));
    let origin = Instant::now();
    let appends = {
        let (log, topic, payload) = (log.clone(), topic.clone(), setup.work.payload.clone());
        tokio::spawn(async move {
            let mut spans = Vec::new();
            while origin.elapsed() < run_for {
                let start = origin.elapsed();
                log.append(&topic, payload.clone(), AppendOptions::default())
                    .await?;
                spans.push((start, origin.elapsed()));
            }
            anyhow::Ok(spans)
        })
    };
    let mut windows = Vec::new();
    while origin.elapsed() + Duration::from_millis(150) < run_for {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let start = origin.elapsed();
        setup
            .a
            .swap_bytes("bench swap", &wasm, [("", ""); 0])
            .await?;
        windows.push((start, origin.elapsed()));
    }
    let spans = appends.await??;
    let mut pause = SwapPause {
        swaps: windows.len(),
        durations: windows.iter().map(|(s, e)| *e - *s).collect(),
        ..Default::default()
    };
    for (start, end) in spans {
        let overlaps = windows.iter().any(|(s, e)| start < *e && end > *s);
        let side = if overlaps {
            &mut pause.during
        } else {
            &mut pause.outside
        };
        side.ops += 1;
        side.latencies.push(end - start);
    }
    Ok(pause)
}

/// The swap-pause lines.
pub fn swap_table(pause: &SwapPause) -> String {
    let us =
        |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e6));
    let durations = Sample {
        latencies: pause.durations.clone(),
        ..Default::default()
    };
    format!(
        "| hot swap ({} swaps) | swap p50 {} µs, p99 {} µs | append during a swap: {} ops, p50 {} µs, p99 {} µs | outside: {} ops, p50 {} µs, p99 {} µs |\n",
        pause.swaps,
        us(durations.quantile(0.5)),
        us(durations.quantile(0.99)),
        pause.during.ops,
        us(pause.during.quantile(0.5)),
        us(pause.during.quantile(0.99)),
        pause.outside.ops,
        us(pause.outside.quantile(0.5)),
        us(pause.outside.quantile(0.99)),
    )
}

/// Component load times: compiled cold, and deserialised from the cache.
#[derive(Debug, Clone)]
pub struct LoadTimes {
    /// The component measured.
    pub component: String,
    /// Its size in bytes.
    pub size: u64,
    /// Compile (cold) times.
    pub cold: Vec<Duration>,
    /// Load-from-cache times.
    pub cached: Vec<Duration>,
}

pub(super) async fn load_times(config: &BenchConfig) -> anyhow::Result<LoadTimes> {
    let (name, bytes) = match &config.adapter {
        Some(path) => (path.display().to_string(), std::fs::read(path)?),
        None => {
            let scheme = wrpc_broker::drivers::scheme(&config.broker);
            let bytes = wrpc_broker::drivers::embedded_adapter(&config.broker)
                .context("no embedded adapter")?;
            (format!("embedded {scheme} adapter"), bytes.to_vec())
        }
    };
    let mut times = LoadTimes {
        component: name.clone(),
        size: bytes.len() as u64,
        cold: Vec::new(),
        cached: Vec::new(),
    };
    for _ in 0..3 {
        let dir = std::env::temp_dir().join(format!(
            "wrpc-bench-cache-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let runtime = Runtime::new(&dir)?;
        // Compile or deserialise only: what the cache saves (linking needs the driver's server).
        let started = Instant::now();
        runtime.cache().load(runtime.engine(), &bytes)?;
        times.cold.push(started.elapsed());
        for _ in 0..3 {
            let started = Instant::now();
            runtime.cache().load(runtime.engine(), &bytes)?;
            times.cached.push(started.elapsed());
        }
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(times)
}

/// The load-time lines.
pub fn load_table(load: &LoadTimes) -> String {
    let median = |v: &[Duration]| {
        let mut v = v.to_vec();
        v.sort();
        v[v.len() / 2]
    };
    let (cold, cached) = (median(&load.cold), median(&load.cached));
    format!(
        "| load {} ({} KiB) | cold compile {:.1} ms | from cache {:.2} ms | ratio {:.0}× |\n",
        load.component,
        load.size / 1024,
        cold.as_secs_f64() * 1e3,
        cached.as_secs_f64() * 1e3,
        cold.as_secs_f64() / cached.as_secs_f64().max(1e-9)
    )
}
