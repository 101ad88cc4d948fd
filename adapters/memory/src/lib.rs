//! The memory adapter: every capability of `wrpc:broker` mapped onto the host's in-process
//! `wrpc:memory/store`.
//!
//! Everything lasting (log entries, queued messages, channel and inbox registrations) lives in
//! the store, which several host instances share. This component keeps only what an instance
//! may lose on a trap: its options and generation, and its live consumers and listeners with
//! their unsettled deliveries (the store's leases bring those back).
//!
//! Store names: logs `{prefix}/log/{topic}`, queues `{prefix}/queue/{name}`, channels
//! `{prefix}/chan/{channel}`; inbox addresses are used verbatim.

wit_bindgen::generate!({
    inline: "package wrpc:memory-adapter; world adapter { include wrpc:broker/full-adapter@0.1.0; import wrpc:memory/store@0.1.0; }",
    path: ["../../wit/broker", "wit"],
    with: {
        "wrpc:broker/types@0.1.0": wrpc_broker_guest::types,
        "wrpc:broker/host@0.1.0": wrpc_broker_guest::host,
        "wrpc:memory/store@0.1.0": generate,
    },
});

mod backplane;
mod direct;
mod log;
mod queue;

use std::cell::RefCell;
use std::rc::Rc;

use exports::wrpc::broker::adapter::{Guest, Info, OptionInfo};
use wrpc::memory::store::StoreError;
use wrpc_broker_guest::options::{self, Options, Spec};
use wrpc_broker_guest::{Error, host};

/// The component; it implements every exported interface.
struct Component;
export!(Component);

/// The default of option `prefix`.
const DEFAULT_PREFIX: &str = "wrpc";

/// The options this adapter takes (`describe` lists them, `init` reads them).
const OPTIONS: &[Spec] = &[
    Spec {
        name: "retention.maxEntries",
        default: "10000",
        doc: "Entries kept per topic in the logs this adapter creates; older ones are trimmed.",
    },
    Spec {
        name: "epoch",
        default: "",
        doc: "Stamped into the ids of every log this adapter creates (default: a fresh random id per log).",
    },
    Spec {
        name: "prefix",
        default: DEFAULT_PREFIX,
        doc: "Namespace of every log, queue and channel name in the store.",
    },
    Spec {
        name: options::VISIBILITY_MS,
        default: "30000",
        doc: "Lease a consumer takes on a delivery; renewed every third of it until settled.",
    },
];

/// What `init` configured; fixed for the life of the instance.
struct Config {
    /// The instance generation, stamped into every delivery tag.
    generation: u32,
    /// Namespace of every store name.
    prefix: String,
    /// Retention of the logs this adapter creates.
    max_entries: u32,
    /// Epoch stamped on every log this adapter creates; `None`: a fresh id per log, so an id
    /// minted by one log is foreign (410) to every other.
    epoch: Option<String>,
    /// The lease a queue consumer takes, in milliseconds.
    visibility_ms: u32,
}

impl Config {
    /// Read the `init` options; an unknown option or a bad value is a bad request naming it.
    fn from_options(generation: u32, given: Vec<(String, String)>) -> Result<Self, Error> {
        let options = Options::new(OPTIONS, given)?;
        let config = Config {
            generation,
            prefix: options.text("prefix").unwrap_or_default(),
            max_entries: options.at_least("retention.maxEntries", 1)?,
            epoch: options.text("epoch"),
            visibility_ms: options.at_least(options::VISIBILITY_MS, 1)?,
        };
        if config.prefix.is_empty() {
            return Err(Error::bad_request("option `prefix` must not be empty"));
        }
        if let Some(epoch) = config.epoch.as_ref().filter(|e| !log::is_epoch(e)) {
            return Err(Error::bad_request(format!(
                "option `epoch`: `{epoch}` is not [A-Za-z0-9_-]+"
            )));
        }
        Ok(config)
    }

    /// Make `call`, a store call that creates its log when missing, with the epoch for a log
    /// created now: the configured one, or this instance's spare fresh id, which stays spare
    /// until a log is created with it (`epoch_of` its answer is the spare), so a call on a log
    /// that exists costs no `generate-id` and every log still gets its own epoch.
    pub(crate) fn creating_log<R>(
        &self,
        call: impl FnOnce(&str) -> R,
        epoch_of: impl FnOnce(&R) -> &str,
    ) -> R {
        if let Some(epoch) = &self.epoch {
            return call(epoch);
        }
        SPARE_EPOCH.with_borrow_mut(|spare| {
            let fresh = spare.get_or_insert_with(host::generate_id);
            let answer = call(fresh);
            if epoch_of(&answer) == fresh.as_str() {
                *spare = None;
            }
            answer
        })
    }

    /// The store name of `name` in namespace `kind` (`log`, `queue`, `chan`); empty is a bad
    /// request.
    fn name(&self, kind: &str, name: &str) -> Result<String, Error> {
        if name.is_empty() {
            return Err(Error::bad_request(format!("empty {kind} name")));
        }
        if cfg!(feature = "other-names") {
            return Ok(format!("{name}#{kind}@{}", self.prefix));
        }
        Ok(format!("{}/{kind}/{name}", self.prefix))
    }
}

thread_local! {
    /// The configuration `init` set; none before.
    static CONFIG: RefCell<Option<Rc<Config>>> = const { RefCell::new(None) };
    /// A fresh epoch for the next log this instance creates. Nothing lasting: an instance that
    /// loses it takes another.
    static SPARE_EPOCH: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The configuration, or `closed` before `init`.
fn config() -> Result<Rc<Config>, Error> {
    #[cfg(feature = "chaos-trap-every-500")]
    chaos_tick();
    CONFIG
        .with_borrow(Clone::clone)
        .ok_or_else(|| Error::closed("the adapter was not initialised"))
}

/// Chaos, not a mutant: trap on every 500th call that reads the configuration (nearly every
/// export does), so tests show a trapping adapter loses nothing.
#[cfg(feature = "chaos-trap-every-500")]
fn chaos_tick() {
    thread_local! {
        static CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }
    let calls = CALLS.with(|c| {
        c.set(c.get() + 1);
        c.get()
    });
    if calls % 500 == 0 {
        panic!("chaos: trapping on call {calls}");
    }
}

/// A store error as a broker error, same kind and message.
fn store_error(e: StoreError) -> Error {
    match e {
        StoreError::BadRequest(m) => Error::BadRequest(m),
        StoreError::Unavailable(m) => Error::Unavailable(m),
        StoreError::Refused(m) => Error::Refused(m),
        StoreError::Timeout(m) => Error::Timeout(m),
    }
}

impl Guest for Component {
    fn describe() -> Info {
        Info {
            name: "memory".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            broker: "memory".to_string(),
            options: wrpc_broker_guest::option_infos!(OPTIONS),
        }
    }

    async fn init(generation: u32, options: Vec<(String, String)>) -> Result<(), Error> {
        let config = Config::from_options(generation, options)?;
        CONFIG.set(Some(Rc::new(config)));
        Ok(())
    }

    async fn close() {
        wrpc_broker_guest::queue::stop_all().await;
        direct::stop_all().await;
    }
}
