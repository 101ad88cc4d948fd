//! The adapters' options parser (`wrpc_broker_guest::options`, compiled natively here): any
//! list of given options is accepted or refused as a bad request, and reading an accepted one
//! never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

/// What the parser needs of the guest SDK's `Error`.
#[derive(Debug)]
#[allow(dead_code)]
enum Error {
    BadRequest(String),
}

impl Error {
    fn bad_request(message: impl Into<String>) -> Self {
        Error::BadRequest(message.into())
    }
}

#[path = "../../guest-sdk/src/options.rs"]
#[allow(dead_code, unused_macros)]
mod options;

use options::{Options, Spec};

const TABLE: &[Spec] = &[
    Spec {
        name: "retention.maxEntries",
        default: "10000",
        doc: "",
    },
    Spec {
        name: "queue.visibilityMs",
        default: "30000",
        doc: "",
    },
    Spec {
        name: "prefix",
        default: "",
        doc: "",
    },
];

fuzz_target!(|given: Vec<(String, String)>| {
    match Options::new(TABLE, given.clone()) {
        Ok(options) => {
            let _ = options.get::<u32>("retention.maxEntries");
            let _ = options.at_least("queue.visibilityMs", 1);
            let _ = options.text("prefix");
        }
        Err(Error::BadRequest(message)) => assert!(!message.is_empty()),
    }
});
