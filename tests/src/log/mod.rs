//! Log contracts: ordered, replayable feeds a reader resumes from an id, on any instance.
//! `adapter` checks the adapter's own `range`/`tail` contract through raw calls; the rest check
//! what an application sees through [`wrpc_broker::Log`]: `reads`, `ids` a read refuses, and
//! `concurrent` appenders. The helpers below are shared by them.

mod adapter;
mod concurrent;
mod ids;
mod reads;

use anyhow::Context as _;
use wrpc_broker::bindings::log::RecordIn;
use wrpc_broker::{AppendOptions, Entry, Reader};

use crate::support::next;
use adapter::{
    adapter_range_pages_are_dense_and_ordered, adapter_tail_yields_every_later_entry_once_in_order,
};
use concurrent::{
    appends_behind_a_dropped_one_still_land, batches_from_two_instances_each_keep_their_order,
    concurrent_appends_get_distinct_ids_in_log_order,
};
use ids::{
    a_malformed_id_is_bad_request, an_id_from_another_log_is_gone,
    an_id_older_than_retention_is_gone, an_id_past_the_tip_is_bad_request,
};
use reads::{
    a_reader_joins_the_live_tail_without_gap_or_duplicate, a_slow_reader_catches_up_without_gap,
    an_empty_value_reads_back_empty, append_100_with_headers_and_keys_reads_back_in_order,
    fifty_concurrent_readers_see_every_entry_in_order, latest_yields_only_new_entries,
    order_per_key_is_kept, read_after_an_id_resumes_strictly_after_it,
    read_after_an_id_works_on_another_instance,
};

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
    appends_behind_a_dropped_one_still_land,
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
