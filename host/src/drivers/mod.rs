//! Drivers: the only code that touches a broker. Each is a small async mirror of a native client,
//! exposed to components as its own WIT package and lent only to the components the operator
//! configured it for.
//!
//! Like Spin's host factors: one trait ([`Driver`]) says what a driver is — its URL schemes, the
//! WIT interface it serves, how it connects from a URL and links into a Store, the adapter
//! embedded for its URLs, its fault hook — and one table ([`registry`]) lists the drivers of this
//! build. Everything else (the builder, `check`, `bench`, `demo`, `inspect`) finds a broker
//! through the table; a new broker is a new module here and one line in [`registry`].

pub mod faults;
pub mod memory;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "redis")]
pub mod redis;

use std::future::Future;
use std::pin::Pin;

use crate::error::{Error, Result};
pub use crate::runtime::{DriverConnections, Lent, LinkFn};

/// A boxed future a driver returns from [`Driver::connect`].
pub type ConnectFuture<'a> = Pin<Box<dyn Future<Output = Result<Lent>> + Send + 'a>>;

/// What a driver is, as data: its names, its WIT interface, how that links, its adapter.
#[derive(Debug)]
pub struct DriverInfo {
    /// Its name, as in messages and `--broker` help (`redis`).
    pub name: &'static str,
    /// The URL schemes it serves (`redis`, `rediss`).
    pub schemes: &'static [&'static str],
    /// The WIT interface it provides, without version (`wrpc:redis/client`).
    pub interface: &'static str,
    /// The adapter component embedded in the host for its URLs.
    pub embedded_adapter: &'static [u8],
    /// Links its interface into a component's linker.
    pub linker: LinkFn,
}

impl DriverInfo {
    /// Lend `connection` (this driver's own type) to an adapter.
    pub fn lend<T: std::any::Any + Send + Sync>(&self, connection: T) -> Lent {
        Lent::new(self.interface, connection, self.linker)
    }
}

/// One kind of broker connection the host can lend to adapter components.
pub trait Driver: Send + Sync + 'static {
    /// What it is.
    fn info(&self) -> &'static DriverInfo;

    /// Connect to the broker at `url` (the first connection is made now, so a wrong URL or a
    /// server that is down fails here).
    fn connect<'a>(&'a self, url: &'a str) -> ConnectFuture<'a>;

    /// A URL that opens the same broker for every host instance opened on it. For a server that
    /// is its URL; the memory driver names an in-process store (`memory://` alone makes a
    /// fresh one each time).
    fn shared_url(&self, url: &str) -> String {
        url.to_string()
    }

    /// The fault hook for tests: make the broker behind `connection` refuse the next `count`
    /// settlements of messages of `queue` (wherever the adapter keeps them); `count` 0 arms
    /// nothing. `false` when the driver has no fault hook.
    fn refuse_settlements(&self, connection: &Lent, queue: &str, count: u32) -> bool {
        let _ = (connection, queue, count);
        false
    }
}

/// Every driver of this build, memory first.
pub fn registry() -> &'static [&'static dyn Driver] {
    &[
        &memory::MemoryDriver,
        #[cfg(feature = "redis")]
        &redis::Redis,
        #[cfg(feature = "nats")]
        &nats::Nats,
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
