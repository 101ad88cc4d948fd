//! The subcommands of the `wrpc-broker` binary, parsed with clap.

use std::path::PathBuf;
use std::time::Duration;

use crate::{bench, check, demo, inspect, migrate, new_adapter, soak};

use clap::{Parser, Subcommand};

/// Host for message-broker adapters that are WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "wrpc-broker", version, about)]
pub struct Cli {
    /// Worker threads of the host's runtime (default: one per core, or `TOKIO_WORKER_THREADS`).
    /// A call into an idle instance is answered on its caller's task, and a tail's entries go
    /// on in the task that produced them, but batches, handlers, deliveries and a broker's
    /// replies still hop between tasks; on a machine with few cores,
    /// fewer workers means fewer of those hops wake a parked thread (BENCHMARKS.md, its
    /// section on `--workers`).
    #[arg(long, global = true, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: Option<u16>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load an adapter component and show what it is, offers and needs.
    Inspect {
        /// The component file (`.wasm`).
        component: PathBuf,
    },
    /// Run a short scenario on two host instances sharing one broker, and narrate it.
    Demo {
        /// The broker: `memory://` (the embedded adapter, default), `redis://127.0.0.1:6379`,
        /// `nats://127.0.0.1:4222`.
        #[arg(long, value_name = "URL", default_value = "memory://")]
        broker: String,
    },
    /// Run the contract suite against a component file and print a verdict table; exits
    /// non-zero on any failure.
    Check {
        /// The component file (`.wasm`).
        component: PathBuf,
        /// The broker its drivers connect to.
        #[arg(long, value_name = "URL", default_value = "memory://")]
        broker: String,
        /// Only tests whose `capability/name` contains this.
        #[arg(long, value_name = "NAME")]
        filter: Option<String>,
    },
    /// Write a new adapter crate (the log and backplane capabilities on the memory broker, to
    /// edit) with the WIT of this host, ready to build with
    /// `cargo build --target wasm32-wasip2 --release` and to `check`.
    NewAdapter {
        /// The folder to create; it may exist if it is empty.
        dir: PathBuf,
        /// The crate name (default: the folder's name); the `.wasm` file is named after it.
        #[arg(long, value_name = "CRATE")]
        name: Option<String>,
    },
    /// Move a running host, with live work, from one broker to another and print each step:
    /// switched, consumers moved, queues drained, readers moved, old adapter closed.
    Migrate {
        /// The broker the host starts on.
        #[arg(long, value_name = "URL", default_value = "memory://")]
        from: String,
        /// The broker it moves to.
        #[arg(long, value_name = "URL")]
        to: String,
        /// Queue messages produced over the run (half before the move).
        #[arg(long, value_name = "N", default_value_t = 2000)]
        messages: usize,
        /// Seconds consumers may drain the old broker's queues before it is let go anyway.
        #[arg(long, value_name = "S", default_value_t = 60.0)]
        deadline: f64,
    },
    /// Measure each operation through the component and natively on the broker, alternating,
    /// and print ops/s, p50, p99 and the ratio.
    Bench {
        /// The broker.
        #[arg(long, value_name = "URL", default_value = "memory://")]
        broker: String,
        /// An adapter component file instead of the one embedded for the broker.
        #[arg(long, value_name = "FILE")]
        adapter: Option<PathBuf>,
        /// Payload size in bytes.
        #[arg(long, value_name = "N", default_value_t = 100)]
        size: usize,
        /// Seconds spent on each operation (both sides together).
        #[arg(long, value_name = "S", default_value_t = 2.0)]
        duration: f64,
        /// Also measure resident memory per idle log reader, topic tail and queue consumer at
        /// these counts (e.g. `1,1000,10000`).
        #[arg(long, value_name = "N,N,…", value_delimiter = ',')]
        scale: Vec<usize>,
        /// Only the rows whose operation contains one of these words (e.g. `catch-up,live`);
        /// the swap and load tables are left out then (`--only none --scale …`: scale rows only).
        #[arg(long, value_name = "WORD,WORD,…", value_delimiter = ',')]
        only: Vec<String>,
    },
    /// Serve the four capabilities over HTTP until SIGTERM, configured by a TOML file; an edit
    /// of the file (or SIGHUP) swaps the adapter or migrates the broker of the running host.
    Serve {
        /// The config file (see the README's "Serving over HTTP").
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Seconds between two looks at the config file for an edit.
        #[arg(long, value_name = "S", default_value_t = 1.0)]
        poll: f64,
    },
    /// Run every capability at load for a long time, with periodic hot swaps and (with
    /// `--chaos`) a trapping component beside it; print RSS, open file descriptors, the
    /// instances' memory, counts and errors over time; fail if anything was lost.
    Soak {
        /// The broker.
        #[arg(long, value_name = "URL", default_value = "memory://")]
        broker: String,
        /// How long to run, in seconds.
        #[arg(long, value_name = "S", default_value_t = 60.0)]
        duration: f64,
        /// Seconds between two printed lines.
        #[arg(long, value_name = "S", default_value_t = 10.0)]
        every: f64,
        /// Seconds between two hot swaps of the adapter.
        #[arg(long, value_name = "S", default_value_t = 5.0)]
        swap_every: f64,
        /// A component that traps now and then, run on its own memory store beside the load.
        #[arg(long, value_name = "FILE")]
        chaos: Option<PathBuf>,
    },
}

impl Cli {
    /// Whether the command is `serve` (a long-running server: its logs default to `info`).
    pub fn serves(&self) -> bool {
        matches!(self.command, Command::Serve { .. })
    }

    /// Run the chosen subcommand.
    pub async fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Inspect { component } => inspect::run(&component).await,
            Command::Serve { config, poll } => {
                wrpc_broker_serve::serve(config, Duration::from_secs_f64(poll.max(0.05))).await
            }
            Command::Demo { broker } => demo::run(&broker).await,
            Command::Check {
                component,
                broker,
                filter,
            } => {
                if check::run_check(component, broker, filter).await? {
                    Ok(())
                } else {
                    anyhow::bail!("the component failed the contract suite")
                }
            }
            Command::NewAdapter { dir, name } => new_adapter::run(&dir, name.as_deref()),
            Command::Migrate {
                from,
                to,
                messages,
                deadline,
            } => {
                let config = migrate::MigrateConfig {
                    from,
                    to,
                    messages,
                    deadline: Duration::from_secs_f64(deadline),
                };
                migrate::run(&config).await
            }
            Command::Bench {
                broker,
                adapter,
                size,
                duration,
                scale,
                only,
            } => {
                let config = bench::BenchConfig {
                    broker,
                    adapter,
                    size,
                    duration: Duration::from_secs_f64(duration),
                    scale,
                    only,
                };
                // On a worker of the runtime, where a server's handlers run: `main`'s own
                // thread is not one, so every call from it would wake a worker across threads.
                let (rows, extras) =
                    tokio::spawn(async move { bench::run(&config).await }).await??;
                println!("{}", bench::stats::table(&rows));
                if let Some(load) = &extras.load {
                    print!("{}", bench::load_table(load));
                }
                if let Some(swap) = &extras.swap {
                    print!("{}", bench::swap_table(swap));
                }
                if !extras.scale.is_empty() {
                    print!("{}", bench::scale::scale_table(&extras.scale));
                }
                Ok(())
            }
            Command::Soak {
                broker,
                duration,
                every,
                swap_every,
                chaos,
            } => {
                let config = soak::SoakConfig {
                    broker,
                    duration: Duration::from_secs_f64(duration),
                    every: Duration::from_secs_f64(every),
                    swap_every: Duration::from_secs_f64(swap_every),
                    chaos,
                };
                soak::run(&config).await
            }
        }
    }
}
