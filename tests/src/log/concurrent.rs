//! Appenders at once: concurrent appends and batches from two instances, each in log order.

use anyhow::{Context as _, ensure};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use wrpc_broker::{AppendOptions, ReadFrom};

use super::{take, values};
use crate::support::{silence, unique};
use crate::{Factory, ensure_eq};

pub(super) async fn concurrent_appends_get_distinct_ids_in_log_order(
    f: Factory,
) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let topic = unique("concurrent");
    let writers = [a.log()?, b.log()?]
        .into_iter()
        .enumerate()
        .flat_map(|(w, log)| {
            let topic = topic.clone();
            (0..50).map(move |i| {
                let (log, topic) = (log.clone(), topic.clone());
                tokio::spawn(async move {
                    log.append(&topic, format!("w{w}-{i}"), AppendOptions::default())
                        .await
                })
            })
        });
    let ids: Vec<String> = futures::future::join_all(writers)
        .await
        .into_iter()
        .map(|r| {
            r.map_err(anyhow::Error::from)
                .and_then(|r| r.map_err(anyhow::Error::from))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut reader = a.log()?.read(&topic, ReadFrom::Earliest).await?;
    let entries = take(&mut reader, 100, "concurrent appends").await?;
    let mut read_ids: Vec<String> = entries.iter().map(|e| e.id.clone()).collect();
    let offsets: Vec<u64> = entries.iter().map(|e| e.position.offset).collect();
    ensure!(
        offsets.windows(2).all(|w| w[1] == w[0] + 1),
        "dense offsets in read order"
    );
    let mut appended = ids.clone();
    appended.sort();
    read_ids.sort();
    ensure_eq!(read_ids, appended, "ids read vs ids the appends returned");
    Ok(())
}

/// Two instances append batches of 300 to one topic at once: each batch reads back in its own
/// order, whatever the interleaving, with every id the appends returned and nothing twice.
pub(super) async fn batches_from_two_instances_each_keep_their_order(
    f: Factory,
) -> anyhow::Result<()> {
    const BATCHES: usize = 3;
    const SIZE: usize = 300;
    let (a, b) = (f.instance().await?, f.instance().await?);
    let topic = unique("batches");
    let writers = [a.log()?, b.log()?]
        .into_iter()
        .enumerate()
        .flat_map(|(w, log)| {
            let topic = topic.clone();
            (0..BATCHES).map(move |n| {
                let (log, topic) = (log.clone(), topic.clone());
                let records = (0..SIZE)
                    .map(|i| {
                        (
                            format!("w{w}b{n}-{i}").into_bytes(),
                            AppendOptions::default(),
                        )
                    })
                    .collect();
                tokio::spawn(async move { log.append_batch(&topic, records).await })
            })
        });
    let mut appended = Vec::new();
    for ids in futures::future::join_all(writers).await {
        appended.extend(ids??);
    }
    let total = 2 * BATCHES * SIZE;
    ensure_eq!(appended.len(), total, "ids the appends returned");
    let mut reader = a.log()?.read(&topic, ReadFrom::Earliest).await?;
    let entries = take(&mut reader, total, "interleaved batches").await?;
    let mut next_of: HashMap<String, usize> = HashMap::new();
    for value in values(&entries) {
        let (batch, i) = value
            .rsplit_once('-')
            .with_context(|| format!("unexpected value `{value}`"))?;
        let next = next_of.entry(batch.to_string()).or_default();
        ensure_eq!(
            i.parse::<usize>()?,
            *next,
            "the next entry of batch {batch}"
        );
        *next += 1;
    }
    ensure_eq!(next_of.len(), 2 * BATCHES, "batches read");
    let mut read_ids: Vec<String> = entries.iter().map(|e| e.id.clone()).collect();
    read_ids.sort();
    appended.sort();
    ensure_eq!(read_ids, appended, "ids read vs ids the appends returned");
    silence(&mut reader, "after the batches").await
}

/// An append its caller drops while it is in flight does not strand the appends of its topic
/// that came behind it: each of them lands and answers its id.
pub(super) async fn appends_behind_a_dropped_one_still_land(f: Factory) -> anyhow::Result<()> {
    const BEHIND: usize = 20;
    let log = f.instance().await?.log()?;
    let topic = unique("dropped");
    // One poll puts an append in flight: the appends below find it there and wait behind it.
    // An instance with nothing else to do answers within that first poll (then it landed, and
    // another goes), so appends to another topic keep it busy meanwhile, from a thread of
    // their own: they run beside this task, however busy this runtime's workers are (on this
    // runtime's handle, as the calls of an application with one runtime).
    let stop = Arc::new(AtomicBool::new(false));
    let busy = {
        let (log, stop, other) = (log.clone(), stop.clone(), unique("dropped-busy"));
        let runtime = tokio::runtime::Handle::current();
        std::thread::spawn(move || {
            runtime.block_on(async {
                while !stop.load(Ordering::Relaxed) {
                    log.append(&other, "busy", AppendOptions::default()).await?;
                }
                anyhow::Ok(())
            })
        })
    };
    let (mut first, started) = (None, std::time::Instant::now());
    while first.is_none() && started.elapsed() < std::time::Duration::from_secs(10) {
        let mut append = Box::pin(log.append(&topic, "first", AppendOptions::default()));
        if futures::poll!(&mut append).is_pending() {
            first = Some(append);
        } else {
            tokio::task::yield_now().await;
        }
    }
    stop.store(true, Ordering::Relaxed);
    busy.join()
        .map_err(|_| anyhow::anyhow!("the busy thread panicked"))??;
    let first = first.context("for 10 s every append answered at its first poll: none to drop")?;
    let behind: Vec<_> = (0..BEHIND)
        .map(|i| {
            let (log, topic) = (log.clone(), topic.clone());
            tokio::spawn(async move {
                log.append(&topic, format!("behind-{i}"), AppendOptions::default())
                    .await
            })
        })
        .collect();
    // `first` is not polled meanwhile, so it stays in flight however soon its answer comes.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    drop(first);
    let answers = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        futures::future::join_all(behind),
    )
    .await
    .context("the appends behind a dropped one never answered")?;
    for (i, answer) in answers.into_iter().enumerate() {
        answer?.with_context(|| format!("append behind-{i}"))?;
    }
    // The dropped one may have landed or not; every one behind it did.
    let mut reader = log.read(&topic, ReadFrom::Earliest).await?;
    let mut read = Vec::new();
    while read.len() < BEHIND {
        let entries = take(&mut reader, 1, "the appends behind a dropped one").await?;
        read.extend(values(&entries).into_iter().filter(|v| v != "first"));
    }
    read.sort();
    let mut expected: Vec<_> = (0..BEHIND).map(|i| format!("behind-{i}")).collect();
    expected.sort();
    ensure_eq!(
        read,
        expected,
        "the appends behind the dropped one, read back"
    );
    Ok(())
}
