//! The `wrpc:memory` driver: the host's in-process broker ([`store`]) and its WIT binding. State
//! lives in a [`MemoryStore`] shared by `Arc` between host instances, so two hosts on one memory
//! broker behave like two processes on a real one, and a trapped or swapped adapter loses nothing.
//!
//! URLs: `memory://` opens a fresh store; `memory://<name>` the store of that name in this
//! process, alive while a broker (or a [`Lent`] connection) holds it.

mod bench;
mod bindings;
pub mod store;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

pub use bindings::add_to_linker;
pub use store::{MemoryStore, QueueStats};

use wrpc_broker_runtime::bench::NativeBench;
use wrpc_broker_runtime::driver::{ConnectFuture, Driver, DriverInfo, Lent, NativeBenchFuture};

/// The WIT interface this driver provides.
pub const INTERFACE: &str = "wrpc:memory/store";

/// The memory adapter component, built from `adapters/memory` and shipped inside the host.
pub static ADAPTER: &[u8] = include_bytes!(env!("WRPC_MEMORY_COMPONENT"));

/// Lend `store` to an adapter.
pub fn lend(store: Arc<MemoryStore>) -> Lent {
    INFO.lend(store)
}

/// The stores opened by name (`memory://<name>`) and still held somewhere.
static NAMED: Mutex<Option<HashMap<String, Weak<MemoryStore>>>> = Mutex::new(None);

/// The store name of a `memory://<name>` URL; empty for a fresh store.
fn store_name(url: &str) -> &str {
    url.split_once("://")
        .map_or("", |(_, name)| name)
        .trim_end_matches('/')
}

/// The store named `name`, made on first use.
fn named(name: &str) -> Arc<MemoryStore> {
    let mut named = NAMED.lock().unwrap_or_else(|e| e.into_inner());
    let named = named.get_or_insert_with(HashMap::new);
    named.retain(|_, store| store.strong_count() > 0);
    if let Some(store) = named.get(name).and_then(Weak::upgrade) {
        return store;
    }
    let store = MemoryStore::new();
    named.insert(name.to_string(), Arc::downgrade(&store));
    store
}

/// The in-process memory broker as a [`Driver`].
#[derive(Debug, Clone, Copy)]
pub struct MemoryDriver;

/// What this driver is.
static INFO: DriverInfo = DriverInfo {
    name: "memory",
    schemes: &["memory"],
    interface: INTERFACE,
    embedded_adapter: ADAPTER,
    linker: add_to_linker,
    appends_in_flight: 1,
};

impl Driver for MemoryDriver {
    fn info(&self) -> &'static DriverInfo {
        &INFO
    }

    fn connect<'a>(&'a self, url: &'a str) -> ConnectFuture<'a> {
        let store = match store_name(url) {
            "" => MemoryStore::new(),
            name => named(name),
        };
        Box::pin(async move { Ok(lend(store)) })
    }

    fn shared_url(&self, url: &str) -> String {
        match store_name(url) {
            "" => format!("memory://shared-{}", uuid::Uuid::new_v4().simple()),
            _ => url.to_string(),
        }
    }

    fn refuse_settlements(&self, connection: &Lent, queue: &str, count: u32) -> bool {
        let store = connection.get::<Arc<MemoryStore>>();
        store.map(|s| s.refuse_settlements(queue, count)).is_some()
    }

    fn native_bench<'a>(&'a self, _url: &'a str, connection: &'a Lent) -> NativeBenchFuture<'a> {
        let store = connection.get::<Arc<MemoryStore>>().cloned();
        Box::pin(async move {
            Ok(store.map(|store| Box::new(bench::Native::new(store)) as Box<dyn NativeBench>))
        })
    }
}
