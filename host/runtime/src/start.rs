//! Starting one instance: a fresh sandboxed Store with its memory cap and CPU slice,
//! instantiated, its exports resolved, `describe` and then `init` called — all of it within the
//! call timeout, so a component that never finishes starting is an error, not a hang.

use std::sync::Arc;

use wasmtime::Store;

use super::budget;
use super::instance::{AdapterInfo, InstanceConfig};
use super::loader::{Exports, SharedComponent};
use super::output::InstanceLog;
use super::sandbox::Ctx;
use super::trace::TargetLogger;
use super::trap;
use crate::bindings::adapter;
use crate::error::{Error, Result};

/// A started instance: its Store, exports and what `describe` said.
pub(crate) type Started = (Store<Ctx>, Exports, AdapterInfo);

/// Instantiate `component` in a sandboxed Store and run `describe`, without `init`: what
/// `wrpc-broker inspect` shows. Bounded by the call timeout.
pub async fn describe(component: &SharedComponent, config: &InstanceConfig) -> Result<AdapterInfo> {
    let timeout = config.limits.call_timeout;
    let started = tokio::time::timeout(
        timeout,
        new_instance(component, config, 0, InstanceLog::unnamed()),
    )
    .await
    .map_err(|_| {
        Error::Timeout(format!(
            "{}: instantiating and describe() did not finish within {timeout:?}",
            component.source
        ))
    })?;
    Ok(started?.2)
}

/// Start generation `generation`: [`new_instance`], then `init` with the options, within the
/// call timeout. `log` is the instance's log (named already for a replacement).
pub(crate) async fn instantiate(
    component: &SharedComponent,
    config: &InstanceConfig,
    generation: u32,
    log: Arc<InstanceLog>,
) -> Result<Started> {
    let timeout = config.limits.call_timeout;
    tokio::time::timeout(timeout, start(component, config, generation, log))
        .await
        .map_err(|_| {
            Error::Timeout(format!(
                "{}: the adapter did not start (instantiate, describe, init) within {timeout:?}",
                component.source
            ))
        })?
}

async fn start(
    component: &SharedComponent,
    config: &InstanceConfig,
    generation: u32,
    log: Arc<InstanceLog>,
) -> Result<Started> {
    let (mut store, exports, info) = new_instance(component, config, generation, log).await?;
    let options = config.options.clone();
    let adapter = exports.adapter.clone();
    let init = store
        .run_concurrent(async move |accessor| {
            let init = adapter.call_init(accessor, generation, options);
            budget::heartbeat(accessor, init).await
        })
        .await
        .and_then(|r| r);
    let init = init.map_err(|e| failed(component, &store, "init trapped", &e))?;
    init.map_err(|e| match Error::from(e) {
        Error::BadRequest(m) => Error::BadRequest(format!("adapter `{}` options: {m}", info.name)),
        other => other,
    })?;
    Ok((store, exports, info))
}

/// A load error for `what` failing with `e`: the cause on one line (the backtrace at DEBUG).
fn failed(
    component: &SharedComponent,
    store: &Store<Ctx>,
    what: &str,
    e: &wasmtime::Error,
) -> Error {
    let report = trap::report(e, &store.data().log.stderr_tail());
    if let Some(backtrace) = &report.backtrace {
        tracing::debug!(source = %component.source, "{what}: {backtrace}");
    }
    Error::Load(format!("{}: {what}: {}", component.source, report.message))
}

/// A fresh Store with its limits, instantiated, its exports resolved and `describe` called;
/// once `describe` names the adapter, `log` goes to `broker.<name>`.
async fn new_instance(
    component: &SharedComponent,
    config: &InstanceConfig,
    generation: u32,
    log: Arc<InstanceLog>,
) -> Result<Started> {
    let mut store = Store::new(
        &component.engine,
        Ctx::new(
            log.clone(),
            config.ids.clone(),
            config.drivers.clone(),
            &config.limits,
            generation,
        ),
    );
    store.limiter(|ctx| &mut ctx.limiter);
    budget::install(&mut store);
    let instance = match component.pre.instantiate_async(&mut store).await {
        Ok(instance) => instance,
        Err(e) => return Err(failed(component, &store, "instantiating", &e)),
    };
    let exports = match component.indices.load(&mut store, &instance) {
        Ok(exports) => exports,
        Err(e) => return Err(failed(component, &store, "resolving exports", &e)),
    };
    let described = match exports.adapter.call_describe(&mut store).await {
        Ok(described) => described,
        Err(e) => return Err(failed(component, &store, "describe", &e)),
    };
    let info = AdapterInfo {
        name: described.name,
        version: described.version,
        broker: described.broker,
        options: described
            .options
            .into_iter()
            .map(|o: adapter::OptionInfo| (o.name, o.default_value, o.doc))
            .collect(),
    };
    if info.name.is_empty()
        || info.name.len() > 64
        || !info
            .name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    {
        return Err(Error::Load(format!(
            "{}: describe() named the adapter {:?}: use up to 64 letters, digits, `-` and `_`",
            component.source, info.name
        )));
    }
    log.name(TargetLogger::new(&format!("broker.{}", info.name)));
    Ok((store, exports, info))
}
