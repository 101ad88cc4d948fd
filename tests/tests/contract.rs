//! The contract suite against every backend of this workspace: one cargo test per contract test
//! and backend, named `<backend>::<capability>::<test>`, so
//! `cargo test -p wrpc-broker-contract --test contract -- redis::queue::ack_is_final` runs one.
//!
//! Like Dapr's conformance config, each backend is one row of [`backends`]: a broker URL, the
//! component (or the adapter embedded for the URL) and its options. A server that does not
//! answer fails every test of its backend, never skips it. A test that needs a feature the
//! backend lacks is listed as ignored, with the reason as its kind (`[skipped: …]`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use libtest_mimic::{Arguments, Failed, Trial};
use wrpc_broker_contract::{Factory, Verdict, all, components, run_one, skip_reason};

/// A broker and the adapter the suite runs against.
struct Backend {
    /// Its name, the first part of each test's name.
    name: String,
    /// The broker URL.
    url: String,
    /// The component file; the adapter embedded for the URL when none.
    component: Option<&'static str>,
    /// Options every instance gets (a namespace of its own on a shared server).
    options: Vec<(String, String)>,
}

/// A broker folder's `conformance.toml`: how the suite meets that broker.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Conformance {
    /// The broker URL (the server `server.sh` in the same folder starts).
    url: String,
    /// An environment variable that, when set, replaces `url`.
    url_env: Option<String>,
    /// A `prefix` option no earlier run used (a namespace of its own on a shared server).
    #[serde(default)]
    fresh_prefix: bool,
    /// Options every instance gets.
    #[serde(default)]
    options: std::collections::BTreeMap<String, String>,
}

/// A namespace no earlier run on a shared server used.
fn fresh_prefix() -> (String, String) {
    let prefix = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    ("prefix".to_string(), prefix)
}

/// The backends of the broker folders, `adapters/<name>/conformance.toml`, by folder name: each
/// runs the adapter embedded in the host for its URL. A broker adds its file, not a line here.
fn broker_backends() -> Vec<Backend> {
    let adapters = Path::new(env!("CARGO_MANIFEST_DIR")).join("../adapters");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&adapters)
        .unwrap_or_else(|e| panic!("reading {}: {e}", adapters.display()))
        .map(|entry| {
            entry
                .expect("a folder entry")
                .path()
                .join("conformance.toml")
        })
        .filter(|path| path.is_file())
        .collect();
    found.sort();
    found
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("reading conformance.toml");
            let config: Conformance =
                toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let name = path.parent().and_then(Path::file_name).expect("a folder");
            let mut options: Vec<(String, String)> = config.options.into_iter().collect();
            if config.fresh_prefix {
                options.push(fresh_prefix());
            }
            Backend {
                name: name.to_string_lossy().into_owned(),
                url: config
                    .url_env
                    .and_then(|var| std::env::var(var).ok())
                    .unwrap_or(config.url),
                component: None,
                options,
            }
        })
        .collect()
}

/// Every backend: the memory adapter from its file, the memory adapter written in Python
/// (`adapters/memory-python`), a memory adapter that names its store queues, logs and channels
/// its own way (the fault hook must not depend on our names), one that settles a batch one
/// settlement after the other (the guest SDK's default path, which no broker's adapter takes), and
/// every broker folder's conformance config (Redis and NATS, on the servers
/// `scripts/services.sh` starts).
fn backends() -> Vec<Backend> {
    let memory = |name: &str, component| Backend {
        name: name.to_string(),
        url: "memory://".into(),
        component: Some(component),
        options: Vec::new(),
    };
    let mut backends = vec![
        memory("memory", components::MEMORY),
        #[cfg(feature = "python")]
        memory("memory_python", components::MEMORY_PYTHON),
        memory("memory_other_names", components::MEMORY_OTHER_NAMES),
        memory(
            "memory_sequential_settles",
            components::MEMORY_SEQUENTIAL_SETTLES,
        ),
    ];
    backends.extend(broker_backends());
    backends
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let runtime = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime"),
    );
    let mut trials = Vec::new();
    for backend in backends() {
        // Connect once: the factory every test of this backend shares, and what it offers.
        let opened = runtime.block_on(async {
            let factory = Factory::for_url(
                &backend.url,
                backend.component.map(Into::into),
                backend.options.clone(),
            )
            .await?;
            let capabilities = factory.instance().await?.capabilities();
            anyhow::Ok((factory, capabilities))
        });
        for test in all() {
            let name = format!(
                "{}::{}::{}",
                backend.name,
                test.capability.name(),
                test.name
            );
            let trial = match &opened {
                Err(e) => {
                    let why = format!("{} at {}: {e:#}", backend.name, backend.url);
                    Trial::test(name, move || Err(Failed::from(why)))
                }
                Ok((factory, capabilities)) => {
                    let skipped = skip_reason(&test, capabilities, &factory.features());
                    let (factory, capabilities) = (factory.clone(), *capabilities);
                    let runtime = runtime.clone();
                    let trial = Trial::test(name, move || {
                        let outcome = runtime.block_on(run_one(&factory, &test, &capabilities));
                        match outcome.verdict {
                            Verdict::Pass => Ok(()),
                            Verdict::Fail(why) => Err(why.into()),
                            Verdict::Skipped(why) => Err(format!("skipped: {why}").into()),
                        }
                    });
                    match skipped {
                        Some(why) => trial
                            .with_ignored_flag(true)
                            .with_kind(format!("skipped: {why}")),
                        None => trial,
                    }
                }
            };
            trials.push(trial);
        }
    }
    libtest_mimic::run(&args, trials).exit_code()
}
