//! What an application reads through [`wrpc_broker::Log`]: values, headers and keys back as
//! appended, resuming after an id (on any instance), the live tail joined without gap or
//! duplicate, many and slow readers, order per key.

use anyhow::{Context as _, ensure};
use std::collections::HashMap;
use wrpc_broker::{AppendOptions, ReadFrom};

use super::{append_n, expected, take, values};
use crate::support::{next, silence, unique};
use crate::{Factory, ensure_eq};

pub(super) async fn an_empty_value_reads_back_empty(f: Factory) -> anyhow::Result<()> {
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

pub(super) async fn append_100_with_headers_and_keys_reads_back_in_order(
    f: Factory,
) -> anyhow::Result<()> {
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

pub(super) async fn read_after_an_id_resumes_strictly_after_it(f: Factory) -> anyhow::Result<()> {
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

pub(super) async fn read_after_an_id_works_on_another_instance(f: Factory) -> anyhow::Result<()> {
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

pub(super) async fn latest_yields_only_new_entries(f: Factory) -> anyhow::Result<()> {
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

pub(super) async fn a_reader_joins_the_live_tail_without_gap_or_duplicate(
    f: Factory,
) -> anyhow::Result<()> {
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

pub(super) async fn fifty_concurrent_readers_see_every_entry_in_order(
    f: Factory,
) -> anyhow::Result<()> {
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

pub(super) async fn a_slow_reader_catches_up_without_gap(f: Factory) -> anyhow::Result<()> {
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

pub(super) async fn order_per_key_is_kept(f: Factory) -> anyhow::Result<()> {
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
