//! `init` of the memory adapter with any options, through its component (the options parser as
//! the adapter runs it): the instance starts or refuses with a bad request, never traps.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use wrpc_broker::{Broker, Error};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
}

fuzz_target!(|given: Vec<(String, String)>| {
    runtime().block_on(async {
        match Broker::builder().options(given.clone()).open().await {
            Ok(_) | Err(Error::BadRequest(_)) => {}
            Err(e) => panic!("init({given:?}): {e}"),
        }
    });
});
