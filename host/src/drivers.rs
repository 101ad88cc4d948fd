//! The driver registry. A driver is the only code that touches a broker: a small async mirror
//! of a native client, exposed to components as its own WIT package and lent only to the
//! components the operator configured it for. Each broker's driver is a crate in its folder
//! (`adapters/<name>/driver`, on [`wrpc_broker_runtime::driver::Driver`]); this module
//! re-exports them and lists them in one table ([`registry`]). Everything else (the builder,
//! `check`, `bench`, `demo`, `inspect`) finds a broker through the table: a new broker is its
//! crate, a cargo feature and one row of [`registry`].

pub use wrpc_broker_runtime::driver::{
    ConnectFuture, Driver, DriverConnections, DriverInfo, Lent, LinkFn,
};
pub use wrpc_broker_runtime::faults;
/// The in-process memory driver (`adapters/memory/driver`).
pub use wrpc_driver_memory as memory;

use crate::error::{Error, Result};

/// Every driver of this build, memory first.
pub fn registry() -> &'static [&'static dyn Driver] {
    &[
        &memory::MemoryDriver,
        #[cfg(feature = "redis")]
        &wrpc_driver_redis::Redis,
        #[cfg(feature = "nats")]
        &wrpc_driver_nats::Nats,
        #[cfg(feature = "rabbitmq")]
        &wrpc_driver_rabbitmq::RabbitMq,
        #[cfg(feature = "kafka")]
        &wrpc_driver_kafka::Kafka,
    ]
}

/// The scheme of `url` (`redis` of `redis://host`); a bare word is a scheme too.
pub fn scheme(url: &str) -> &str {
    url.split_once("://").map_or(url, |(scheme, _)| scheme)
}

/// The driver serving `url`'s scheme, or a bad request listing what this build supports.
pub fn for_url(url: &str) -> Result<&'static dyn Driver> {
    let scheme = scheme(url);
    registry()
        .iter()
        .copied()
        .find(|d| d.info().schemes.contains(&scheme))
        .ok_or_else(|| {
            Error::BadRequest(format!(
                "broker URL scheme `{scheme}` is not supported by this build (supported: {})",
                supported_schemes().join(", ")
            ))
        })
}

/// The URL schemes this build understands.
pub fn supported_schemes() -> Vec<&'static str> {
    registry()
        .iter()
        .flat_map(|d| d.info().schemes.iter().copied())
        .collect()
}

/// Every driver interface this host has, by WIT name without version, for import checks.
pub fn interfaces() -> Vec<&'static str> {
    registry().iter().map(|d| d.info().interface).collect()
}

/// The adapter component embedded in this build for the broker at `url`, if any.
pub fn embedded_adapter(url: &str) -> Option<&'static [u8]> {
    for_url(url).ok().map(|d| d.info().embedded_adapter)
}

/// Connect to every URL in `urls` (unless a connection serving its driver is in `lent`
/// already), and hand the lot out as the connections of one adapter.
pub async fn connect_all(urls: &[String], mut lent: Vec<Lent>) -> Result<DriverConnections> {
    for url in urls {
        let driver = for_url(url)?;
        if !lent
            .iter()
            .any(|l| l.interface() == driver.info().interface)
        {
            lent.push(driver.connect(url).await?);
        }
    }
    Ok(DriverConnections::new(lent, interfaces()))
}

/// Every driver's interface linked but none connected: enough to load any adapter and call
/// its `describe` (which touches no broker); a driver call fails as not configured.
pub fn unconnected() -> DriverConnections {
    let lent = registry().iter().map(|d| d.info().lend(())).collect();
    DriverConnections::new(lent, interfaces())
}
