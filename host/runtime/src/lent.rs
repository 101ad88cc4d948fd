//! The broker connections lent to one adapter: each a driver's connection, the WIT interface it
//! serves and how that interface links into a Store. The runtime knows no driver by name; the
//! driver registry ([`crate::drivers`]) makes these, and a driver's bindings find their own
//! connection again with [`DriverConnections::get`].

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use wasmtime::component::Linker;

use super::sandbox::Ctx;

/// Links one driver interface into a linker.
pub type LinkFn = fn(&mut Linker<Ctx>) -> wasmtime::Result<()>;

/// One driver connection lent to a component.
#[derive(Clone)]
pub struct Lent {
    interface: &'static str,
    connection: Arc<dyn Any + Send + Sync>,
    link: LinkFn,
    appends_in_flight: usize,
}

impl Lent {
    /// Lend `connection`, which serves `interface` (a WIT name without version) once `link` has
    /// added that interface to the component's linker.
    pub fn new<T: Any + Send + Sync>(interface: &'static str, connection: T, link: LinkFn) -> Self {
        Self {
            interface,
            connection: Arc::new(connection),
            link,
            appends_in_flight: 1,
        }
    }

    /// Let the host keep `count` append calls of one topic in flight at once (at least
    /// one; [`crate::DriverInfo::appends_in_flight`]).
    pub fn appends_in_flight(mut self, count: usize) -> Self {
        self.appends_in_flight = count.max(1);
        self
    }

    /// The WIT interface it serves, without version (`wrpc:redis/client`).
    pub fn interface(&self) -> &'static str {
        self.interface
    }

    /// The connection, when it is a `T`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.connection.downcast_ref()
    }
}

impl fmt::Debug for Lent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lent")
            .field("interface", &self.interface)
            .finish_non_exhaustive()
    }
}

/// The connections lent to one adapter (only what the operator configured), and the driver
/// interfaces this host knows, so an import of a known but unconfigured driver reads as such.
#[derive(Clone, Default, Debug)]
pub struct DriverConnections {
    lent: Vec<Lent>,
    known: Vec<&'static str>,
}

impl DriverConnections {
    /// Lent connections; `known` are the driver interfaces the host has (configured or not).
    pub fn new(lent: Vec<Lent>, known: Vec<&'static str>) -> Self {
        Self { lent, known }
    }

    /// The lent connection of type `T`, if one was lent.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.lent.iter().find_map(Lent::get)
    }

    /// Whether a connection serving `interface` (a WIT name without version) is lent.
    pub fn grants(&self, interface: &str) -> bool {
        self.lent.iter().any(|l| l.interface == interface)
    }

    /// Whether `interface` is a driver this host has, lent or not.
    pub fn knows(&self, interface: &str) -> bool {
        self.known.contains(&interface) || self.grants(interface)
    }

    /// How many append calls of one topic the host keeps in flight at once: the fewest any
    /// lent driver allows, one when none is lent.
    pub fn appends_in_flight(&self) -> usize {
        self.lent
            .iter()
            .map(|l| l.appends_in_flight)
            .min()
            .unwrap_or(1)
    }

    /// Link the lent drivers' interfaces, and only those.
    pub(crate) fn add_to_linker(&self, linker: &mut Linker<Ctx>) -> wasmtime::Result<()> {
        for lent in &self.lent {
            (lent.link)(linker)?;
        }
        Ok(())
    }
}
