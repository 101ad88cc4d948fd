//! The NATS adapter beyond the contract suite (which `tests/tests/contract.rs` runs against it): the
//! suite's restart scenario on a `nats-server -js` of its own, killed and restarted mid queue
//! run and mid log read: nothing lost. A missing server binary fails it: it never skips.

use wrpc_broker_contract::restart::{self, ServerRecipe};

/// The suite's restart scenario on a `nats-server -js` of the test's own, preferably on port
/// 4233, with a store directory of its own (what JetStream acknowledged survives a kill of the
/// process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_loses_nothing() -> anyhow::Result<()> {
    let server = ServerRecipe::new("nats-server", "apt-get install nats-server", 4233)
        .args(["-js", "-a", "127.0.0.1", "-p", "{port}", "-sd", "{data}"])
        .url("nats://127.0.0.1:{port}")
        .option("prefix", "wrpc")
        .option("queue.visibilityMs", "2000");
    restart::a_server_restart_loses_nothing(server).await
}
