//! Queue contracts of delivery: what is produced arrives whole and in order, an ack is
//! final, and the depth counts what is not done.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::ensure;
use tokio::sync::mpsc;
use wrpc_broker::bindings::queue::{ConsumeOptions as RawOptions, Settlement};
use wrpc_broker::{ConsumeOptions, Delivery, ProduceOptions};

use super::{produce_n, recorder, text, until_seen};
use crate::support::{ARRIVAL, SILENCE, recv, unique};
use crate::{Factory, ensure_eq};

pub(super) async fn an_empty_body_is_delivered_empty(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let queue = broker.queue()?;
    let name = unique("empty");
    let empty = ProduceOptions {
        headers: vec![("h".to_string(), Vec::new())],
    };
    queue.produce(&name, Vec::<u8>::new(), empty).await?;
    queue
        .produce(&name, "after", ProduceOptions::default())
        .await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let consumer = queue
        .consume(
            &name,
            move |d: Delivery| {
                let sent = tx.send((d.body.clone(), d.headers.clone()));
                async move { Ok(sent?) }
            },
            ConsumeOptions {
                prefetch: 1,
                dead_letter: None,
            },
        )
        .await?;
    let first = recv(&mut rx, "the empty message").await;
    let second = recv(&mut rx, "the message after it").await;
    consumer.stop().await;
    let (body, headers) = first?;
    ensure_eq!(
        body.len(),
        0,
        "bytes of the first body (zero were produced)"
    );
    ensure_eq!(
        headers,
        vec![("h".to_string(), Vec::new())],
        "the empty message's headers"
    );
    ensure_eq!(second?.0, b"after".to_vec(), "the body after the empty one");
    Ok(())
}

pub(super) async fn produce_consume_100_with_headers(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let queue = broker.queue()?;
    let name = unique("work");
    for i in 0..100 {
        let headers = vec![
            ("n".to_string(), vec![i as u8]),
            ("n".into(), b"again".to_vec()),
        ];
        queue
            .produce(&name, format!("m{i}"), ProduceOptions { headers })
            .await?;
    }
    let got: Arc<Mutex<Vec<Delivery>>> = Arc::default();
    let keep = got.clone();
    let consumer = queue
        .consume(
            &name,
            move |d| {
                let keep = keep.clone();
                async move {
                    keep.lock().unwrap().push(d);
                    Ok(())
                }
            },
            ConsumeOptions {
                prefetch: 1,
                dead_letter: None,
            },
        )
        .await?;
    let deadline = Instant::now() + ARRIVAL;
    while got.lock().unwrap().len() < 100 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    consumer.stop().await;
    let got = got.lock().unwrap().clone();
    ensure_eq!(got.len(), 100, "deliveries");
    for (i, d) in got.iter().enumerate() {
        ensure_eq!(
            text(d),
            format!("m{i}"),
            "body {i} (prefetch 1 keeps the queue order)"
        );
        ensure_eq!(d.attempt, 1, "attempt of {i}");
        ensure_eq!(
            d.headers,
            vec![
                ("n".to_string(), vec![i as u8]),
                ("n".into(), b"again".to_vec())
            ],
            "headers of {i}"
        );
    }
    Ok(())
}

pub(super) async fn ack_is_final(f: Factory) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let queue = broker.queue()?;
    let name = unique("ack");
    produce_n(&queue, &name, 3).await?;
    let (consumer, seen, _) = recorder(&queue, &name, 2).await?;
    until_seen(&seen, 3, "first deliveries").await?;
    tokio::time::sleep(SILENCE).await;
    ensure_eq!(seen.lock().unwrap().len(), 3, "deliveries after acks");
    consumer.stop().await;
    let (again, seen, _) = recorder(&queue, &name, 2).await?;
    tokio::time::sleep(SILENCE).await;
    again.stop().await;
    ensure!(
        seen.lock().unwrap().is_empty(),
        "acked messages came back: {:?}",
        seen.lock().unwrap()
    );
    Ok(())
}

pub(super) async fn depth_counts_what_is_not_done_waiting_delayed_or_unsettled(
    f: Factory,
) -> anyhow::Result<()> {
    let broker = f.instance().await?;
    let (queue, adapter) = (broker.queue()?, broker.adapter());
    let (name, dlq) = (unique("depth"), unique("depth-dead"));
    ensure_eq!(queue.depth(&name).await?, 0, "a queue nobody produced to");
    produce_n(&queue, &name, 3).await?;
    ensure_eq!(queue.depth(&name).await?, 3, "three waiting");
    let options = RawOptions {
        prefetch: 1,
        dead_letter: Some(dlq.clone()),
    };
    let (id, mut deliveries) = adapter.queue_consume(name.clone(), options).await?;
    let mut settle = async |settlement: Settlement| -> anyhow::Result<()> {
        let held = recv(&mut deliveries, "a delivery").await?.remove(0);
        let results = adapter
            .queue_settle(id, vec![(held.tag, settlement)])
            .await?;
        ensure!(results.iter().all(|r| r.is_ok()), "settled: {results:?}");
        Ok(())
    };
    // Delivered and unsettled still counts; a retry waiting for its delay counts.
    settle(Settlement::Retry(60_000)).await?;
    ensure_eq!(queue.depth(&name).await?, 3, "one delayed, two waiting");
    settle(Settlement::Ack).await?;
    ensure_eq!(queue.depth(&name).await?, 2, "after an ack");
    settle(Settlement::DeadLetter("no".into())).await?;
    ensure_eq!(
        queue.depth(&name).await?,
        1,
        "after a dead-letter: the delayed retry"
    );
    ensure_eq!(queue.depth(&dlq).await?, 1, "the dead-letter queue");
    adapter.queue_stop(id).await?;
    ensure_eq!(
        queue.depth(&name).await?,
        1,
        "a stopped consumer changes nothing"
    );
    Ok(())
}
