//! `wrpc-broker`: the command line of the host — run the `demo`, `inspect` an adapter
//! component, `check` one against the contract suite, `bench` one against the native client,
//! `migrate` a host with live work to another broker, `soak` one for a long time, start a
//! `new-adapter` crate from the template, `serve` the capabilities over HTTP.
//! Logs go to stderr, filtered by `RUST_LOG` (default `warn`, `info` for `serve`); results go
//! to stdout.

mod bench;
mod check;
mod cli;
mod demo;
mod inspect;
mod migrate;
mod new_adapter;
mod soak;

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

/// jemalloc, not glibc's malloc: a host moves every payload between threads (allocated on one
/// worker, freed on another), where glibc's arenas spent a third of a catch-up read in `free`
/// and `malloc_consolidate` (BENCHMARKS.md, "The allocator"; mimalloc was as fast but held
/// 2.5× the memory per idle queue consumer).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The log directive that keeps lapin's per-returned-message warning out of the default output.
const QUIET_RETURNS: &str = "lapin::returned_messages=error";

/// Parse the command line, then run it on a runtime of `--workers` threads.
fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = cli.workers {
        runtime.worker_threads(usize::from(workers));
    }
    match runtime.enable_all().build() {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Set up logging and run the command.
async fn run(cli: cli::Cli) -> ExitCode {
    let level = if cli.serves() { "info" } else { "warn" };
    // lapin logs every message the broker returns at WARN, body included; a return is how the
    // RabbitMQ adapter learns a direct request had no listener (503), so it is no warning here.
    let default = format!("{level},{QUIET_RETURNS}");
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // Colours only on a terminal: `demo 2> file` gets plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let result: anyhow::Result<()> = cli.run().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}`: the error and its causes on one line, with no backtrace.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
