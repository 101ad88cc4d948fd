//! `log.parse-id` of every adapter, through its component: any text answers `Ok` or a bad
//! request / gone, never a trap or an internal error. Memory always; Redis and NATS at
//! `WRPC_FUZZ_REDIS` / `WRPC_FUZZ_NATS` (default: the local servers), skipped when set empty.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use wrpc_broker::{Broker, Error};

struct Adapters {
    runtime: tokio::runtime::Runtime,
    brokers: Vec<(String, Broker)>,
}

fn adapters() -> &'static Adapters {
    static ADAPTERS: OnceLock<Adapters> = OnceLock::new();
    ADAPTERS.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let urls = [
            ("memory", "memory://".to_string()),
            (
                "redis",
                std::env::var("WRPC_FUZZ_REDIS").unwrap_or("redis://127.0.0.1:6379".into()),
            ),
            (
                "nats",
                std::env::var("WRPC_FUZZ_NATS").unwrap_or("nats://127.0.0.1:4222".into()),
            ),
        ];
        let brokers = runtime.block_on(async {
            let mut brokers = Vec::new();
            for (name, url) in urls.into_iter().filter(|(_, url)| !url.is_empty()) {
                let broker = Broker::connect(&url)
                    .await
                    .unwrap_or_else(|e| panic!("{name} at {url}: {e}"));
                brokers.push((name.to_string(), broker));
            }
            brokers
        });
        Adapters { runtime, brokers }
    })
}

fuzz_target!(|text: String| {
    let adapters = adapters();
    adapters.runtime.block_on(async {
        for (name, broker) in &adapters.brokers {
            match broker.adapter().log_parse_id(text.clone()).await {
                Ok(()) | Err(Error::BadRequest(_)) | Err(Error::Gone(_)) => {}
                Err(e) => panic!("{name}: parse-id({text:?}): {e}"),
            }
        }
    });
});
