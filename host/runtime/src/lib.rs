//! The wrpc-broker runtime: loading and caching components, sandboxing, the Store-owner per
//! instance, streams across the boundary, the `host` import, and what a driver is ([`driver`]).
//!
//! It sits below everything else: the drivers (one crate per broker, `adapters/<name>/driver`)
//! build on it, and the `wrpc-broker` host crate builds on both. Nothing here names a broker.

#![deny(missing_docs)]

pub mod bench;
pub mod bindings;
pub mod budget;
pub mod cache;
mod calls;
pub mod drive;
pub mod driver;
pub mod error;
pub mod faults;
pub mod floor;
mod host_impl;
pub mod ids;
pub mod instance;
pub mod lent;
pub mod limiter;
pub mod loader;
pub mod output;
pub mod pages;
pub mod sandbox;
mod start;
pub mod streams;
mod supervise;
pub mod token;
pub mod trace;
pub mod trap;

pub use cache::{ComponentCache, Origin};
pub use error::{Error, Result};
pub use instance::{AdapterInfo, AdapterInstance, InstanceConfig, describe};
pub use lent::{DriverConnections, Lent, LinkFn};
pub use loader::{AdapterComponent, Capabilities, Exports, Runtime};
pub use sandbox::Limits;
