//! The adapter's own `range` and `tail` contract, through raw calls.

use anyhow::{Context as _, bail, ensure};
use wrpc_broker::bindings::types::Start;

use super::{append_n, record};
use crate::support::unique;
use crate::{Factory, ensure_eq};

pub(super) async fn adapter_range_pages_are_dense_and_ordered(f: Factory) -> anyhow::Result<()> {
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

pub(super) async fn adapter_tail_yields_every_later_entry_once_in_order(
    f: Factory,
) -> anyhow::Result<()> {
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
            (0..50).map(|i| record(format!("t{i}"))).collect::<Vec<_>>(),
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
            (50..55)
                .map(|i| record(format!("t{i}")))
                .collect::<Vec<_>>(),
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
