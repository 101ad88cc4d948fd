use wrpc_broker::Broker;
use wrpc_broker_contract::{Factory, RunOptions, report, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scratch() {
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    let filter = std::env::var("F").unwrap();
    let f = Factory::new(|options| async move { Ok(Broker::builder().url("nats://127.0.0.1:4222")?.option("prefix", "scratch").options(options).open().await?) });
    let out = run(&f, RunOptions { filter: Some(&filter), stop_on_failure: false }, |_, _, _| {}).await.unwrap();
    println!("{}", report(&out));
}
