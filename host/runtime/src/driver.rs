//! What a driver is: the only code that touches a broker, a small async mirror of a native
//! client, exposed to components as its own WIT package and lent only to the components the
//! operator configured it for. Like Spin's host factors: one trait ([`Driver`]) says what a
//! driver is — its URL schemes, the WIT interface it serves, how it connects from a URL and
//! links into a Store, the adapter embedded for its URLs, its fault hook. Each broker's driver
//! is a crate of its own (`adapters/<name>/driver`); the host's registry lists them.

use std::future::Future;
use std::pin::Pin;

use crate::bench::NativeBench;
use crate::error::Result;
pub use crate::lent::{DriverConnections, Lent, LinkFn};

/// A boxed future a driver returns from [`Driver::connect`].
pub type ConnectFuture<'a> = Pin<Box<dyn Future<Output = Result<Lent>> + Send + 'a>>;

/// A boxed future a driver returns from [`Driver::native_bench`].
pub type NativeBenchFuture<'a> =
    Pin<Box<dyn Future<Output = anyhow::Result<Option<Box<dyn NativeBench>>>> + Send + 'a>>;

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
    /// How many append calls of one topic the host keeps in flight at once on an adapter this
    /// driver is lent to: more than one where the driver's client pipelines a connection's
    /// writes in the order they were made (each batch keeps its order; two concurrent calls
    /// have none between them, as from two host instances); one where an adapter chains each
    /// batch onto the one before it (NATS).
    pub appends_in_flight: usize,
}

impl DriverInfo {
    /// Lend `connection` (this driver's own type) to an adapter.
    pub fn lend<T: std::any::Any + Send + Sync>(&self, connection: T) -> Lent {
        Lent::new(self.interface, connection, self.linker).appends_in_flight(self.appends_in_flight)
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

    /// The native side of `wrpc-broker bench` for the broker at `url` (`connection` is a
    /// connection of this driver to it), when the driver has one.
    fn native_bench<'a>(&'a self, url: &'a str, connection: &'a Lent) -> NativeBenchFuture<'a> {
        let _ = (url, connection);
        Box::pin(async { Ok(None) })
    }
}
