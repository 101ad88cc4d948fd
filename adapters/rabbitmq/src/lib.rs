//! The RabbitMQ adapter (AMQP 0-9-1, designed for RabbitMQ 3.10): every capability of
//! `wrpc:broker` mapped onto the host's `wrpc:amqp/client` driver.
//!
//! The backplane rides the direct exchange `P.bp` ([`backplane`]), direct inboxes the direct
//! exchange `P.dx` ([`direct`]), both with routing keys `enc(name)` so no name is ever a
//! pattern; logs are stream queues `P.log.<enc>` ([`log`]); work queues are quorum queues
//! `P.q.<enc>` with TTL retry buckets `P.q.<enc>.retry.<ms>` ([`queue`]). Nothing lasting lives
//! in this component: queues, streams and log epochs are in the broker, so every instance (and
//! every host) agrees and a trap loses nothing.
//!
//! Names: `P` = option `prefix`; `enc` = `host.encode-token` with safe `A-Za-z0-9-` and escape
//! `_` (no `.`, so the `.retry.<b>` suffixes stay unambiguous). Headers: an AMQP field table
//! keeps one value per name in name order, so the broker's headers (bytes, repeats, order)
//! travel in one header `x-wrpc-headers`, an array of byte arrays `[name, value, name, value…]`
//! ([`codec`]); the adapter's own fields are headers of their own.

wit_bindgen::generate!({
    inline: "package wrpc:rabbitmq-adapter; world adapter { include wrpc:broker/full-adapter@0.1.0; import wrpc:amqp/client@0.1.0; }",
    path: ["../../wit/broker", "wit"],
    with: {
        "wrpc:broker/types@0.1.0": wrpc_broker_guest::types,
        "wrpc:broker/host@0.1.0": wrpc_broker_guest::host,
        "wrpc:amqp/client@0.1.0": generate,
    },
});

mod backplane;
mod channel;
mod codec;
mod direct;
mod inbox;
mod log;
mod queue;

use std::cell::RefCell;
use std::rc::Rc;

use exports::wrpc::broker::adapter::{Guest, Info, OptionInfo};
use wrpc::amqp::client::AmqpError;
use wrpc_broker_guest::options::{Options, Spec};
use wrpc_broker_guest::{Error, host};

/// The component; it implements every exported interface.
struct Component;
export!(Component);

/// The default retry buckets, in milliseconds.
const DEFAULT_BUCKETS: &str = "100,250,500,1000,2000,5000,10000,30000,60000,300000,3600000";

/// The options this adapter takes (`describe` lists them, `init` reads them).
const OPTIONS: &[Spec] = &[
    Spec {
        name: "prefix",
        default: "wrpc",
        doc: "Namespace of every exchange and queue ([A-Za-z0-9-], at most 32).",
    },
    Spec {
        name: "retention.maxBytes",
        default: "",
        doc: "x-max-length-bytes of the log streams this adapter creates (whole segments go; none by default).",
    },
    Spec {
        name: "retention.maxAge",
        default: "",
        doc: "x-max-age of the log streams this adapter creates, e.g. 7D, 12h (whole segments go; none by default).",
    },
    Spec {
        name: "retention.segmentBytes",
        default: "",
        doc: "x-stream-max-segment-size-bytes of the log streams (the unit retention removes; 500 MB by default).",
    },
    Spec {
        name: "retry.buckets",
        default: DEFAULT_BUCKETS,
        doc: "Delays (ms) of the TTL retry queues; a retry waits the smallest bucket at least its delay (the largest at most).",
    },
];
/// The characters a name keeps in a routing key or queue name.
const SAFE: &str = "A-Za-z0-9-";
/// The longest routing key (an AMQP short string).
const MAX_KEY: u32 = 255;
/// Room left in a queue name for the kind and the `.retry.<ms>` suffix.
const SUFFIX_ROOM: usize = 40;

/// What `init` configured; fixed for the life of the instance.
pub(crate) struct Config {
    /// The instance generation, stamped into every delivery tag.
    pub(crate) generation: u32,
    /// Namespace of every exchange and queue.
    pub(crate) prefix: String,
    /// Stream retention arguments (`x-max-length-bytes`, `x-max-age`, segment size).
    pub(crate) max_bytes: Option<i64>,
    pub(crate) max_age: Option<String>,
    pub(crate) segment_bytes: Option<i64>,
    /// The retry buckets, ascending, in milliseconds.
    pub(crate) buckets: Vec<u32>,
}

/// A positive byte count option.
fn bytes_option(options: &Options, name: &str) -> Result<Option<i64>, Error> {
    match options.text(name) {
        None => Ok(None),
        Some(_) => {
            let n: i64 = options.get(name)?;
            if n < 1 {
                return Err(Error::bad_request(format!(
                    "option `{name}` must be positive"
                )));
            }
            Ok(Some(n))
        }
    }
}

impl Config {
    /// Read the `init` options; an unknown option or a bad value is a bad request naming it.
    fn from_options(generation: u32, given: Vec<(String, String)>) -> Result<Self, Error> {
        let options = Options::new(OPTIONS, given)?;
        let prefix = options.text("prefix").unwrap_or_default();
        if prefix.is_empty()
            || prefix.len() > 32
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(Error::bad_request(
                "option `prefix` must be 1 to 32 of [A-Za-z0-9-]",
            ));
        }
        let max_age = options.text("retention.maxAge");
        if let Some(age) = &max_age {
            let (n, unit) = age.split_at(age.len().saturating_sub(1));
            if n.parse::<u32>().is_err() || !["Y", "M", "D", "h", "m", "s"].contains(&unit) {
                return Err(Error::bad_request(format!(
                    "option `retention.maxAge`: `{age}` is not <n><Y|M|D|h|m|s>"
                )));
            }
        }
        let text = options.text("retry.buckets").unwrap_or_default();
        let mut buckets = Vec::new();
        for part in text.split(',') {
            let ms: u32 = part.trim().parse().map_err(|_| {
                Error::bad_request(format!("option `retry.buckets`: `{part}` is not a number"))
            })?;
            if ms == 0 {
                return Err(Error::bad_request(
                    "option `retry.buckets`: a bucket of 0 ms",
                ));
            }
            buckets.push(ms);
        }
        buckets.sort_unstable();
        buckets.dedup();
        Ok(Config {
            generation,
            prefix,
            max_bytes: bytes_option(&options, "retention.maxBytes")?,
            max_age,
            segment_bytes: bytes_option(&options, "retention.segmentBytes")?,
            buckets,
        })
    }

    /// `name` encoded for a queue name of namespace `kind`; empty is a bad request.
    pub(crate) fn enc(&self, kind: &str, name: &str) -> Result<String, Error> {
        if name.is_empty() {
            return Err(Error::bad_request(format!("empty {kind} name")));
        }
        let room = usize::try_from(MAX_KEY).unwrap_or(255) - self.prefix.len() - SUFFIX_ROOM;
        wrpc_broker_guest::ids::encode_token(name, SAFE, '_', room as u32)
    }

    /// `name` encoded as a routing key.
    pub(crate) fn key(&self, name: &str) -> Result<String, Error> {
        wrpc_broker_guest::ids::encode_token(name, SAFE, '_', MAX_KEY)
    }

    /// The queue (or exchange) of `name` in namespace `kind` (`log`, `q`).
    pub(crate) fn queue(&self, kind: &str, name: &str) -> Result<String, Error> {
        Ok(format!("{}.{kind}.{}", self.prefix, self.enc(kind, name)?))
    }

    /// The exchange of namespace `kind` (`bp`, `dx`).
    pub(crate) fn exchange(&self, kind: &str) -> String {
        format!("{}.{kind}", self.prefix)
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

/// Whether `e` passes by itself: the broker is unreachable, the connection was lost (code 0,
/// 320 forced), or a restarted node has not yet brought a durable queue back (404 "home node
/// … is down or inaccessible", 406 "does not have a replica on the local node").
pub(crate) fn transient(e: &AmqpError) -> bool {
    match e {
        AmqpError::Unavailable(_) | AmqpError::Timeout(_) => true,
        AmqpError::Closed(why) => {
            matches!(why.code, 0 | 320 | 541)
                || why.text.contains("down or inaccessible")
                || why.text.contains("does not have a replica")
        }
        _ => false,
    }
}

/// A driver error as a broker error.
pub(crate) fn amqp_error(e: AmqpError) -> Error {
    match e {
        AmqpError::Closed(why) if why.code == 404 => Error::Unavailable(format!(
            "not found (the broker closed the channel: {})",
            why.text
        )),
        AmqpError::Closed(why) => {
            Error::Unavailable(format!("the channel closed ({} {})", why.code, why.text))
        }
        AmqpError::Stale(m) => Error::Stale(m),
        AmqpError::BadRequest(m) => Error::BadRequest(m),
        AmqpError::Refused(m) => Error::Refused(m),
        AmqpError::Unavailable(m) => Error::Unavailable(m),
        AmqpError::Timeout(m) => Error::Timeout(m),
    }
}

impl Guest for Component {
    fn describe() -> Info {
        Info {
            name: "rabbitmq".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            broker: "rabbitmq".to_string(),
            options: wrpc_broker_guest::option_infos!(OPTIONS),
        }
    }

    async fn init(generation: u32, options: Vec<(String, String)>) -> Result<(), Error> {
        let config = Config::from_options(generation, options)?;
        for kind in ["bp", "dx"] {
            let exchange = config.exchange(kind);
            channel::shared()
                .call(|ch| {
                    wrpc::amqp::client::exchange_declare(
                        ch,
                        exchange.clone(),
                        "direct".into(),
                        true,
                        false,
                    )
                })
                .await?;
        }
        CONFIG.set(Some(Rc::new(config)));
        Ok(())
    }

    async fn close() {
        wrpc_broker_guest::queue::stop_all().await;
        wrpc_broker_guest::relay::stop_all_listeners().await;
    }
}

/// Log a line at debug level (`broker.rabbitmq`).
pub(crate) fn debug(message: &str) {
    host::log(wrpc_broker_guest::Level::Debug, message);
}
