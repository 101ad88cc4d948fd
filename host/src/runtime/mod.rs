//! The component runtime: loading and caching components, sandboxing, the Store-owner task per
//! instance, streams across the boundary, and the `host` import.

pub mod cache;
mod calls;
mod host_impl;
pub mod instance;
pub mod lent;
pub mod loader;
pub mod sandbox;
pub mod streams;
pub mod trace;

pub use cache::{ComponentCache, Origin};
pub use instance::{AdapterInfo, AdapterInstance, InstanceConfig, describe};
pub use lent::{DriverConnections, Lent, LinkFn};
pub use loader::{AdapterComponent, Capabilities, Exports, Runtime};
pub use sandbox::Limits;
