//! `wrpc-broker inspect <component.wasm>`: load a component (every known driver granted, so any
//! adapter loads), call its `describe` without `init`, and print what it is and needs.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use wrpc_broker::Limits;
use wrpc_broker::drivers;
use wrpc_broker::ids::RandomIds;
use wrpc_broker::runtime::{InstanceConfig, Origin, Runtime, describe};

/// Width of the `key:` column.
const KEY_WIDTH: usize = 14;

pub async fn run(path: &Path) -> anyhow::Result<()> {
    let runtime = Runtime::shared()?;
    let drivers = drivers::unconnected();
    let component = Arc::new(runtime.load_file(path, &drivers)?);
    let config = InstanceConfig {
        options: vec![],
        limits: Limits::default(),
        ids: Arc::new(RandomIds),
        drivers,
    };
    let info = describe(&component, &config).await?;

    line("file", &component.source);
    line("name", &info.name);
    line("version", &info.version);
    line("broker", &info.broker);
    line("capabilities", &component.capabilities.names().join(", "));
    line("size", &human_size(component.size));
    let origin = match component.origin {
        Origin::Cached => "taken from the cache",
        Origin::Compiled => "compiled now",
    };
    line("compiled", origin);
    line("load time", &millis(component.load_time));
    lines("imports", component.imports.iter().map(String::clone));
    let name_width = info.options.iter().map(|o| o.0.len()).max().unwrap_or(0);
    let default_width = info.options.iter().map(|o| o.1.len()).max().unwrap_or(0) + 2;
    lines(
        "options",
        info.options.iter().map(|(name, default, doc)| {
            let default = format!("[{default}]");
            format!("{name:<name_width$}  {default:<default_width$}  {doc}")
        }),
    );
    Ok(())
}

/// One `key: value` line.
fn line(key: &str, value: &str) {
    println!("{:<KEY_WIDTH$}{value}", format!("{key}:"));
}

/// A key with several values, one per line, aligned under the first.
fn lines(key: &str, values: impl Iterator<Item = String>) {
    let mut key = format!("{key}:");
    let mut any = false;
    for value in values {
        println!("{key:<KEY_WIDTH$}{value}");
        key.clear();
        any = true;
    }
    if !any {
        println!("{key:<KEY_WIDTH$}(none)");
    }
}

fn human_size(bytes: u64) -> String {
    match bytes {
        b if b < 1024 => format!("{b} B"),
        b if b < 1024 * 1024 => format!("{:.1} KiB ({b} bytes)", b as f64 / 1024.0),
        b => format!("{:.1} MiB ({b} bytes)", b as f64 / (1024.0 * 1024.0)),
    }
}

fn millis(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}
