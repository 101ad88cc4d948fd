//! A wrpc-broker adapter: the `log` and `backplane` capabilities on the host's in-process
//! broker, `wrpc:memory/store`. A starting point: edit it into the adapter you need.
//!
//! - `wit/world.wit` says what the component exports (its capabilities) and imports (the broker
//!   connection the host lends it). `wit/deps/` holds the host's WIT packages: leave them as
//!   they are, they must match the host that loads the component.
//! - This file: the lifecycle (`describe`, `init`, `close`) and what the capabilities share.
//! - `log.rs`, `backplane.rs`: one capability each, on the store's logs and channels.
//!
//! The rule every adapter keeps: nothing lasting in the component's memory. The host may start
//! a new instance at any time (after a trap, on a hot swap, on another host), so entries,
//! epochs and subscriptions live in the broker; an instance keeps only its options.
//!
//! Build with `cargo build --target wasm32-wasip2 --release`, then run the contract suite on
//! the file: `wrpc-broker check target/wasm32-wasip2/release/<crate name>.wasm`.

// Bindings for the world in `wit/` (its dependencies in `wit/deps/`): the imports as plain
// functions (`wrpc::memory::store::log_append`, `wrpc::broker::host::log`, …), each export as
// a `Guest` trait to implement, and `wit_stream::new` for the streams the exports return.
// `generate_all`: bindings for the interfaces of `wit/deps/` too (wit-bindgen otherwise wants a
// `with:` entry for each, naming bindings generated elsewhere, as an SDK crate would provide).
wit_bindgen::generate!({ path: "wit", generate_all });

mod backplane;
mod log;

use std::cell::Cell;

use exports::wrpc::broker::adapter::{Guest, Info, OptionInfo};
use wit_bindgen::{StreamReader, StreamResult, StreamWriter};
use wrpc::broker::host;
use wrpc::broker::types::{Error, Level};
use wrpc::memory::store::StoreError;

/// The component: one type implementing every exported interface's `Guest` trait.
struct Adapter;
export!(Adapter);

/// Option `retention.maxEntries` when `init` is not given it.
const DEFAULT_MAX_ENTRIES: u32 = 10_000;

thread_local! {
    /// The `retention.maxEntries` that `init` set; `None` before `init`. An instance's options
    /// are the only state it keeps, and `init` gives them again to every new instance.
    static MAX_ENTRIES: Cell<Option<u32>> = const { Cell::new(None) };
}

/// The retention `init` configured, or `closed` when `init` has not run.
fn max_entries() -> Result<u32, Error> {
    MAX_ENTRIES
        .get()
        .ok_or_else(|| Error::Closed("the adapter was not initialised".into()))
}

/// A name the caller gave (a topic, a channel), checked: empty is a bad request.
fn checked(kind: &str, name: String) -> Result<String, Error> {
    if name.is_empty() {
        return Err(Error::BadRequest(format!("the {kind} name is empty")));
    }
    Ok(name)
}

/// A store error is the broker error of the same kind, so `?` works on store calls.
impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::BadRequest(m) => Error::BadRequest(m),
            StoreError::Unavailable(m) => Error::Unavailable(m),
            StoreError::Refused(m) => Error::Refused(m),
            StoreError::Timeout(m) => Error::Timeout(m),
        }
    }
}

/// Forward a stream from the broker into a stream an export returned, converting each item,
/// in a task of its own that outlives the export call (this is what `async-spawn` is for).
/// It ends when the broker's stream ends (then the reader sees the end) or when the reader has
/// gone (noticed at the next write); dropping `from` then tells the broker to stop sending.
fn forward<T: 'static, U: 'static>(
    mut from: StreamReader<T>,
    mut to: StreamWriter<U>,
    convert: impl Fn(T) -> U + 'static,
) {
    wit_bindgen::spawn_local(async move {
        loop {
            let (result, items) = from.read(Vec::with_capacity(64)).await;
            let items: Vec<U> = items.into_iter().map(&convert).collect();
            // `write_all` hands back what it could not write: the reader has gone.
            if !items.is_empty() && !to.write_all(items).await.is_empty() {
                return;
            }
            if !matches!(result, StreamResult::Complete(_)) {
                return;
            }
        }
    });
}

impl Guest for Adapter {
    /// What `wrpc-broker inspect` shows. The name comes from Cargo.toml; it is also the log
    /// target of this adapter's lines on the host (`broker.<name>`).
    fn describe() -> Info {
        Info {
            name: env!("CARGO_PKG_NAME").into(),
            version: env!("CARGO_PKG_VERSION").into(),
            broker: "memory".into(),
            // The contract suite runs its retention test only on an adapter that lists this.
            options: vec![OptionInfo {
                name: "retention.maxEntries".into(),
                default_value: DEFAULT_MAX_ENTRIES.to_string(),
                doc: "Entries kept per topic in the logs this adapter creates.".into(),
            }],
        }
    }

    /// Read the options; an unknown one or a bad value is a bad request naming it.
    async fn init(generation: u32, options: Vec<(String, String)>) -> Result<(), Error> {
        let mut max_entries = DEFAULT_MAX_ENTRIES;
        for (name, value) in options {
            match name.as_str() {
                "retention.maxEntries" => {
                    max_entries = value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        Error::BadRequest(format!(
                            "option `retention.maxEntries`: `{value}` is not a count of at least 1"
                        ))
                    })?;
                }
                _ => return Err(Error::BadRequest(format!("unknown option `{name}`"))),
            }
        }
        MAX_ENTRIES.set(Some(max_entries));
        host::log(
            Level::Debug,
            &format!("instance {generation} keeps {max_entries} entries per log"),
        );
        Ok(())
    }

    /// Nothing to release: the forwarding tasks end when the host drops their streams.
    /// An adapter with queue consumers or direct listeners stops them here.
    async fn close() {}
}
