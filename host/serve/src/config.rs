//! The configuration file of `wrpc-broker serve` (TOML), read and checked as a whole: a config
//! that does not parse or names something invalid is refused with the reason, and a running
//! server keeps the one it has.
//!
//! ```toml
//! listen = "127.0.0.1:8080"
//! max_body_bytes = 1048576
//! cors_origins = ["https://app.example"]  # browser pages of these origins may call the API
//!
//! [broker]                       # every capability, unless it has a table of its own
//! url = "memory://"
//! # component = "adapter.wasm"  # a component file instead of the adapter embedded for `url`
//! # options = { prefix = "app" }
//!
//! [log]                          # this capability on another broker
//! url = "redis://127.0.0.1:6379"
//!
//! [[token]]
//! token = "s3cret"               # or token_env = "NAME"
//! allow = ["log:read:orders.*", "queue:*:*"]
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::auth::{Grant, Tokens};

/// The four capabilities, as the config and the API name them.
pub const CAPABILITIES: [&str; 4] = ["log", "queue", "direct", "backplane"];

/// A checked configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the HTTP API listens.
    pub listen: SocketAddr,
    /// The largest request body accepted (413 past it).
    pub max_body_bytes: usize,
    /// The broker of each capability, by name (`log`, `queue`, `direct`, `backplane`).
    pub brokers: BTreeMap<&'static str, BrokerConfig>,
    /// The access tokens (none: the API is open, which `serve` warns about).
    pub tokens: Tokens,
    /// Browser origins allowed to call the API (CORS): exact origins, or `*` for any.
    pub cors_origins: Vec<String>,
}

/// Where one capability's broker is and which adapter serves it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// The broker URL (`memory://name`, `redis://…`, `nats://…`).
    pub url: String,
    /// A component file instead of the adapter embedded for the URL.
    pub component: Option<PathBuf>,
    /// The adapter's `init` options.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<String>,
    max_body_bytes: Option<usize>,
    broker: Option<BrokerConfig>,
    log: Option<BrokerConfig>,
    queue: Option<BrokerConfig>,
    direct: Option<BrokerConfig>,
    backplane: Option<BrokerConfig>,
    #[serde(default)]
    token: Vec<TokenEntry>,
    #[serde(default)]
    cors_origins: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    token: Option<String>,
    token_env: Option<String>,
    allow: Vec<String>,
}

/// The default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// The default body limit: 1 MiB.
pub const DEFAULT_MAX_BODY: usize = 1 << 20;

impl Config {
    /// Read and check the config at `path` (relative component paths are taken from the
    /// config's folder).
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Config::parse(&text, base).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Parse and check config text; relative component paths are taken from `base`.
    pub fn parse(text: &str, base: &Path) -> anyhow::Result<Config> {
        let file: File = toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.message()))?;
        let listen = file.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        let listen: SocketAddr = listen
            .parse()
            .map_err(|e| anyhow::anyhow!("listen `{listen}`: {e}"))?;
        let mut brokers = BTreeMap::new();
        let own = [&file.log, &file.queue, &file.direct, &file.backplane];
        for (name, own) in CAPABILITIES.into_iter().zip(own) {
            let Some(broker) = own.as_ref().or(file.broker.as_ref()) else {
                anyhow::bail!("no broker for `{name}`: give a [broker] table or a [{name}] table");
            };
            let mut broker = broker.clone();
            if broker.url.trim().is_empty() {
                anyhow::bail!("[{name}] url is empty");
            }
            if let Some(component) = &broker.component
                && component.is_relative()
            {
                broker.component = Some(base.join(component));
            }
            brokers.insert(name, broker);
        }
        let mut grants = Vec::new();
        for (n, entry) in file.token.iter().enumerate() {
            let secret = match (&entry.token, &entry.token_env) {
                (Some(token), None) => token.clone(),
                (None, Some(var)) => std::env::var(var)
                    .map_err(|_| anyhow::anyhow!("token {}: variable `{var}` is not set", n + 1))?,
                _ => anyhow::bail!(
                    "token {}: give exactly one of `token` and `token_env`",
                    n + 1
                ),
            };
            if secret.len() < 8 {
                anyhow::bail!("token {}: shorter than 8 characters", n + 1);
            }
            let allow = entry
                .allow
                .iter()
                .map(|a| Grant::parse(a).map_err(|e| anyhow::anyhow!("token {}: {e}", n + 1)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            grants.push((secret, allow));
        }
        Ok(Config {
            listen,
            max_body_bytes: file.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY),
            brokers,
            tokens: Tokens::new(grants),
            cors_origins: file.cors_origins,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_broker_serves_every_capability_unless_one_has_its_own() {
        let config = Config::parse(
            "[broker]\nurl = \"memory://a\"\n[log]\nurl = \"memory://b\"\n",
            Path::new("/etc"),
        )
        .unwrap();
        assert_eq!(config.brokers["log"].url, "memory://b");
        assert_eq!(config.brokers["queue"].url, "memory://a");
        assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
    }

    #[test]
    fn bad_configs_are_refused_with_the_reason() {
        for (text, reason) in [
            (
                "listen = \"nowhere\"\n[broker]\nurl = \"memory://\"",
                "listen `nowhere`",
            ),
            ("[log]\nurl = \"memory://\"", "no broker for `queue`"),
            (
                "[broker]\nurl = \"memory://\"\nsurprise = 1",
                "unknown field `surprise`",
            ),
            (
                "[broker]\nurl = \"memory://\"\n[[token]]\ntoken = \"short\"\nallow = []",
                "shorter than 8",
            ),
            (
                "[broker]\nurl = \"memory://\"\n[[token]]\ntoken = \"long enough\"\nallow = [\"logs:read:x\"]",
                "capability `logs`",
            ),
        ] {
            let error = Config::parse(text, Path::new(".")).unwrap_err().to_string();
            assert!(error.contains(reason), "{text:?}: {error}");
        }
    }

    #[test]
    fn a_relative_component_is_taken_from_the_config_folder() {
        let config = Config::parse(
            "[broker]\nurl = \"memory://\"\ncomponent = \"a.wasm\"",
            Path::new("/srv/app"),
        )
        .unwrap();
        assert_eq!(
            config.brokers["log"].component.as_deref(),
            Some(Path::new("/srv/app/a.wasm"))
        );
    }
}
