//! Log contracts: ordered, replayable feeds a reader resumes from an id, on any instance.
//! The first tests check the adapter's own `range`/`tail` contract through raw calls; the rest
//! check what an application sees through [`wrpc_broker::Log`].

use std::collections::HashMap;

use anyhow::{Context as _, bail, ensure};
use wrpc_broker::bindings::log::RecordIn;
use wrpc_broker::bindings::types::Start;
use wrpc_broker::{AppendOptions, Entry, Error, ReadFrom, Reader};

use crate::support::{next, silence, unique};
use crate::{Factory, ensure_eq};

crate::contract_tests!(
    Log:
    adapter_range_pages_are_dense_and_ordered,
    adapter_tail_yields_every_later_entry_once_in_order,
    append_100_with_headers_and_keys_reads_back_in_order,
    an_empty_value_reads_back_empty,
    read_after_an_id_resumes_strictly_after_it,
    read_after_an_id_works_on_another_instance,
    latest_yields_only_new_entries,
    a_reader_joins_the_live_tail_without_gap_or_duplicate,
    fifty_concurrent_readers_see_every_entry_in_order,
    a_slow_reader_catches_up_without_gap,
    order_per_key_is_kept,
    a_malformed_id_is_bad_request,
    an_id_past_the_tip_is_bad_request,
    an_id_from_another_log_is_gone,
    an_id_older_than_retention_is_gone [RetentionByCount],
    concurrent_appends_get_distinct_ids_in_log_order,
    batches_from_two_instances_each_keep_their_order,
);

fn record(value: String) -> RecordIn {
    RecordIn {
        value: value.into_bytes(),
        headers: vec![],
        key: None,
    }
}

async fn append_n(log: &wrpc_broker::Log, topic: &str, n: usize) -> anyhow::Result<Vec<String>> {
    let records = (0..n)
        .map(|i| (format!("v{i}").into_bytes(), AppendOptions::default()))
        .collect();
    Ok(log.append_batch(topic, records).await?)
}

async fn take(reader: &mut Reader, n: usize, what: &str) -> anyhow::Result<Vec<Entry>> {
    let mut entries = Vec::with_capacity(n);
    for i in 0..n {
        let entry = next(reader, &format!("{what}: entry {i} of {n}")).await?;
        entries.push(entry.with_context(|| format!("{what}: entry {i} of {n}"))?);
    }
    Ok(entries)
}

fn values(entries: &[Entry]) -> Vec<String> {
    entries
        .iter()
        .map(|e| String::from_utf8_lossy(&e.value).into_owned())
        .collect()
}

fn expected(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("v{i}")).collect()
}

async fn an_empty_value_reads_back_empty(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let log = broker.log()?;
    let topic = unique("empty");
    let empty = AppendOptions {
        headers: vec![("h".to_string(), Vec::new())],
        key: None,
    };
    let id = log.append(&topic, Vec::<u8>::new(), empty).await?;
    log.append(&topic, "after", AppendOptions::default())
        .await?;
    for (what, from) in [
        ("from the start", ReadFrom::Earliest),
        ("live", ReadFrom::Latest),
    ] {
        let mut reader = log.read(&topic, from).await?;
        if matches!(what, "live") {
            log.append(&topic, Vec::<u8>::new(), AppendOptions::default())
                .await?;
            log.append(&topic, "after", AppendOptions::default())
                .await?;
        }
        let entries = take(&mut reader, 2, what).await?;
        ensure_eq!(
            entries[0].value.len(),
            0,
            "{what}: bytes of the first value (zero)"
        );
        ensure_eq!(
            values(&entries[1..]),
            vec!["after".to_string()],
            "{what}: the entry after it"
        );
        if matches!(what, "from the start") {
            ensure_eq!(entries[0].id, id, "{what}: the empty entry's id");
            ensure_eq!(
                entries[0].headers,
                vec![("h".to_string(), Vec::new())],
                "{what}: the empty header"
            );
        }
    }
    Ok(())
}

async fn adapter_range_pages_are_dense_and_ordered(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let topic = unique("range");
    let ids = append_n(&broker.log()?, &topic, 25).await?;
    let adapter = broker.adapter();
    let mut seen = Vec::new();
    let mut origin = Start::Earliest;
    loop {
        let page = adapter.log_range(topic.clone(), origin, 10).await?;
        ensure!(
            page.entries.len() <= 10,
            "a page of limit 10 held {}",
            page.entries.len()
        );
        for e in &page.entries {
            if let Some(prev) = seen.last() {
                ensure_eq!(e.pos.offset, *prev + 1, "offset after {prev}");
            }
            seen.push(e.pos.offset);
        }
        let Some(last) = page.entries.last() else {
            break;
        };
        if page.done {
            break;
        }
        origin = Start::After(last.id.clone());
    }
    ensure_eq!(seen.len(), 25, "entries paged through");
    let last = adapter
        .log_range(topic.clone(), Start::After(ids[24].clone()), 10)
        .await?;
    ensure!(
        last.entries.is_empty() && last.done,
        "a page after the last id is empty and done"
    );
    Ok(())
}

async fn adapter_tail_yields_every_later_entry_once_in_order(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let adapter = broker.adapter();
    let topic = unique("tail");
    let (positions, mut live) = adapter.log_tail(topic.clone(), Start::Latest).await?;
    ensure_eq!(
        positions.len(),
        1,
        "tail positions of a single-sequence log"
    );
    let start = positions[0].offset;
    let ids = adapter
        .log_append(
            topic.clone(),
            (0..50).map(|i| record(format!("t{i}"))).collect(),
        )
        .await?;
    expect_tail(&mut live, start, 0..50)
        .await
        .context("tail from latest")?;
    // A tail after an id starts right after it.
    let (positions, mut resumed) = adapter
        .log_tail(topic.clone(), Start::After(ids[9].clone()))
        .await?;
    ensure_eq!(
        positions[0].offset,
        start + 10,
        "the position of a tail after id 9"
    );
    adapter
        .log_append(
            topic.clone(),
            (50..55).map(|i| record(format!("t{i}"))).collect(),
        )
        .await?;
    expect_tail(&mut resumed, start + 10, 10..55)
        .await
        .context("tail after id 9")?;
    expect_tail(&mut live, start + 50, 50..55)
        .await
        .context("tail from latest, later")
}

/// The tail yields exactly the entries `values` (as `t{i}`), at dense positions from `first`.
async fn expect_tail(
    batches: &mut tokio::sync::mpsc::Receiver<Vec<wrpc_broker::bindings::log::Entry>>,
    first: u64,
    values: std::ops::Range<usize>,
) -> anyhow::Result<()> {
    let want = values.len();
    let mut got = Vec::new();
    while got.len() < want {
        let batch = tokio::time::timeout(crate::support::ARRIVAL, batches.recv())
            .await
            .context("entries did not arrive")?
            .context("the stream ended")?;
        got.extend(batch);
    }
    ensure_eq!(got.len(), want, "entries from the tail");
    for (i, (e, v)) in got.iter().zip(values).enumerate() {
        ensure_eq!(e.pos.offset, first + i as u64, "position of tail entry {i}");
        ensure_eq!(
            e.value,
            format!("t{v}").into_bytes(),
            "value of tail entry {i}"
        );
    }
    if let Ok(Some(extra)) = tokio::time::timeout(crate::support::SILENCE, batches.recv()).await {
        bail!(
            "the tail yielded {} entries more than were appended",
            extra.len()
        );
    }
    Ok(())
}

async fn append_100_with_headers_and_keys_reads_back_in_order(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let log = broker.log()?;
    let topic = unique("orders");
    let mut ids = Vec::new();
    for i in 0..100 {
        let options = AppendOptions {
            headers: vec![
                ("h".into(), vec![i as u8]),
                ("h".into(), b"twice".to_vec()),
                ("bin".into(), vec![0, 255]),
            ],
            key: Some(format!("k{}", i % 3).into_bytes()),
        };
        ids.push(log.append(&topic, format!("v{i}"), options).await?);
    }
    let mut unique_ids = ids.clone();
    unique_ids.sort();
    unique_ids.dedup();
    ensure_eq!(unique_ids.len(), 100, "distinct ids");
    let mut reader = log.read(&topic, ReadFrom::Earliest).await?;
    let entries = take(&mut reader, 100, "earliest").await?;
    ensure_eq!(values(&entries), expected(0..100), "values");
    for (i, e) in entries.iter().enumerate() {
        ensure_eq!(e.id, ids[i], "id of entry {i}");
        ensure_eq!(
            e.headers,
            vec![
                ("h".to_string(), vec![i as u8]),
                ("h".into(), b"twice".to_vec()),
                ("bin".into(), vec![0, 255])
            ],
            "headers of entry {i}"
        );
        ensure_eq!(
            e.key,
            Some(format!("k{}", i % 3).into_bytes()),
            "key of entry {i}"
        );
    }
    Ok(())
}

async fn read_after_an_id_resumes_strictly_after_it(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let log = broker.log()?;
    let topic = unique("resume");
    let ids = append_n(&log, &topic, 10).await?;
    log.parse_id(&ids[4])
        .await
        .context("parse-id of an id this log minted")?;
    let mut reader = log.read(&topic, ReadFrom::After(ids[4].clone())).await?;
    let entries = take(&mut reader, 5, "after id 4").await?;
    ensure_eq!(values(&entries), expected(5..10), "entries after id 4");
    silence(&mut reader, "after the tip").await?;
    let mut at_tip = log.read(&topic, ReadFrom::After(ids[9].clone())).await?;
    silence(&mut at_tip, "after the last id").await?;
    append_n(&log, &topic, 1).await?;
    let e = next(&mut at_tip, "a new entry after the last id").await??;
    ensure_eq!(e.value, b"v0".to_vec(), "the new entry");
    Ok(())
}

async fn read_after_an_id_works_on_another_instance(f: Factory) -> anyhow::Result<()> {
    let a = f.instance().await?;
    let b = f.instance().await?;
    let topic = unique("feed");
    let ids = append_n(&a.log()?, &topic, 6).await?;
    let mut reader = b
        .log()?
        .read(&topic, ReadFrom::After(ids[1].clone()))
        .await?;
    ensure_eq!(
        values(&take(&mut reader, 4, "on instance b").await?),
        expected(2..6),
        "entries on b"
    );
    append_n(&a.log()?, &topic, 2).await?;
    ensure_eq!(
        values(&take(&mut reader, 2, "live on b").await?),
        expected(0..2),
        "live entries on b"
    );
    Ok(())
}

async fn latest_yields_only_new_entries(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let log = broker.log()?;
    let topic = unique("latest");
    append_n(&log, &topic, 5).await?;
    let mut reader = log.read(&topic, ReadFrom::Latest).await?;
    silence(&mut reader, "latest before any new entry").await?;
    let records = (0..3)
        .map(|i| (format!("new{i}").into_bytes(), AppendOptions::default()))
        .collect();
    log.append_batch(&topic, records).await?;
    let got = take(&mut reader, 3, "latest").await?;
    ensure_eq!(values(&got), vec!["new0", "new1", "new2"], "new entries");
    Ok(())
}

async fn a_reader_joins_the_live_tail_without_gap_or_duplicate(f: Factory) -> anyhow::Result<()> {
    let writer = f.instance().await?;
    let reader_host = f.instance().await?;
    let topic = unique("join");
    let log = writer.log()?;
    append_n(&log, &topic, 100).await?;
    let appending = {
        let log = log.clone();
        let topic = topic.clone();
        tokio::spawn(async move {
            for i in 100..400 {
                log.append(&topic, format!("v{i}"), AppendOptions::default())
                    .await?;
            }
            anyhow::Ok(())
        })
    };
    // A live tail is running on the reader's host (an earlier reader) while another joins.
    let mut early = reader_host.log()?.read(&topic, ReadFrom::Latest).await?;
    let mut reader = reader_host.log()?.read(&topic, ReadFrom::Earliest).await?;
    let got = take(&mut reader, 400, "joining reader").await?;
    appending.await??;
    ensure_eq!(values(&got), expected(0..400), "entries across the join");
    silence(&mut reader, "after the last entry").await?;
    // Both readers share the tail: one more entry reaches each exactly once.
    log.append(&topic, "last", AppendOptions::default()).await?;
    ensure_eq!(
        next(&mut reader, "the joined reader").await??.value,
        b"last".to_vec(),
        "the joined reader"
    );
    loop {
        let entry = next(&mut early, "the earlier live reader").await??;
        if entry.value == b"last" {
            break;
        }
    }
    silence(&mut early, "the earlier reader after the last entry").await?;
    Ok(())
}

async fn fifty_concurrent_readers_see_every_entry_in_order(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let log = broker.log()?;
    let topic = unique("fifty");
    append_n(&log, &topic, 20).await?;
    let mut readers = Vec::new();
    for _ in 0..50 {
        readers.push(log.read(&topic, ReadFrom::Earliest).await?);
    }
    let records = (20..120)
        .map(|i| (format!("v{i}").into_bytes(), AppendOptions::default()))
        .collect();
    log.append_batch(&topic, records).await?;
    let results =
        futures::future::join_all(readers.iter_mut().enumerate().map(|(i, r)| async move {
            take(r, 120, &format!("reader {i}"))
                .await
                .map(|e| values(&e))
        }))
        .await;
    for (i, got) in results.into_iter().enumerate() {
        ensure_eq!(got?, expected(0..120), "reader {i}");
    }
    Ok(())
}

async fn a_slow_reader_catches_up_without_gap(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let log = broker.log()?;
    let topic = unique("slow");
    let mut slow = log.read(&topic, ReadFrom::Latest).await?;
    // Far more than the shared tail and the reader buffer hold: the reader must go back to pages.
    for chunk in 0..20 {
        let records = (chunk * 250..(chunk + 1) * 250)
            .map(|i| (format!("v{i}").into_bytes(), AppendOptions::default()))
            .collect();
        log.append_batch(&topic, records).await?;
    }
    let got = take(&mut slow, 5000, "slow reader").await?;
    let offsets: Vec<u64> = got.iter().map(|e| e.position.offset).collect();
    ensure!(
        offsets.windows(2).all(|w| w[1] == w[0] + 1),
        "offsets are dense and ordered"
    );
    ensure_eq!(values(&got), expected(0..5000), "values of the slow reader");
    Ok(())
}

async fn order_per_key_is_kept(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let log = broker.log()?;
    let topic = unique("keys");
    let records = (0..60)
        .map(|i| {
            let key = format!("customer-{}", i % 4).into_bytes();
            (
                format!("{}:{}", i % 4, i / 4).into_bytes(),
                AppendOptions {
                    headers: vec![],
                    key: Some(key),
                },
            )
        })
        .collect();
    log.append_batch(&topic, records).await?;
    let mut reader = log.read(&topic, ReadFrom::Earliest).await?;
    let entries = take(&mut reader, 60, "keyed entries").await?;
    let mut per_key: HashMap<Vec<u8>, Vec<u32>> = HashMap::new();
    for e in &entries {
        let text = String::from_utf8_lossy(&e.value).into_owned();
        let (key, seq) = text.split_once(':').context("value shape")?;
        ensure_eq!(
            e.key.clone(),
            Some(format!("customer-{key}").into_bytes()),
            "key of {text}"
        );
        per_key
            .entry(e.key.clone().unwrap_or_default())
            .or_default()
            .push(seq.parse()?);
    }
    for (key, seqs) in per_key {
        ensure_eq!(
            seqs,
            (0..15).collect::<Vec<u32>>(),
            "order for key {}",
            String::from_utf8_lossy(&key)
        );
    }
    Ok(())
}

async fn a_malformed_id_is_bad_request(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let log = broker.log()?;
    let topic = unique("malformed");
    append_n(&log, &topic, 2).await?;
    for bad in ["not-an-id", "", "::", "\u{0}"] {
        match log.parse_id(bad).await {
            Err(Error::BadRequest(_)) => {}
            other => bail!("parse-id({bad:?}): expected bad request, got {other:?}"),
        }
        match log.read(&topic, ReadFrom::After(bad.into())).await {
            Err(Error::BadRequest(_)) => {}
            other => bail!("read after {bad:?}: expected bad request, got {other:?}"),
        }
    }
    Ok(())
}

/// The id of the same log `distance` entries later, when ids end in a decimal offset.
fn forge_later(id: &str, distance: u64) -> Option<String> {
    let digits = id.len() - id.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = id.split_at(id.len() - digits);
    let n: u64 = tail.parse().ok()?;
    Some(format!("{head}{}", n + distance))
}

async fn an_id_past_the_tip_is_bad_request(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let log = broker.log()?;
    let topic = unique("tip");
    let ids = append_n(&log, &topic, 3).await?;
    let Some(past) = forge_later(&ids[2], 1000) else {
        // Ids without a trailing offset (e.g. a partition-offset vector): forge per format.
        bail!("cannot derive an id past the tip from {:?}", ids[2]);
    };
    match log.read(&topic, ReadFrom::After(past.clone())).await {
        Err(Error::BadRequest(_)) => Ok(()),
        other => bail!("read after {past:?} (past the tip): expected bad request, got {other:?}"),
    }
}

async fn an_id_from_another_log_is_gone(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let log = broker.log()?;
    let (one, other) = (unique("one"), unique("other"));
    let foreign = append_n(&log, &one, 3).await?;
    append_n(&log, &other, 3).await?;
    match log.read(&other, ReadFrom::After(foreign[0].clone())).await {
        Err(Error::Gone(_)) => Ok(()),
        other => bail!("an id minted by another log: expected gone (410), got {other:?}"),
    }
}

async fn an_id_older_than_retention_is_gone(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance_with(&[("retention.maxEntries", "5")]).await?;
    let log = broker.log()?;
    let topic = unique("retention");
    let ids = append_n(&log, &topic, 20).await?;
    match log.read(&topic, ReadFrom::After(ids[2].clone())).await {
        Err(Error::Gone(_)) => {}
        other => bail!("an id older than the retained history: expected gone (410), got {other:?}"),
    }
    let mut earliest = log.read(&topic, ReadFrom::Earliest).await?;
    ensure_eq!(
        values(&take(&mut earliest, 5, "retained").await?),
        expected(15..20),
        "the retained entries"
    );
    let mut resumed = log.read(&topic, ReadFrom::After(ids[16].clone())).await?;
    ensure_eq!(
        values(&take(&mut resumed, 3, "inside retention").await?),
        expected(17..20),
        "resume inside retention"
    );
    Ok(())
}

async fn concurrent_appends_get_distinct_ids_in_log_order(f: Factory) -> anyhow::Result<()> {
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
async fn batches_from_two_instances_each_keep_their_order(f: Factory) -> anyhow::Result<()> {
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
