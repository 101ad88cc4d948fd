//! The memory cap counts every linear memory and table of every core instance in a Store
//! together (hostile components in `tests/components/hostile-wat/`).

use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Module, Store};
use wrpc_broker_runtime::limiter::InstanceLimiter;

const CAP: usize = 256 << 20;

fn store(engine: &Engine) -> Store<InstanceLimiter> {
    let mut store = Store::new(engine, InstanceLimiter::new(CAP));
    store.limiter(|limiter| limiter);
    store
}

fn instantiate_component(wat: &str) -> (wasmtime::Result<()>, usize) {
    let engine = Engine::default();
    let component = Component::new(&engine, wat).unwrap();
    let mut store = store(&engine);
    let total = store.data().total();
    let result = Linker::new(&engine)
        .instantiate(&mut store, &component)
        .map(drop);
    (result, total.load(std::sync::atomic::Ordering::Relaxed))
}

#[test]
fn many_memories_are_counted_together() {
    let (result, held) = instantiate_component(include_str!(
        "../../../tests/components/hostile-wat/many-memories.wat"
    ));
    let e = result.unwrap_err();
    assert!(format!("{e:#}").contains("memory limit"), "{e:#}");
    assert!(format!("{e:#}").contains("Limits::memory_bytes"), "{e:#}");
    assert!(held <= CAP, "{held}");
}

#[test]
fn a_huge_table_is_counted() {
    let (result, held) = instantiate_component(include_str!(
        "../../../tests/components/hostile-wat/huge-table.wat"
    ));
    let e = result.unwrap_err();
    assert!(format!("{e:#}").contains("growing a table"), "{e:#}");
    assert!(held <= CAP, "{held}");
}

#[test]
fn growing_memory_traps_at_the_cap() {
    let engine = Engine::default();
    let module = Module::new(
        &engine,
        include_str!("../../../tests/components/hostile-wat/grow-loop.wat"),
    )
    .unwrap();
    let mut store = store(&engine);
    let total = store.data().total();
    let instance = wasmtime::Instance::new(&mut store, &module, &[]).unwrap();
    let bomb = instance
        .get_typed_func::<(), ()>(&mut store, "bomb")
        .unwrap();
    let e = bomb.call(&mut store, ()).unwrap_err();
    assert!(format!("{e:#}").contains("memory limit"), "{e:#}");
    let held = total.load(std::sync::atomic::Ordering::Relaxed);
    assert!(held <= CAP && held > CAP - (1 << 20), "{held}");
}
