//! The Redis adapter: every capability of `wrpc:broker` mapped onto one Redis server (or
//! Valkey, KeyDB, Dragonfly) through the host's `wrpc:redis/client` driver.
//!
//! Everything lasting lives in Redis: log streams and their epochs, queue streams with their
//! consumer group, delayed retries, inbox lists and group registries. This component keeps only
//! what an instance may lose on a trap: its options, its generation, the SHA of its Lua scripts,
//! and its live readers, consumers and listeners (a consumer's unsettled deliveries stay in the
//! group's pending list and come back through `XAUTOCLAIM`).
//!
//! Keys (`P` = option `prefix`, hash-tagged so one prefix sits in one cluster slot): logs
//! `{P}:log:<topic>` and `{P}:loge:<topic>` (epoch), queues `{P}:q:<queue>` and `{P}:qd:<queue>`
//! (delayed retries), backplane channels `{P}:bp:<channel>`, direct `{P}:dx:<address>` (channel),
//! `{P}:dxg:<address>` (groups), `{P}:dxq:<enc(address)>:<group>` (group list) and
//! `{P}:dxp:<enc(address)>:<group>` (group presence channel). Names are binary-safe key
//! suffixes used verbatim; only the composite keys encode the address (`host.encode-token`).

wit_bindgen::generate!({
    inline: "package wrpc:redis-adapter; world adapter { include wrpc:broker/full-adapter@0.1.0; import wrpc:redis/client@0.1.0; }",
    path: ["../../wit/broker", "wit"],
    with: {
        "wrpc:broker/types@0.1.0": wrpc_broker_guest::types,
        "wrpc:broker/host@0.1.0": wrpc_broker_guest::host,
        "wrpc:redis/client@0.1.0": generate,
    },
});

mod backplane;
mod direct;
mod log;
mod queue;

use std::cell::RefCell;
use std::rc::Rc;

use exports::wrpc::broker::adapter::{Guest, Info, OptionInfo};
use wrpc::redis::client::{self, Frame, RedisError};
use wrpc_broker_guest::options::{self, Options, Spec};
use wrpc_broker_guest::{Error, Headers, host};

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
        doc: "Namespace of every key, as the hash tag `{prefix}`.",
    },
    Spec {
        name: "retention.maxEntries",
        default: "10000",
        doc: "Entries kept per log stream (XADD MAXLEN =, exact); older ones are trimmed.",
    },
    Spec {
        name: options::VISIBILITY_MS,
        default: "30000",
        doc: "Idle time after which any consumer reclaims a delivery (XAUTOCLAIM); held ones are refreshed every third of it.",
    },
];

/// What `init` configured; fixed for the life of the instance.
pub(crate) struct Config {
    /// The instance generation, stamped into every delivery tag.
    pub(crate) generation: u32,
    /// Namespace of every key.
    pub(crate) prefix: String,
    /// `MAXLEN =` of every log stream.
    pub(crate) max_entries: u32,
    /// How long a delivery may sit unrefreshed before any consumer reclaims it (XAUTOCLAIM
    /// min-idle); held deliveries are refreshed every third of it.
    pub(crate) visibility_ms: u32,
    /// The scripts, loaded on `init`.
    pub(crate) scripts: Scripts,
}

impl Config {
    /// Read the `init` options; an unknown option or a bad value is a bad request naming it.
    fn from_options(generation: u32, given: Vec<(String, String)>) -> Result<Self, Error> {
        let options = Options::new(OPTIONS, given)?;
        let prefix = options.text("prefix").unwrap_or_default();
        if prefix.is_empty() || prefix.contains(['{', '}']) {
            return Err(Error::bad_request(
                "option `prefix` must be non-empty and free of `{` and `}`",
            ));
        }
        Ok(Config {
            generation,
            prefix,
            max_entries: options.at_least("retention.maxEntries", 1)?,
            visibility_ms: options.at_least(options::VISIBILITY_MS, 30)?,
            scripts: Scripts::default(),
        })
    }

    /// The key `{P}:<kind>:<name>`; an empty name is a bad request.
    pub(crate) fn key(&self, kind: &str, name: &str) -> Result<Vec<u8>, Error> {
        if name.is_empty() {
            return Err(Error::bad_request(format!("empty {kind} name")));
        }
        Ok(format!("{{{}}}:{kind}:{name}", self.prefix).into_bytes())
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

// ------------------------------------------------------------------------------ replies

/// A reply as a tree (the driver sends it as pre-order frames; maps become flat arrays).
#[derive(Debug, Clone)]
pub(crate) enum Reply {
    Nil,
    Int(i64),
    Bytes(Vec<u8>),
    Error(String),
    Array(Vec<Reply>),
}

impl Reply {
    /// Build the tree from pre-order frames.
    fn from_frames(frames: Vec<Frame>) -> Reply {
        let mut iter = frames.into_iter();
        Self::take(&mut iter).unwrap_or(Reply::Nil)
    }

    fn take(iter: &mut impl Iterator<Item = Frame>) -> Option<Reply> {
        Some(match iter.next()? {
            Frame::Nil => Reply::Nil,
            Frame::Int(i) => Reply::Int(i),
            Frame::Bulk(b) => Reply::Bytes(b),
            Frame::Simple(s) => Reply::Bytes(s.into_bytes()),
            Frame::Error(e) => Reply::Error(e),
            Frame::Double(d) => Reply::Bytes(d.to_string().into_bytes()),
            Frame::Boolean(b) => Reply::Int(i64::from(b)),
            Frame::Array(n) => Reply::Array((0..n).filter_map(|_| Self::take(iter)).collect()),
            Frame::Pairs(n) => Reply::Array((0..2 * n).filter_map(|_| Self::take(iter)).collect()),
        })
    }

    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bytes(b) => Some(b),
            _ => None,
        }
    }

    pub(crate) fn text(&self) -> Option<&str> {
        self.bytes().and_then(|b| std::str::from_utf8(b).ok())
    }

    pub(crate) fn int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            Reply::Bytes(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        }
    }

    pub(crate) fn array(&self) -> &[Reply] {
        match self {
            Reply::Array(items) => items,
            _ => &[],
        }
    }

    pub(crate) fn into_array(self) -> Vec<Reply> {
        match self {
            Reply::Array(items) => items,
            _ => Vec::new(),
        }
    }

    /// The value after the field `name` in a flat field/value array.
    pub(crate) fn field(&self, name: &str) -> Option<&Reply> {
        self.array()
            .chunks(2)
            .find(|pair| pair[0].bytes() == Some(name.as_bytes()))
            .and_then(|pair| pair.get(1))
    }
}

/// A driver error as a broker error.
pub(crate) fn redis_error(e: RedisError) -> Error {
    match e {
        RedisError::ConnectionLost(m) => Error::unavailable(format!("redis connection lost: {m}")),
        RedisError::Server(m) => Error::internal(format!("redis: {m}")),
        RedisError::Refused(m) => Error::refused(m),
        RedisError::Invalid(m) => Error::internal(format!("redis call: {m}")),
    }
}

/// Whether a driver error is a lost connection.
pub(crate) fn is_connection_lost(e: &Error) -> bool {
    matches!(e, Error::Unavailable(_))
}

/// Arguments of a command, built from anything byte-like.
#[macro_export]
macro_rules! args {
    ($($arg:expr),* $(,)?) => { vec![$($crate::Arg::arg($arg)),*] };
}

/// Something that can be a command argument.
pub(crate) trait Arg {
    fn arg(self) -> Vec<u8>;
}
impl Arg for &str {
    fn arg(self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}
impl Arg for String {
    fn arg(self) -> Vec<u8> {
        self.into_bytes()
    }
}
impl Arg for &String {
    fn arg(self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}
impl Arg for Vec<u8> {
    fn arg(self) -> Vec<u8> {
        self
    }
}
impl Arg for &Vec<u8> {
    fn arg(self) -> Vec<u8> {
        self.clone()
    }
}
impl Arg for &[u8] {
    fn arg(self) -> Vec<u8> {
        self.to_vec()
    }
}
impl Arg for u32 {
    fn arg(self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}
impl Arg for u64 {
    fn arg(self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}
impl Arg for usize {
    fn arg(self) -> Vec<u8> {
        self.to_string().into_bytes()
    }
}

/// One command on the shared connection.
pub(crate) async fn cmd(args: Vec<Vec<u8>>) -> Result<Reply, Error> {
    client::command(args)
        .await
        .map(Reply::from_frames)
        .map_err(redis_error)
}

/// One blocking command on a dedicated connection.
pub(crate) async fn blocking(args: Vec<Vec<u8>>) -> Result<Reply, Error> {
    client::blocking(args)
        .await
        .map(Reply::from_frames)
        .map_err(redis_error)
}

/// Several commands in one round trip; one reply each (an error reply stays in place).
pub(crate) async fn pipeline(commands: Vec<Vec<Vec<u8>>>) -> Result<Vec<Reply>, Error> {
    client::pipeline(commands)
        .await
        .map(|replies| replies.into_iter().map(Reply::from_frames).collect())
        .map_err(redis_error)
}

/// A read-only call, tried again while the connection is down (up to about ten seconds): a
/// restarting server holds the caller up rather than failing it.
pub(crate) async fn patiently<T, F, Fut>(mut call: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut waited = 0;
    loop {
        match call().await {
            Err(e) if is_connection_lost(&e) && waited < 10_000 => {
                host::sleep(100).await;
                waited += 100;
            }
            answer => return answer,
        }
    }
}

// ------------------------------------------------------------------------------ scripts

/// The Lua scripts and their SHA1 (from `SCRIPT LOAD` on `init`); run with `EVALSHA`, falling
/// back to `EVAL` (which caches them again) when the server answers `NOSCRIPT` (a restart).
#[derive(Default)]
pub(crate) struct Scripts {
    shas: RefCell<Vec<(&'static str, String)>>,
}

/// Run the script `body` with `keys` and `argv`.
pub(crate) async fn eval(
    body: &'static str,
    keys: Vec<Vec<u8>>,
    argv: Vec<Vec<u8>>,
) -> Result<Reply, Error> {
    let config = config()?;
    let sha = config
        .scripts
        .shas
        .borrow()
        .iter()
        .find(|(b, _)| *b == body)
        .map(|(_, sha)| sha.clone());
    let tail = |mut call: Vec<Vec<u8>>| {
        call.push(keys.len().arg());
        call.extend(keys.iter().cloned());
        call.extend(argv.iter().cloned());
        call
    };
    let cached = sha.is_some();
    if let Some(sha) = sha {
        match client::command(tail(args!["EVALSHA", sha])).await {
            Ok(frames) => return Ok(Reply::from_frames(frames)),
            Err(RedisError::Server(m)) if m.starts_with("NOSCRIPT") => {}
            Err(e) => return Err(redis_error(e)),
        }
    }
    let reply = cmd(tail(args!["EVAL", body])).await?;
    if !cached {
        // Cache it for the next call (EVAL has just loaded it on the server).
        if let Ok(loaded) = cmd(args!["SCRIPT", "LOAD", body]).await
            && let Some(sha) = loaded.text()
        {
            config
                .scripts
                .shas
                .borrow_mut()
                .push((body, sha.to_string()));
        }
    }
    Ok(reply)
}

/// Load every script, so the first calls use `EVALSHA`.
async fn load_scripts(config: &Config) -> Result<(), Error> {
    for body in [
        log::APPEND,
        log::RANGE,
        queue::SETTLE,
        queue::ACK_ALL,
        queue::MOVE_DUE,
        queue::FORGET_CONSUMER,
        direct::SEND,
    ] {
        let sha = cmd(args!["SCRIPT", "LOAD", body]).await?;
        let sha = sha
            .text()
            .ok_or_else(|| Error::internal("SCRIPT LOAD answered no SHA"))?;
        config
            .scripts
            .shas
            .borrow_mut()
            .push((body, sha.to_string()));
    }
    Ok(())
}

// ------------------------------------------------------------------------------ encoding

/// Append `bytes` with a 4-byte big-endian length.
pub(crate) fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// Read a length-prefixed byte string at `*at`.
pub(crate) fn get<'a>(data: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
    let len = u32::from_be_bytes(data.get(*at..*at + 4)?.try_into().ok()?) as usize;
    let bytes = data.get(*at + 4..*at + 4 + len)?;
    *at += 4 + len;
    Some(bytes)
}

/// Headers as one field value: a count, then each name and value length-prefixed.
pub(crate) fn encode_headers(headers: &Headers) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for (name, value) in headers {
        put(&mut out, name.as_bytes());
        put(&mut out, value);
    }
    out
}

/// The headers [`encode_headers`] wrote; `None` when the bytes are not such a value.
pub(crate) fn decode_headers(data: &[u8], at: &mut usize) -> Option<Headers> {
    let count = u32::from_be_bytes(data.get(*at..*at + 4)?.try_into().ok()?);
    *at += 4;
    let mut headers = Vec::new();
    for _ in 0..count {
        let name = String::from_utf8(get(data, at)?.to_vec()).ok()?;
        headers.push((name, get(data, at)?.to_vec()));
    }
    Some(headers)
}

/// Decode a whole headers field (empty or absent: no headers).
pub(crate) fn headers_field(data: Option<&[u8]>) -> Headers {
    match data {
        Some(data) if !data.is_empty() => decode_headers(data, &mut 0).unwrap_or_default(),
        _ => Vec::new(),
    }
}

// ------------------------------------------------------------------------------ lifecycle

impl Guest for Component {
    fn describe() -> Info {
        Info {
            name: "redis".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            broker: "redis".to_string(),
            options: wrpc_broker_guest::option_infos!(OPTIONS),
        }
    }

    async fn init(generation: u32, options: Vec<(String, String)>) -> Result<(), Error> {
        let config = Config::from_options(generation, options)?;
        let info = cmd(args!["INFO", "server"]).await?;
        let info = String::from_utf8_lossy(info.bytes().unwrap_or_default()).into_owned();
        let version = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("0");
        let major: u32 = version
            .split('.')
            .next()
            .and_then(|m| m.trim().parse().ok())
            .unwrap_or(0);
        if major < 7 {
            return Err(Error::Unsupported(format!(
                "redis {version}: the adapter needs 7.0 or later (`<ms>-*` ids, XAUTOCLAIM deleted ids)"
            )));
        }
        load_scripts(&config).await?;
        CONFIG.set(Some(Rc::new(config)));
        Ok(())
    }

    async fn close() {
        wrpc_broker_guest::queue::stop_all().await;
        direct::stop_all().await;
        log::stop_all();
    }
}
