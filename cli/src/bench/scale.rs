//! `bench --scale`: resident memory per idle thing at growing counts — log readers sharing one
//! topic (one broker tail for all of them), readers each on a topic of its own (one broker
//! tail each), queue consumers on one queue, topics written once with no reader — the RSS the
//! process gained divided by the count, and the bytes its heap allocated divided by the count
//! (jemalloc's own count: unlike the resident set, it does not hide a thing in free memory an
//! earlier kind left resident, so it reads flat where the cost per thing is).
//! Each kind runs on a host instance of its own (a fresh component, so its linear memory
//! starts small), its things added cumulatively (1, then up to 1 000, then up to 10 000), and
//! is dropped, with the freed heap handed back (`trim`: jemalloc's purge and glibc's
//! `malloc_trim`), before the next kind.

use std::time::Duration;

use wrpc_broker::{Broker, ConsumeOptions, ReadFrom};

use wrpc_broker::runtime::bench::unique;

/// One measurement: `count` idle things of `kind`.
#[derive(Debug, Clone)]
pub struct ScaleRow {
    /// What was counted.
    pub kind: &'static str,
    /// How many were live.
    pub count: usize,
    /// Resident set gained over the kind's baseline, per thing.
    pub bytes_each: f64,
    /// Of that, what the components' linear memories gained, per thing.
    pub linear_each: f64,
    /// Bytes the heap allocated over the baseline, per thing (linear memories are not heap).
    pub heap_each: f64,
    /// Resident set of the process at this count.
    pub rss: u64,
}

/// Log readers sharing one topic: one broker tail for all of them.
const SHARED_READER: &str = "log reader, one shared topic";
/// Log readers each on a topic of its own: a broker tail each.
const TOPIC_TAIL: &str = "topic tail, a topic each";
/// Queue consumers on one queue.
const CONSUMER: &str = "queue consumer, one queue";
/// Topics appended to once and then left alone (no reader): what the host keeps per topic it
/// wrote to.
const WRITTEN_TOPIC: &str = "topic written once, no reader";

/// How long the process settles before its resident set is read.
const SETTLE: Duration = Duration::from_millis(300);

/// The process's resident set (Linux `/proc/self/status`), 0 elsewhere.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// The resident part of the components' linear memories, from `/proc/self/smaps` (0
/// elsewhere): each read-write mapping followed directly by an inaccessible one of at least
/// [`GUARD`] — wasmtime reserves a 32-bit memory's whole address range and makes only its
/// accessible pages readable, and nothing else in the process has such a guard behind it.
pub fn linear_rss_bytes() -> u64 {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    // Each mapping, in address order.
    let mut maps: Vec<Mapping> = Vec::new();
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let (Some(first), Some(second)) = (words.next(), words.next()) else {
            continue;
        };
        if let Some((from, to)) = first.split_once('-')
            && let (Ok(from), Ok(to)) = (u64::from_str_radix(from, 16), u64::from_str_radix(to, 16))
        {
            maps.push(Mapping {
                from,
                to,
                read_write: second.starts_with("rw"),
                inaccessible: second.starts_with("---"),
                resident: 0,
            });
        } else if first == "Rss:"
            && let Some(last) = maps.last_mut()
        {
            last.resident = second.parse::<u64>().unwrap_or(0) * 1024;
        }
    }
    maps.windows(2)
        .filter(|w| {
            let (memory, guard) = (&w[0], &w[1]);
            memory.read_write
                && guard.inaccessible
                && guard.from == memory.to
                && guard.to - guard.from >= GUARD
        })
        .map(|w| w[0].resident)
        .sum()
}

/// One mapping of `/proc/self/smaps`.
struct Mapping {
    from: u64,
    to: u64,
    read_write: bool,
    inaccessible: bool,
    /// Its resident bytes.
    resident: u64,
}

/// Bytes the process's heap has allocated and not freed (jemalloc's `stats.allocated`, read
/// after an `epoch` refresh); 0 if jemalloc cannot say.
pub fn heap_allocated_bytes() -> u64 {
    let mut epoch: u64 = 1;
    let mut allocated: usize = 0;
    let mut len = std::mem::size_of::<usize>();
    // SAFETY: `epoch` is written a u64 of its own size; `stats.allocated` writes one usize into
    // `allocated`, whose size `len` gives. No other memory is touched.
    let status = unsafe {
        tikv_jemalloc_sys::mallctl(
            c"epoch".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            (&raw mut epoch).cast(),
            std::mem::size_of::<u64>(),
        );
        tikv_jemalloc_sys::mallctl(
            c"stats.allocated".as_ptr(),
            (&raw mut allocated).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if status == 0 { allocated as u64 } else { 0 }
}

/// The smallest inaccessible mapping taken for a linear memory's guard (1 GiB).
const GUARD: u64 = 1 << 30;

/// Hand freed heap pages back to the system, so the next kind's baseline is not a heap full of
/// the last one's free memory (jemalloc's, the CLI's allocator, and glibc's, for C code).
fn trim() {
    // SAFETY: `arena.<all>.purge` reads and writes no value (null pointers, length 0); it only
    // returns jemalloc's unused dirty pages to the system.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            c"arena.4096.purge".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator; no pointer is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The resident set, its linear-memory part, and the heap's allocated bytes, after the process
/// settled.
async fn settled_rss() -> (u64, u64, u64) {
    tokio::time::sleep(SETTLE).await;
    (rss_bytes(), linear_rss_bytes(), heap_allocated_bytes())
}

/// Things kept alive while a kind is measured.
enum Held {
    Reader(#[allow(dead_code)] wrpc_broker::Reader),
    Consumer(#[allow(dead_code)] wrpc_broker::Consumer),
    Written,
}

/// Measure every kind at `counts` (ascending) on instances `open` makes.
pub async fn run<F, Fut>(counts: &[usize], open: F) -> anyhow::Result<Vec<ScaleRow>>
where
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<Broker>>,
{
    let mut rows = Vec::new();
    for kind in [SHARED_READER, TOPIC_TAIL, CONSUMER, WRITTEN_TOPIC] {
        let broker = open().await?;
        let shared = unique("scale");
        let mut held: Vec<Held> = Vec::new();
        trim();
        let baseline = settled_rss().await;
        for &count in counts {
            eprintln!("bench: scale: {kind}: {count}");
            while held.len() < count {
                let n = held.len();
                held.push(match kind {
                    SHARED_READER => {
                        Held::Reader(broker.log()?.read(&shared, ReadFrom::Latest).await?)
                    }
                    TOPIC_TAIL => Held::Reader(
                        broker
                            .log()?
                            .read(&format!("{shared}-{n}"), ReadFrom::Latest)
                            .await?,
                    ),
                    WRITTEN_TOPIC => {
                        let topic = format!("{shared}-{n}");
                        broker
                            .log()?
                            .append(&topic, "x", Default::default())
                            .await?;
                        Held::Written
                    }
                    _ => Held::Consumer(
                        broker
                            .queue()?
                            .consume(
                                &shared,
                                |_| async { Ok(()) },
                                ConsumeOptions {
                                    prefetch: 1,
                                    dead_letter: None,
                                },
                            )
                            .await?,
                    ),
                });
            }
            let (rss, linear, heap) = settled_rss().await;
            rows.push(ScaleRow {
                kind,
                count,
                bytes_each: rss.saturating_sub(baseline.0) as f64 / count as f64,
                linear_each: linear.saturating_sub(baseline.1) as f64 / count as f64,
                heap_each: heap.saturating_sub(baseline.2) as f64 / count as f64,
                rss,
            });
        }
        // Stopped together: each stop waits for its consumer's receive (up to 250 ms).
        let stops = held.drain(..).filter_map(|thing| match thing {
            Held::Consumer(consumer) => Some(async move { consumer.stop().await }),
            Held::Reader(_) | Held::Written => None,
        });
        futures::future::join_all(stops).await;
        broker.close();
        trim();
    }
    Ok(rows)
}

/// The scale rows as a Markdown table.
pub fn scale_table(rows: &[ScaleRow]) -> String {
    let mut out = String::from(
        "\n| idle thing | count | RSS gained per thing | of which linear memory | heap allocated per thing | process RSS |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {:.1} KiB | {:.1} KiB | {:.1} KiB | {:.1} MiB |\n",
            r.kind,
            r.count,
            r.bytes_each / 1024.0,
            r.linear_each / 1024.0,
            r.heap_each / 1024.0,
            r.rss as f64 / (1 << 20) as f64
        ));
    }
    out
}
