//! The contract suite against every mutant memory adapter, on which the suite must fail (the
//! memory adapter itself passes it in `tests/contract.rs`).

use wrpc_broker_contract::{Factory, RunOptions, Verdict, components, report, run};

async fn suite(path: &'static str, options: RunOptions<'_>) -> Vec<wrpc_broker_contract::Outcome> {
    let factory = Factory::for_url("memory://", Some(path.into()), Vec::new())
        .await
        .expect("a memory broker");
    run(&factory, options, |_, _, _| {})
        .await
        .expect("the suite runs")
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
    the_suite_catches_dropped_zero_length_messages => "drop-empty",
);

/// Each capability's zero-length test fails on the adapter that drops zero-length messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_zero_length_test_fails_on_the_adapter_that_drops_them() {
    let path = components::MUTANTS
        .iter()
        .find(|(mutant, _)| *mutant == "drop-empty")
        .map(|(_, path)| *path)
        .expect("the drop-empty mutant");
    let outcomes = suite(path, RunOptions::default()).await;
    let zero_length = [
        "log/an_empty_value_reads_back_empty",
        "queue/an_empty_body_is_delivered_empty",
        "direct/an_empty_packet_arrives_empty",
        "backplane/an_empty_payload_arrives_empty",
    ];
    for test in zero_length {
        let outcome = outcomes
            .iter()
            .find(|o| format!("{}/{}", o.capability.name(), o.name) == test)
            .unwrap_or_else(|| panic!("no test {test}"));
        assert!(
            matches!(outcome.verdict, Verdict::Fail(_)),
            "{test} passed on the drop-empty mutant:\n{}",
            report(&outcomes)
        );
    }
}
