//! Queue contracts: at-least-once work queues with competing consumers, prefetch, retry with
//! attempt counting, release, dead-lettering, first settlement wins, refused settlements, and
//! a stopped consumer's unsettled work reaching another consumer.

mod consumers;
mod delivery;
mod settle;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::ensure;
use tokio::sync::mpsc;
use wrpc_broker::bindings::queue::ConsumeOptions as RawOptions;
use wrpc_broker::{ConsumeOptions, Delivery, ProduceOptions, Queue};

use crate::support::ARRIVAL;
use consumers::{
    a_long_handler_keeps_its_delivery_past_the_visibility,
    a_stopped_consumer_hands_unsettled_work_to_another,
    a_thousand_messages_with_random_failures_all_handled,
    competing_consumers_on_two_instances_share_the_work,
    prefetch_bounds_unsettled_deliveries_handled_concurrently,
};
use delivery::{
    ack_is_final, an_empty_body_is_delivered_empty,
    depth_counts_what_is_not_done_waiting_delayed_or_unsettled, produce_consume_100_with_headers,
};
use settle::{
    a_failing_handler_is_retried_with_backoff_never_released,
    dead_letter_moves_with_reason_and_attempt,
    refused_settlements_hand_the_message_back_and_mark_unhealthy,
    release_puts_back_now_with_the_same_attempt,
    retry_redelivers_after_the_delay_with_attempt_plus_one,
    the_adapter_refuses_a_second_settlement_of_one_tag, the_first_settlement_wins,
};

crate::contract_tests!(
    Queue:
    produce_consume_100_with_headers,
    an_empty_body_is_delivered_empty,
    competing_consumers_on_two_instances_share_the_work,
    prefetch_bounds_unsettled_deliveries_handled_concurrently,
    ack_is_final,
    retry_redelivers_after_the_delay_with_attempt_plus_one,
    release_puts_back_now_with_the_same_attempt,
    dead_letter_moves_with_reason_and_attempt,
    a_failing_handler_is_retried_with_backoff_never_released,
    the_first_settlement_wins,
    the_adapter_refuses_a_second_settlement_of_one_tag,
    a_stopped_consumer_hands_unsettled_work_to_another,
    a_long_handler_keeps_its_delivery_past_the_visibility [Visibility],
    a_thousand_messages_with_random_failures_all_handled,
    refused_settlements_hand_the_message_back_and_mark_unhealthy [Refusals],
    depth_counts_what_is_not_done_waiting_delayed_or_unsettled,
);

/// A consumer of the adapter itself (no host machinery), holding at most `prefetch` deliveries.
async fn raw_consumer(
    adapter: &wrpc_broker::runtime::AdapterInstance,
    name: &str,
    prefetch: u32,
) -> anyhow::Result<(
    u64,
    mpsc::Receiver<Vec<wrpc_broker::bindings::queue::Delivery>>,
)> {
    let options = RawOptions {
        prefetch,
        dead_letter: None,
    };
    Ok(adapter.queue_consume(name.to_string(), options).await?)
}

/// What a test handler saw: (body, attempt) in arrival order.
type Seen = Arc<Mutex<Vec<(String, u32)>>>;

fn text(d: &Delivery) -> String {
    String::from_utf8_lossy(&d.body).into_owned()
}

async fn produce_n(queue: &Queue, name: &str, n: usize) -> anyhow::Result<()> {
    let messages = (0..n)
        .map(|i| (format!("m{i}").into_bytes(), ProduceOptions::default()))
        .collect();
    Ok(queue.produce_batch(name, messages).await?)
}

/// Consume `name`, recording every delivery and acking it; deliveries also go to the channel.
async fn recorder(
    queue: &Queue,
    name: &str,
    prefetch: u32,
) -> anyhow::Result<(
    wrpc_broker::Consumer,
    Seen,
    mpsc::UnboundedReceiver<(String, u32)>,
)> {
    working_recorder(queue, name, prefetch, Duration::ZERO).await
}

/// [`recorder`] whose handler takes `work` for each delivery before acking it.
async fn working_recorder(
    queue: &Queue,
    name: &str,
    prefetch: u32,
    work: Duration,
) -> anyhow::Result<(
    wrpc_broker::Consumer,
    Seen,
    mpsc::UnboundedReceiver<(String, u32)>,
)> {
    let seen: Seen = Arc::default();
    let (tx, rx) = mpsc::unbounded_channel();
    let record = seen.clone();
    let consumer = queue
        .consume(
            name,
            move |d: Delivery| {
                let (record, tx) = (record.clone(), tx.clone());
                async move {
                    record.lock().unwrap().push((text(&d), d.attempt));
                    let _ = tx.send((text(&d), d.attempt));
                    if !work.is_zero() {
                        tokio::time::sleep(work).await;
                    }
                    Ok(())
                }
            },
            ConsumeOptions {
                prefetch,
                dead_letter: None,
            },
        )
        .await?;
    Ok((consumer, seen, rx))
}

/// Wait until `count` deliveries were seen.
async fn until_seen(seen: &Seen, count: usize, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + ARRIVAL;
    while seen.lock().unwrap().len() < count {
        ensure!(
            Instant::now() < deadline,
            "{what}: {} of {count} deliveries within {ARRIVAL:?}",
            seen.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}
