//! Host-side bindings for the `wrpc:broker` package: the `host` import every component gets
//! and the capability exports the host calls (generated from `wit/broker`, world `host-view`).
//! A component exports any subset of the capabilities; the loader looks each one up.

// Generated: the WIT documents these items.
#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../../wit/broker",
    world: "wrpc:broker/host-view",
    exports: { default: async },
});

pub use exports::wrpc::broker::{adapter, backplane, direct, log, queue};
pub use wrpc::broker::{host, types};
