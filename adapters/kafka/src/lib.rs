//! The Kafka adapter: `wrpc:broker` log, queue and backplane mapped onto the host's
//! `wrpc:kafka/client` driver. It does not export `direct` (wit/MAPPING.md says why: no
//! per-address routing, no "nobody listens" signal, no per-message expiry, and every listener
//! join or leave is a group rebalance), so the host sees that capability absent.
//!
//! Logs are topics `P.log.<enc>` ([`log`]) whose resume token is the vector of partition
//! offsets under the topic id; work queues are topics `P.q.<enc>` consumed by the group
//! `P.q.<enc>`, with delay-bucket topics `P.q.<enc>.retry.<ms>` ([`queue`]); the backplane is
//! the topic `P.bp` keyed by channel ([`backplane`]). Nothing lasting lives in this component:
//! topics, offsets and committed positions are in the cluster, so a trap loses only caches.
//!
//! Names: `P` = option `prefix`; `enc` = `host.encode-token` with safe `A-Za-z0-9-` and escape
//! `_` (Kafka topics allow `.` too, kept for our separators).

wit_bindgen::generate!({
    inline: "package wrpc:kafka-adapter; world adapter { include wrpc:broker/backplane-adapter@0.1.0; include wrpc:broker/log-adapter@0.1.0; include wrpc:broker/queue-adapter@0.1.0; import wrpc:kafka/client@0.1.0; }",
    path: ["../../wit/broker", "wit"],
    with: {
        "wrpc:broker/types@0.1.0": wrpc_broker_guest::types,
        "wrpc:broker/host@0.1.0": wrpc_broker_guest::host,
        "wrpc:kafka/client@0.1.0": generate,
    },
});

mod backplane;
mod inbox;
mod log;
mod queue;
mod topics;

use std::cell::RefCell;
use std::rc::Rc;

use exports::wrpc::broker::adapter::{Guest, Info, OptionInfo};
use wrpc::kafka::client::KafkaError;
use wrpc_broker_guest::options::{Options, Spec};
use wrpc_broker_guest::{Error, host};

/// The component; it implements every exported interface.
struct Component;
export!(Component);

/// The default retry buckets, in milliseconds.
const DEFAULT_BUCKETS: &str = "100,500,1000,5000,30000,60000,300000,3600000";

/// The options this adapter takes (`describe` lists them, `init` reads them).
const OPTIONS: &[Spec] = &[
    Spec {
        name: "prefix",
        default: "wrpc",
        doc: "Namespace of every topic and group ([A-Za-z0-9-], at most 32).",
    },
    Spec {
        name: "partitions",
        default: "1",
        doc: "Partitions of the log topics this adapter creates (ids are vectors of partition offsets).",
    },
    Spec {
        name: "queue.partitions",
        default: "4",
        doc: "Partitions of the queue topics this adapter creates (at most that many consumers of a queue share its work).",
    },
    Spec {
        name: "replication",
        default: "1",
        doc: "Replication factor of the topics this adapter creates.",
    },
    Spec {
        name: "retention.ms",
        default: "",
        doc: "retention.ms of the log topics this adapter creates (whole segments go; the broker's default when none).",
    },
    Spec {
        name: "retention.bytes",
        default: "",
        doc: "retention.bytes per partition of the log topics this adapter creates (whole segments go).",
    },
    Spec {
        name: "retry.buckets",
        default: DEFAULT_BUCKETS,
        doc: "Delays (ms) of the retry topics; a retry waits the smallest bucket at least its delay (the largest at most).",
    },
];
/// The characters a name keeps in a topic name.
const SAFE: &str = "A-Za-z0-9-";
/// The longest topic name.
const MAX_TOPIC: usize = 249;
/// Room left in a topic name for the kind and the `.retry.<ms>` suffix.
const SUFFIX_ROOM: usize = 24;

/// What `init` configured; fixed for the life of the instance.
pub(crate) struct Config {
    /// The instance generation, stamped into every delivery tag.
    pub(crate) generation: u32,
    /// Namespace of every topic and group.
    pub(crate) prefix: String,
    /// Partitions of new log topics.
    pub(crate) partitions: u32,
    /// Partitions of new queue topics.
    pub(crate) queue_partitions: u32,
    /// Replication factor of new topics.
    pub(crate) replication: u32,
    /// Topic configs of new log topics (retention).
    pub(crate) log_configs: Vec<(String, String)>,
    /// The retry buckets, ascending, in milliseconds.
    pub(crate) buckets: Vec<u32>,
    /// The queue partition this instance's produces start at (picked at `init`).
    pub(crate) home_partition: u32,
}

/// A positive number option, if given.
fn positive(options: &Options, name: &str) -> Result<Option<u64>, Error> {
    match options.text(name) {
        None => Ok(None),
        Some(_) => {
            let n: u64 = options.get(name)?;
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
        let mut log_configs = vec![("cleanup.policy".to_string(), "delete".to_string())];
        for name in ["retention.ms", "retention.bytes"] {
            if let Some(n) = positive(&options, name)? {
                log_configs.push((name.to_string(), n.to_string()));
            }
        }
        let queue_partitions = options.at_least("queue.partitions", 1)?;
        let home_partition = host::generate_id()
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
            % queue_partitions;
        Ok(Config {
            generation,
            prefix,
            partitions: options.at_least("partitions", 1)?,
            queue_partitions,
            home_partition,
            replication: options.at_least("replication", 1)?,
            log_configs,
            buckets,
        })
    }

    /// The topic of `name` in namespace `kind` (`log`, `q`); an empty name is a bad request.
    pub(crate) fn topic(&self, kind: &str, name: &str) -> Result<String, Error> {
        if name.is_empty() {
            return Err(Error::bad_request(format!("empty {kind} name")));
        }
        let room = MAX_TOPIC - self.prefix.len() - SUFFIX_ROOM;
        let enc = wrpc_broker_guest::ids::encode_token(name, SAFE, '_', room as u32)?;
        Ok(format!("{}.{kind}.{enc}", self.prefix))
    }

    /// The backplane topic.
    pub(crate) fn backplane(&self) -> String {
        format!("{}.bp", self.prefix)
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
pub(crate) fn kafka_error(e: KafkaError) -> Error {
    match e {
        KafkaError::Unavailable(m) => Error::Unavailable(m),
        KafkaError::UnknownTopic(m) => Error::Unavailable(format!("unknown topic: {m}")),
        KafkaError::OutOfRange(m) => Error::Gone(m),
        KafkaError::BadRequest(m) => Error::BadRequest(m),
        KafkaError::Refused(m) => Error::Refused(m),
        KafkaError::Stale(m) => Error::Stale(m),
        KafkaError::Other(m) => Error::Internal(m),
    }
}

impl Guest for Component {
    fn describe() -> Info {
        Info {
            name: "kafka".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            broker: "kafka".to_string(),
            options: wrpc_broker_guest::option_infos!(OPTIONS),
        }
    }

    async fn init(generation: u32, options: Vec<(String, String)>) -> Result<(), Error> {
        let config = Config::from_options(generation, options)?;
        topics::ensure(&config, &[(config.backplane(), 1)], &[]).await?;
        CONFIG.set(Some(Rc::new(config)));
        Ok(())
    }

    async fn close() {
        wrpc_broker_guest::queue::stop_all().await;
    }
}

/// Log a line at debug level (`broker.kafka`).
pub(crate) fn debug(message: &str) {
    host::log(wrpc_broker_guest::Level::Debug, message);
}
