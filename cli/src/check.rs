//! `wrpc-broker check`: the contract suite (the same library the cargo tests use) against any
//! adapter component file, a third party's included, with a verdict table.

use std::io::Write as _;
use std::path::PathBuf;

use wrpc_broker::drivers::memory::Fault;
use wrpc_broker::{Broker, MemoryStore};
use wrpc_broker_contract::{Factory, RunOptions, any_failed, report, run};

/// Host instances of the component at `path` on the broker at `url`. On `memory://` they share
/// one fresh store, which can be told to refuse settlements.
pub fn factory(path: PathBuf, url: String) -> anyhow::Result<Factory> {
    let memory = url.starts_with("memory").then(MemoryStore::new);
    let store = memory.clone();
    let factory = Factory::new(move |options| {
        let (path, url, store) = (path.clone(), url.clone(), store.clone());
        async move {
            let mut builder = Broker::builder()
                .url(&url)?
                .component_file(path)
                .options(options);
            if let Some(store) = store {
                builder = builder.memory_store(store);
            }
            Ok(builder.open().await?)
        }
    });
    Ok(match memory {
        Some(store) => factory.with_settlement_refusals(move |queue, count| {
            store.inject(Fault::RefuseSettlements {
                queue: format!("wrpc/queue/{queue}"),
                count,
            })
        }),
        None => factory,
    })
}

/// Run the suite and print the table; `Ok(false)` when a test failed.
pub async fn run_check(path: PathBuf, url: String, filter: Option<String>) -> anyhow::Result<bool> {
    if !path.is_file() {
        anyhow::bail!("no component file at {}", path.display());
    }
    let factory = factory(path.clone(), url.clone())?;
    let options = RunOptions {
        filter: filter.as_deref(),
        stop_on_failure: false,
    };
    eprintln!("checking {} on {url}", path.display());
    let outcomes = run(&factory, options, |i, total, test| {
        eprint!(
            "\r\x1b[2K[{}/{total}] {}/{}",
            i + 1,
            test.capability.name(),
            test.name
        );
        let _ = std::io::stderr().flush();
    })
    .await?;
    eprintln!("\r\x1b[2K");
    print!("{}", report(&outcomes));
    Ok(!any_failed(&outcomes))
}
