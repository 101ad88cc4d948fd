//! `wrpc-broker serve`: a long-running host that any language can use over HTTP, configured by
//! a TOML file ([`config`]). It serves the four capabilities ([`api`], [`ws`]), checks access
//! tokens ([`auth`]), exposes health and Prometheus metrics, and applies an edited config (or
//! one re-read on SIGHUP) to the running host: a new adapter file is swapped in, a new broker
//! URL migrated to, losing nothing; an invalid config is refused and the running one stays.
//! SIGTERM (or SIGINT) stops it cleanly: sockets close, consumers stop and hand their unsettled
//! deliveries back to the broker.

#![deny(missing_docs)]

pub mod api;
pub mod auth;
pub mod config;
pub mod error;
pub mod gateway;
pub mod health;
pub mod metrics;
pub mod openapi;
pub mod ws;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use config::Config;
use gateway::{Gateway, Shared};

/// A running gateway: its address, its state, and the task serving HTTP.
pub struct Running {
    /// The address it listens on (the actual port when the config asked for port 0).
    pub addr: SocketAddr,
    /// Its state.
    pub gateway: Shared,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    /// Open the brokers of `config` and start serving.
    pub async fn start(config: Config) -> anyhow::Result<Running> {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| anyhow::anyhow!("listening on {}: {e}", config.listen))?;
        let addr = listener.local_addr()?;
        if config.tokens.open() {
            tracing::warn!(%addr, "no access tokens configured: the API is open to anyone who can reach it");
        }
        let max_body = config.max_body_bytes;
        let gateway = Arc::new(Gateway::open(config).await?);
        let app = api::router(gateway.clone(), max_body);
        let stopping = gateway.stopping.clone();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stopping.cancelled_owned())
                .await
        });
        tracing::info!(%addr, "wrpc-broker serve: listening");
        Ok(Running {
            addr,
            gateway,
            server,
        })
    }

    /// Stop: end streams and sockets, finish the requests in flight, stop consumers (their
    /// unsettled deliveries released), close the brokers.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.gateway.stopping.cancel();
        match tokio::time::timeout(Duration::from_secs(30), self.server).await {
            Ok(served) => served??,
            Err(_) => tracing::warn!("requests still running 30 s after the stop; closing"),
        }
        self.gateway.close().await;
        Ok(())
    }
}

/// The modification time and length of `path`, to notice an edit.
fn stamp(path: &std::path::Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Re-read the config at `path` and apply it, logging what happened.
async fn reload(running: &Running, path: &std::path::Path) {
    let applied = match Config::load(path) {
        Ok(config) => running.gateway.apply(config).await,
        Err(e) => Err(e),
    };
    match applied {
        Ok(applied) => tracing::info!(
            swapped = ?applied.swapped,
            migrated = ?applied.migrated,
            "config applied"
        ),
        Err(e) => {
            running.gateway.metrics.reloads_refused.inc();
            tracing::error!("config refused, the running one stays: {e:#}");
        }
    }
}

/// Serve the config at `path` until SIGTERM or SIGINT; re-apply it on SIGHUP and whenever the
/// file changes (looked at every `poll`).
pub async fn serve(path: PathBuf, poll: Duration) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let config = Config::load(&path)?;
    let running = Running::start(config).await?;
    let mut hangup = signal(SignalKind::hangup())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut seen = stamp(&path);
    let mut tick = tokio::time::interval(poll);
    loop {
        tokio::select! {
            _ = hangup.recv() => {
                tracing::info!("SIGHUP: reloading {}", path.display());
                seen = stamp(&path);
                reload(&running, &path).await;
            }
            _ = tick.tick() => {
                let now = stamp(&path);
                if now.is_some() && now != seen {
                    seen = now;
                    tracing::info!("{} changed: reloading", path.display());
                    reload(&running, &path).await;
                }
            }
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    tracing::info!("stopping");
    running.stop().await?;
    tracing::info!("stopped");
    Ok(())
}
