//! The README's "Using it" examples, compiled by `cargo test` and run by `tests/readme.rs`,
//! which also checks that every line of the README's Rust blocks stands here (so the README
//! cannot drift from code that builds). `cargo run -p wrpc-broker --example readme` runs it.

use futures::StreamExt;
use wrpc_broker::{AppendOptions, Broker, ReadFrom};

/// The first README block: a log written, read back from an id, and a backplane subscription.
#[rustfmt::skip]
pub async fn using_it() -> anyhow::Result<()> {
    let broker = Broker::memory().await?;                    // or Broker::open("adapter.wasm", options)
    let log = broker.log()?;
    let first = log.append("orders", b"order 1".to_vec(), AppendOptions::default()).await?;
    log.append("orders", b"order 2".to_vec(), AppendOptions::default()).await?;
    let mut reader = log.read("orders", ReadFrom::After(first)).await?;  // strictly after `first`
    let entry = reader.next_entry().await.expect("a live reader")?;     // "order 2", then waits

    let mut room = broker.backplane()?.subscribe("room:lobby").await?;  // a literal name
    broker.backplane()?.publish("room:lobby", b"hello".to_vec()).await?;
    let message = room.next().await;                                     // at-most-once fan-out

    assert_eq!(entry.value, b"order 2");
    assert_eq!(message.as_deref(), Some(&b"hello"[..]));
    Ok(())
}

/// The second README block: two host instances on one memory broker.
#[rustfmt::skip]
pub async fn two_instances() -> anyhow::Result<()> {
    let store = wrpc_broker::MemoryStore::new();
    let a = Broker::builder().memory_store(store.clone()).open().await?;
    let b = Broker::builder().memory_store(store).open().await?;

    let id = a
        .log()?
        .append("feed", b"from a".to_vec(), AppendOptions::default())
        .await?;
    let mut reader = b.log()?.read("feed", ReadFrom::Earliest).await?;
    let entry = reader.next_entry().await.expect("a live reader")?;
    assert_eq!((entry.value.as_slice(), entry.id), (&b"from a"[..], id));
    Ok(())
}

#[allow(dead_code)] // `tests/readme.rs` includes this file for the two functions above.
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    using_it().await?;
    two_instances().await?;
    println!("the README examples ran");
    Ok(())
}
