//! The contract suite against the memory adapter component loaded from its `.wasm` file, and
//! against every mutant memory adapter, on which the suite must fail.

use wrpc_broker::drivers::memory::Fault;
use wrpc_broker::{Broker, MemoryStore};
use wrpc_broker_contract::{Factory, RunOptions, Verdict, any_failed, components, report, run};

/// Host instances of the component at `path`, all on one fresh memory broker, whose store can
/// be told to refuse settlements.
fn memory_factory(path: &'static str) -> Factory {
    let store = MemoryStore::new();
    let faults = store.clone();
    Factory::new(move |options| {
        let store = store.clone();
        async move {
            Ok(Broker::builder()
                .component_file(path)
                .memory_store(store)
                .options(options)
                .open()
                .await?)
        }
    })
    .with_settlement_refusals(move |queue, count| {
        faults.inject(Fault::RefuseSettlements {
            queue: format!("wrpc/queue/{queue}"),
            count,
        })
    })
}

async fn suite(path: &'static str, options: RunOptions<'_>) -> Vec<wrpc_broker_contract::Outcome> {
    run(&memory_factory(path), options, |_, _, _| {})
        .await
        .expect("the suite runs")
}

fn only(filter: &str) -> RunOptions<'_> {
    RunOptions {
        filter: Some(filter),
        stop_on_failure: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_contract_on_memory() {
    let outcomes = suite(components::MEMORY, only("log/")).await;
    println!("{}", report(&outcomes));
    assert!(!outcomes.is_empty());
    assert!(!any_failed(&outcomes), "{}", report(&outcomes));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_contract_on_memory() {
    let outcomes = suite(components::MEMORY, only("queue/")).await;
    println!("{}", report(&outcomes));
    assert!(!outcomes.is_empty());
    assert!(!any_failed(&outcomes), "{}", report(&outcomes));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_contract_on_memory() {
    let outcomes = suite(components::MEMORY, only("direct/")).await;
    println!("{}", report(&outcomes));
    assert!(!outcomes.is_empty());
    assert!(!any_failed(&outcomes), "{}", report(&outcomes));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backplane_contract_on_memory() {
    let outcomes = suite(components::MEMORY, only("backplane/")).await;
    println!("{}", report(&outcomes));
    assert!(!outcomes.is_empty());
    assert!(!any_failed(&outcomes), "{}", report(&outcomes));
}

/// The suite must fail on the mutant `name` (stopping at the first failure it finds).
async fn the_suite_catches(name: &str) {
    let path = components::MUTANTS
        .iter()
        .find(|(mutant, _)| *mutant == name)
        .map(|(_, path)| *path)
        .expect("a mutant of that name");
    let options = RunOptions {
        filter: None,
        stop_on_failure: true,
    };
    let outcomes = suite(path, options).await;
    let caught: Vec<_> = outcomes
        .iter()
        .filter(|o| matches!(o.verdict, Verdict::Fail(_)))
        .map(|o| format!("{}/{}", o.capability.name(), o.name))
        .collect();
    println!("mutant {name}: caught by {caught:?}");
    assert!(
        !caught.is_empty(),
        "the suite passed on mutant {name}:\n{}",
        report(&outcomes)
    );
}

macro_rules! mutants {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                the_suite_catches($name).await;
            }
        )*

        #[test]
        fn every_mutant_has_a_test() {
            let tested = [$($name),*];
            for (mutant, _) in components::MUTANTS {
                assert!(tested.contains(mutant), "mutant {mutant} has no test");
            }
        }
    };
}

mutants!(
    the_suite_catches_a_skipped_entry => "skip-entry",
    the_suite_catches_a_duplicated_entry => "duplicate-entry",
    the_suite_catches_reordered_entries => "reorder",
    the_suite_catches_a_pattern_channel => "pattern-channel",
    the_suite_catches_a_replayed_backplane_payload => "replay-backplane",
    the_suite_catches_a_packet_delivered_twice => "deliver-twice",
    the_suite_catches_an_ignored_group => "ignore-group",
    the_suite_catches_a_lost_retry => "lose-retry",
    the_suite_catches_a_second_settlement_winning => "second-settlement-wins",
    the_suite_catches_a_stop_that_drops_what_reached_the_listener => "drop-on-stop",
);
