//! The NATS + JetStream adapter: every capability of `wrpc:broker` mapped onto the host's
//! `wrpc:nats/client` driver (core publish / subscribe / request with headers).
//!
//! Core NATS carries the backplane ([`backplane`]) and direct inboxes ([`direct`]); JetStream,
//! driven by request/reply on `$JS.API.*` and `$JS.ACK.*`, carries the logs (a stream per topic,
//! [`log`]) and the queues (a work-queue stream with one shared durable pull consumer per queue,
//! [`queue`]). Nothing lasting lives in this component: streams, consumers and log epochs are in
//! the server, so every instance (and every host) agrees and a trap loses nothing.
//!
//! Names: subjects `P.log.<enc>`, `P.q.<enc>`, `P.bp.<enc>`, `P.dx.<enc>`; streams `P_log_<enc>`,
//! `P_q_<enc>`; `P` = option `prefix`, `enc` = `host.encode-token` with safe `A-Za-z0-9-` and
//! escape `_`, so `.`, `*`, `>`, whitespace and `/` never reach a subject or stream name raw.
//! Headers: NATS headers are text and unordered across names, so the broker's headers (bytes,
//! repeats, order) travel packed in one `x-wrpc-headers` header; the adapter's own fields
//! (`x-wrpc-attempt`, `x-wrpc-key`, …) are NATS headers of their own.

wit_bindgen::generate!({
    inline: "package wrpc:nats-adapter; world adapter { include wrpc:broker/full-adapter@0.1.0; import wrpc:nats/client@0.1.0; }",
    path: ["../../wit/broker", "wit"],
    with: {
        "wrpc:broker/types@0.1.0": wrpc_broker_guest::types,
        "wrpc:broker/host@0.1.0": wrpc_broker_guest::host,
        "wrpc:nats/client@0.1.0": generate,
    },
});

mod backplane;
mod codec;
mod direct;
mod js;
mod log;
mod queue;

use std::cell::RefCell;
use std::rc::Rc;

use exports::wrpc::broker::adapter::{Guest, Info, OptionInfo};
use wrpc::nats::client::NatsError;
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
        name: "prefix",
        default: DEFAULT_PREFIX,
        doc: "Namespace of every subject and stream ([A-Za-z0-9-], at most 32).",
    },
    Spec {
        name: "retention.maxEntries",
        default: "10000",
        doc: "max_msgs of the log streams this adapter creates (older entries are trimmed).",
    },
    Spec {
        name: options::VISIBILITY_MS,
        default: "30000",
        doc: "ack_wait of the queue consumers; held deliveries get +WPI every half of it.",
    },
    Spec {
        name: "storage",
        default: "file",
        doc: "Storage of the streams this adapter creates: file or memory.",
    },
    Spec {
        name: "replicas",
        default: "1",
        doc: "num_replicas of the streams this adapter creates.",
    },
];
/// The characters a name keeps in a subject token or stream name.
const SAFE: &str = "A-Za-z0-9-";
/// The longest stream name we make (JetStream allows 255; the file store needs headroom).
const MAX_NAME: usize = 200;

/// What `init` configured; fixed for the life of the instance.
pub(crate) struct Config {
    /// The instance generation, stamped into every delivery tag.
    pub(crate) generation: u32,
    /// Namespace of every subject and stream.
    pub(crate) prefix: String,
    /// `max_msgs` of the log streams this adapter creates.
    pub(crate) max_entries: u32,
    /// `ack_wait` of the queue consumers, in milliseconds (option `queue.visibilityMs`).
    pub(crate) visibility_ms: u32,
    /// `file` or `memory`: where the streams this adapter creates are stored.
    pub(crate) storage: String,
    /// `num_replicas` of the streams this adapter creates.
    pub(crate) replicas: u32,
}

impl Config {
    /// Read the `init` options; an unknown option or a bad value is a bad request naming it.
    fn from_options(generation: u32, given: Vec<(String, String)>) -> Result<Self, Error> {
        let options = Options::new(OPTIONS, given)?;
        let config = Config {
            generation,
            prefix: options.text("prefix").unwrap_or_default(),
            max_entries: options.at_least("retention.maxEntries", 1)?,
            visibility_ms: options.at_least(options::VISIBILITY_MS, 100)?,
            storage: options.text("storage").unwrap_or_default(),
            replicas: options.at_least("replicas", 1)?,
        };
        if config.prefix.is_empty()
            || config.prefix.len() > 32
            || !config
                .prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(Error::bad_request(
                "option `prefix` must be 1 to 32 of [A-Za-z0-9-]",
            ));
        }
        if config.storage != "file" && config.storage != "memory" {
            return Err(Error::bad_request(
                "option `storage` must be `file` or `memory`",
            ));
        }
        if config.replicas > 5 {
            return Err(Error::bad_request("option `replicas` must be 1 to 5"));
        }
        Ok(config)
    }

    /// `name` encoded for a subject token or a stream name; empty is a bad request.
    pub(crate) fn enc(&self, kind: &str, name: &str) -> Result<String, Error> {
        if name.is_empty() {
            return Err(Error::bad_request(format!("empty {kind} name")));
        }
        let room = MAX_NAME - self.prefix.len() - kind.len() - 2;
        wrpc_broker_guest::ids::encode_token(name, SAFE, '_', room as u32)
    }

    /// The subject of `name` in namespace `kind` (`log`, `q`, `bp`, `dx`).
    pub(crate) fn subject(&self, kind: &str, name: &str) -> Result<String, Error> {
        Ok(format!("{}.{kind}.{}", self.prefix, self.enc(kind, name)?))
    }

    /// The stream of `name` in namespace `kind` (`log`, `q`).
    pub(crate) fn stream(&self, kind: &str, name: &str) -> Result<String, Error> {
        Ok(format!("{}_{kind}_{}", self.prefix, self.enc(kind, name)?))
    }
}

thread_local! {
    /// The configuration `init` set; none before.
    static CONFIG: RefCell<Option<Rc<Config>>> = const { RefCell::new(None) };
}

/// The configuration, or `closed` before `init`.
pub(crate) fn config() -> Result<Rc<Config>, Error> {
    CONFIG
        .with_borrow(Clone::clone)
        .ok_or_else(|| Error::closed("the adapter was not initialised"))
}

/// A driver error as a broker error.
pub(crate) fn nats_error(e: NatsError) -> Error {
    match e {
        NatsError::NoResponders(m) => Error::Unavailable(m),
        NatsError::Timeout(m) => Error::Timeout(m),
        NatsError::BadRequest(m) => Error::BadRequest(m),
        NatsError::Refused(m) => Error::Refused(m),
        NatsError::Unavailable(m) => Error::Unavailable(m),
    }
}

impl Guest for Component {
    fn describe() -> Info {
        Info {
            name: "nats".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            broker: "nats".to_string(),
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

/// Log a line at debug level (`broker.nats`).
pub(crate) fn debug(message: &str) {
    host::log(wrpc_broker_guest::Level::Debug, message);
}
