//! The running gateway: the brokers it serves (capabilities with the same broker config share
//! one host instance), the config in force, and how a new config is applied — a new adapter
//! file is swapped in, a new broker URL is migrated to, both losing nothing; a config that
//! cannot be applied is refused and the running one stays.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};

use sha2::{Digest, Sha256};
use wrpc_broker::migrate::MigrateOptions;
use wrpc_broker::{Broker, BrokerBuilder};

use crate::config::{BrokerConfig, Config};
use crate::error::ApiError;
use crate::metrics::Metrics;

/// One host instance and the capabilities it serves.
struct Group {
    capabilities: Vec<&'static str>,
    broker: Broker,
    config: BrokerConfig,
    /// The SHA-256 of the component file running (none for an embedded adapter).
    component_hash: Option<String>,
}

/// What a reload did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Brokers whose adapter was swapped, by their capabilities.
    pub swapped: Vec<String>,
    /// Brokers migrated, by their capabilities.
    pub migrated: Vec<String>,
}

/// The gateway's state, shared by every request.
pub struct Gateway {
    config: RwLock<Config>,
    groups: tokio::sync::Mutex<Vec<Group>>,
    /// Each capability's broker, for requests (a swap or migration keeps the handle).
    brokers: RwLock<BTreeMap<&'static str, Broker>>,
    /// The metrics.
    pub metrics: Metrics,
    /// Queues produced to or consumed here, for the depth gauge.
    pub queues_seen: Mutex<BTreeSet<String>>,
    /// Consumers and listeners opened over WebSocket, for `/readyz`.
    pub health: crate::health::Health,
    /// Fires when the server stops: sockets close and event streams end.
    pub stopping: tokio_util::sync::CancellationToken,
}

fn hash_file(config: &BrokerConfig) -> anyhow::Result<Option<String>> {
    let Some(path) = &config.component else {
        return Ok(None);
    };
    let bytes =
        std::fs::read(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    Ok(Some(hex::encode(Sha256::digest(&bytes))))
}

fn builder(config: &BrokerConfig) -> anyhow::Result<BrokerBuilder> {
    let mut builder = Broker::builder().url(&config.url)?;
    if let Some(component) = &config.component {
        builder = builder.component_file(component);
    }
    Ok(builder.options(config.options.clone()))
}

/// Capabilities grouped by identical broker config, in capability order.
fn grouping(config: &Config) -> Vec<(Vec<&'static str>, BrokerConfig)> {
    let mut groups: Vec<(Vec<&'static str>, BrokerConfig)> = Vec::new();
    for (name, broker) in &config.brokers {
        match groups.iter_mut().find(|(_, c)| c == broker) {
            Some((names, _)) => names.push(name),
            None => groups.push((vec![name], broker.clone())),
        }
    }
    groups
}

impl Gateway {
    /// Open every broker `config` names.
    pub async fn open(config: Config) -> anyhow::Result<Gateway> {
        let mut groups = Vec::new();
        let mut brokers = BTreeMap::new();
        for (capabilities, broker_config) in grouping(&config) {
            let component_hash = hash_file(&broker_config)?;
            let broker = builder(&broker_config)?.open().await.map_err(|e| {
                anyhow::anyhow!(
                    "opening {} for {}: {e}",
                    broker_config.url,
                    capabilities.join(", ")
                )
            })?;
            tracing::info!(
                url = %broker_config.url,
                adapter = %broker.info().name,
                capabilities = %capabilities.join(", "),
                "serving"
            );
            for c in &capabilities {
                brokers.insert(*c, broker.clone());
            }
            groups.push(Group {
                capabilities,
                broker,
                config: broker_config,
                component_hash,
            });
        }
        Ok(Gateway {
            config: RwLock::new(config),
            groups: tokio::sync::Mutex::new(groups),
            brokers: RwLock::new(brokers),
            metrics: Metrics::new(),
            queues_seen: Mutex::default(),
            health: Default::default(),
            stopping: Default::default(),
        })
    }

    /// The broker serving `capability`.
    pub fn broker(&self, capability: &str) -> Result<Broker, ApiError> {
        self.brokers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(capability)
            .cloned()
            .ok_or_else(|| ApiError::new(404, format!("no broker serves `{capability}`")))
    }

    /// Note that `queue` is served here (its depth goes into the metrics).
    pub fn seen_queue(&self, queue: &str) {
        let mut seen = self.queues_seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() < 10_000 {
            seen.insert(queue.to_string());
        }
    }

    /// A copy of the config in force.
    pub fn config(&self) -> Config {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Apply `new`: tokens and limits at once; per broker, a swap when its adapter file or
    /// options changed, a migration when its URL did. Refused (nothing changed) when the listen
    /// address changes or capabilities that share a broker would no longer share one.
    pub async fn apply(&self, new: Config) -> anyhow::Result<Applied> {
        let mut groups = self.groups.lock().await;
        let current = self.config();
        if new.listen != current.listen {
            anyhow::bail!(
                "listen changed from {} to {}: that needs a restart",
                current.listen,
                new.listen
            );
        }
        let wanted = grouping(&new);
        let same_shape = wanted.len() == groups.len()
            && wanted
                .iter()
                .zip(groups.iter())
                .all(|((names, _), g)| *names == g.capabilities);
        if !same_shape {
            anyhow::bail!(
                "the capabilities would be split over other brokers ({}): that needs a restart",
                wanted
                    .iter()
                    .map(|(n, c)| format!("{} on {}", n.join("+"), c.url))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        // Check everything before changing anything.
        let mut plans = Vec::new();
        for ((_, wanted), group) in wanted.iter().zip(groups.iter()) {
            let hash = hash_file(wanted)?;
            let plan = if wanted.url != group.config.url {
                Some(Change::Migrate(builder(wanted)?))
            } else if wanted.component != group.config.component
                || wanted.options != group.config.options
                || hash != group.component_hash
            {
                Some(Change::Swap)
            } else {
                None
            };
            plans.push((plan, hash));
        }
        let mut applied = Applied::default();
        for ((plan, hash), ((_, wanted), group)) in
            plans.into_iter().zip(wanted.iter().zip(groups.iter_mut()))
        {
            let names = group.capabilities.join("+");
            match plan {
                None => continue,
                Some(Change::Swap) => {
                    swap(&group.broker, wanted).await?;
                    self.metrics.swaps.inc();
                    applied.swapped.push(names);
                }
                Some(Change::Migrate(to)) => {
                    let report = group.broker.migrate(to, MigrateOptions::default()).await?;
                    tracing::info!(from = %report.from, to = %report.to, complete = report.complete(), "migrated");
                    self.metrics.migrations.inc();
                    applied.migrated.push(names);
                }
            }
            group.config = wanted.clone();
            group.component_hash = hash;
        }
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = new;
        Ok(applied)
    }

    /// Stop serving: close every broker (consumers stop first, their unsettled work released).
    pub async fn close(&self) {
        self.health.stop_all().await;
        for group in self.groups.lock().await.iter() {
            group.broker.close();
        }
    }
}

enum Change {
    Swap,
    Migrate(BrokerBuilder),
}

async fn swap(broker: &Broker, to: &BrokerConfig) -> anyhow::Result<()> {
    let report = match &to.component {
        Some(path) => broker.swap(path, to.options.clone()).await?,
        None => {
            let wasm = wrpc_broker::drivers::embedded_adapter(&to.url)
                .ok_or_else(|| anyhow::anyhow!("no adapter is embedded for {}", to.url))?;
            broker
                .swap_bytes("embedded adapter", wasm, to.options.clone())
                .await?
        }
    };
    tracing::info!(generation = report.generation, total = ?report.total, "swapped the adapter");
    Ok(())
}

/// Keep `gateway` serving `Arc` clones.
pub type Shared = Arc<Gateway>;
