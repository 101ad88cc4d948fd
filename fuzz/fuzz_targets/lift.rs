//! Lifting the values the host receives from a component, from any bytes: a component (lift.wat)
//! hands back the fuzzer's bytes as an append result (`result<list<string>, error>`) and as a
//! `log.page`, lifted into the host's own binding types. Lifting must answer a value or an
//! error, never panic, and never take more memory than the component's 64 KiB.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use wasmtime::component::{Component, Linker, TypedFunc};
use wasmtime::{Engine, Store};
use wrpc_broker::bindings::{log, types};

fn component() -> &'static (Engine, Component) {
    static COMPONENT: OnceLock<(Engine, Component)> = OnceLock::new();
    COMPONENT.get_or_init(|| {
        let engine = Engine::default();
        let component = Component::new(&engine, include_str!("../lift.wat")).unwrap();
        (engine, component)
    })
}

fuzz_target!(|bytes: &[u8]| {
    let bytes = &bytes[..bytes.len().min(60 * 1024)];
    let (engine, component) = component();
    for which in ["ids", "page"] {
        let mut store = Store::new(engine, ());
        let instance = Linker::new(engine)
            .instantiate(&mut store, component)
            .unwrap();
        let fill: TypedFunc<(&[u8],), ()> = instance.get_typed_func(&mut store, "fill").unwrap();
        fill.call(&mut store, (bytes,)).unwrap();
        match which {
            "ids" => {
                let ids: TypedFunc<(), (Result<Vec<String>, types::Error>,)> =
                    instance.get_typed_func(&mut store, "ids").unwrap();
                let _ = ids.call(&mut store, ());
            }
            _ => {
                let page: TypedFunc<(), (log::Page,)> =
                    instance.get_typed_func(&mut store, "page").unwrap();
                let _ = page.call(&mut store, ());
            }
        }
    }
});
