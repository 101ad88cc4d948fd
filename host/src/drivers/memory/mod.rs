//! The `wrpc:memory` driver: the host's in-process broker ([`store`]) and its WIT binding. State
//! lives in a [`MemoryStore`] shared by `Arc` between host instances, so two hosts on one memory
//! broker behave like two processes on a real one, and a trapped or swapped adapter loses nothing.

mod bindings;
pub mod store;

pub use bindings::add_to_linker;
pub use store::{Fault, MemoryStore, QueueStats};

/// The WIT interface this driver provides.
pub const INTERFACE: &str = "wrpc:memory/store";
