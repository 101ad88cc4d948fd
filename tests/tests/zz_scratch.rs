use wrpc_broker::Broker;
use wrpc_broker_contract::{Factory, RunOptions, report, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scratch() {
    let filter = std::env::var("F").unwrap();
    let f = Factory::new(|options| async move {
        Ok(Broker::builder()
            .url("nats://127.0.0.1:4222")?
            .option("prefix", "scratch")
            .options(options)
            .open()
            .await?)
    });
    let out = run(
        &f,
        RunOptions {
            filter: Some(&filter),
            stop_on_failure: false,
        },
        |_, _, _| {},
    )
    .await
    .unwrap();
    println!("{}", report(&out));
}
