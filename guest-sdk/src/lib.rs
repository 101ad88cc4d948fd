//! Helpers for writing wrpc-broker adapters in Rust.
//!
//! An adapter crate runs `wit_bindgen::generate!` for its own world and maps the shared
//! `wrpc:broker/types` and `wrpc:broker/host` interfaces onto this crate's bindings with `with:`
//! entries, so every adapter uses the same types and helpers:
//!
//! ```text
//! wit_bindgen::generate!({
//!     inline: "package my:adapter; world adapter { include wrpc:broker/log-adapter@0.1.0; }",
//!     path: ["../../wit/broker"],
//!     with: {
//!         "wrpc:broker/types@0.1.0": wrpc_broker_guest::types,
//!         "wrpc:broker/host@0.1.0": wrpc_broker_guest::host,
//!     },
//! });
//! ```

#![deny(missing_docs)]

/// Generated bindings for the imports every adapter shares (the WIT documents them).
#[allow(missing_docs)]
pub mod bindings {
    wit_bindgen::generate!({
        inline: "package wrpc:guest-sdk; world shared { import wrpc:broker/host@0.1.0; }",
        path: ["../wit/broker"],
        pub_export_macro: false,
        generate_all,
    });
}

mod bell;
pub mod coalesce;
pub mod headers;
pub mod ids;
pub mod log;
pub mod options;
pub mod queue;
pub mod relay;
pub mod signal;

/// The host import (`wrpc:broker/host`): logging, ids, sleep, time, token encoding.
pub use bindings::wrpc::broker::host;
/// The shared types (`wrpc:broker/types`).
pub use bindings::wrpc::broker::types;
pub use types::{Error, Headers, Level, Position, Start, Tag};

/// Shorthands for building [`Error`]s.
impl Error {
    /// 400: a malformed id, an id past the tip, a bad name or option.
    pub fn bad_request(msg: impl Into<String>) -> Self {
        Error::BadRequest(msg.into())
    }
    /// 410: an id older than the retained history, or minted by another log.
    pub fn gone(msg: impl Into<String>) -> Self {
        Error::Gone(msg.into())
    }
    /// 503: nobody listens, or the broker is unreachable.
    pub fn unavailable(msg: impl Into<String>) -> Self {
        Error::Unavailable(msg.into())
    }
    /// The broker refused an operation.
    pub fn refused(msg: impl Into<String>) -> Self {
        Error::Refused(msg.into())
    }
    /// A tag or handle of an older generation.
    pub fn stale(msg: impl Into<String>) -> Self {
        Error::Stale(msg.into())
    }
    /// A closed consumer, listener or adapter.
    pub fn closed(msg: impl Into<String>) -> Self {
        Error::Closed(msg.into())
    }
    /// An unexpected condition.
    pub fn internal(msg: impl Into<String>) -> Self {
        Error::Internal(msg.into())
    }
}

/// Wait `ms` milliseconds without blocking other tasks of the instance.
pub async fn sleep(ms: u32) {
    host::sleep(ms).await
}

/// Wall-clock milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    host::now_ms()
}
