//! Catch-up pages sized by bytes: a reader reads through entries of any size the broker holds.

use wrpc_broker::{AppendOptions, Broker, ReadFrom};

const MIB: usize = 1 << 20;

/// Append one entry of `size` bytes per size to `topic` (one at a time: a batch of large ones
/// would not fit the component either), then read them all from the earliest and check each.
async fn append_then_read(topic: &str, sizes: &[usize]) {
    let broker = Broker::memory().await.expect("a memory broker");
    let log = broker.log().expect("the log capability");
    for (n, size) in sizes.iter().enumerate() {
        log.append(
            topic,
            vec![(n % 251) as u8; *size],
            AppendOptions::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("append {n}: {e}"));
    }
    let mut reader = log.read(topic, ReadFrom::Earliest).await.expect("a reader");
    for (n, size) in sizes.iter().enumerate() {
        let entry = reader
            .next_entry()
            .await
            .expect("the reader goes on")
            .unwrap_or_else(|e| panic!("entry {n}: {e}"));
        assert_eq!(entry.value.len(), *size, "entry {n}");
        assert!(
            entry.value.iter().all(|b| *b == (n % 251) as u8),
            "entry {n}"
        );
    }
}

/// 300 entries of 1 MiB: a first page of 256 of them (256 MiB) is more than the component's
/// 256 MiB of memory. Asked by count alone, that page trapped every time and the read failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_catches_up_through_entries_of_a_mebibyte() {
    append_then_read("big", &[MIB; 300]).await;
}

/// Small entries first (the pages after the first grow to thousands of entries), then 300 of
/// 1 MiB: the grown page traps, and is asked again at half its size until it fits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_grown_on_small_entries_shrinks_when_large_ones_follow() {
    let sizes: Vec<usize> = std::iter::repeat_n(10, 600)
        .chain(std::iter::repeat_n(MIB, 300))
        .collect();
    append_then_read("growing", &sizes).await;
}
