//! The contract suite against every backend of this workspace: one cargo test per contract test
//! and backend, named `<backend>::<capability>::<test>`, so
//! `cargo test -p wrpc-broker-contract --test contract -- redis::queue::ack_is_final` runs one.
//!
//! Like Dapr's conformance config, each backend is one row of [`backends`]: a broker URL, the
//! component (or the adapter embedded for the URL) and its options. A server that does not
//! answer fails every test of its backend, never skips it. A test that needs a feature the
//! backend lacks is listed as ignored, with the reason as its kind (`[skipped: …]`).

use std::process::ExitCode;
use std::sync::Arc;

use libtest_mimic::{Arguments, Failed, Trial};
use wrpc_broker_contract::{Factory, Verdict, all, components, run_one, skip_reason};

/// A broker and the adapter the suite runs against.
struct Backend {
    /// Its name, the first part of each test's name.
    name: &'static str,
    /// The broker URL.
    url: String,
    /// The component file; the adapter embedded for the URL when none.
    component: Option<&'static str>,
    /// Options every instance gets (a namespace of its own on a shared server).
    options: Vec<(String, String)>,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// A namespace no earlier run on a shared server used.
fn fresh_prefix() -> Vec<(String, String)> {
    let prefix = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    vec![("prefix".to_string(), prefix)]
}

/// Every backend: the memory adapter from its file, a memory adapter that names its store
/// queues, logs and channels its own way (the fault hook must not depend on our names), and the
/// Redis and NATS adapters embedded in the host, on the servers `scripts/services.sh` starts.
fn backends() -> Vec<Backend> {
    vec![
        Backend {
            name: "memory",
            url: "memory://".into(),
            component: Some(components::MEMORY),
            options: Vec::new(),
        },
        Backend {
            name: "memory_other_names",
            url: "memory://".into(),
            component: Some(components::MEMORY_OTHER_NAMES),
            options: Vec::new(),
        },
        Backend {
            name: "redis",
            url: env_or("WRPC_REDIS_URL", "redis://127.0.0.1:6379"),
            component: None,
            options: fresh_prefix(),
        },
        Backend {
            name: "nats",
            url: env_or("WRPC_NATS_URL", "nats://127.0.0.1:4222"),
            component: None,
            options: fresh_prefix(),
        },
    ]
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
