//! Lifting the values the host receives from a component, from any bytes: a component (lift.wat)
//! hands back the fuzzer's bytes as each type an adapter's exports return — `describe`'s info,
//! append ids (`result<list<string>, error>`), a `log.page`, a queue delivery, a direct packet,
//! `result<_, error>`, settle's `list<result<_, error>>`, `option<bool>`, `result<u64, error>`,
//! `list<position>` — lifted into the host's own binding types. (Stream elements are the same
//! records: entries, deliveries, packets, payloads.) Lifting must answer a value or an error,
//! never panic, and never take more memory than the component's 64 KiB.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use wasmtime::component::{Component, ComponentNamedList, Lift, Linker, TypedFunc};
use wasmtime::{Engine, Store};
use wrpc_broker::bindings::{adapter, direct, log, queue, types};

fn component() -> &'static (Engine, Component) {
    static COMPONENT: OnceLock<(Engine, Component)> = OnceLock::new();
    COMPONENT.get_or_init(|| {
        let engine = Engine::default();
        let component = Component::new(&engine, include_str!("../lift.wat")).unwrap();
        (engine, component)
    })
}

/// A fresh instance holding `bytes`, then its export `name` lifted as `R` (a trap or a lifting
/// error is fine; a panic is not).
fn lift<R>(bytes: &[u8], name: &str)
where
    (R,): ComponentNamedList + Lift + Send + Sync + 'static,
{
    let (engine, component) = component();
    let mut store = Store::new(engine, ());
    let instance = Linker::new(engine)
        .instantiate(&mut store, component)
        .unwrap();
    let fill: TypedFunc<(&[u8],), ()> = instance.get_typed_func(&mut store, "fill").unwrap();
    fill.call(&mut store, (bytes,)).unwrap();
    let export: TypedFunc<(), (R,)> = instance.get_typed_func(&mut store, name).unwrap();
    let _ = export.call(&mut store, ());
}

type Outcome<T> = Result<T, types::Error>;

fuzz_target!(|bytes: &[u8]| {
    let bytes = &bytes[..bytes.len().min(60 * 1024)];
    lift::<Outcome<Vec<String>>>(bytes, "ids");
    lift::<log::Page>(bytes, "page");
    lift::<adapter::Info>(bytes, "describe");
    lift::<queue::Delivery>(bytes, "a-delivery");
    lift::<direct::Packet>(bytes, "a-packet");
    lift::<Outcome<()>>(bytes, "unit");
    lift::<Vec<Outcome<()>>>(bytes, "settled");
    lift::<Option<bool>>(bytes, "healthy");
    lift::<Outcome<u64>>(bytes, "depth");
    lift::<Vec<types::Position>>(bytes, "positions");
});
