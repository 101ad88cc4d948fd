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

#[tokio::main]
async fn main() -> ExitCode {
    let serving = std::env::args().nth(1).as_deref() == Some("serve");
    let default = if serving { "info" } else { "warn" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // Colours only on a terminal: `demo 2> file` gets plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let result: anyhow::Result<()> = cli::Cli::parse().run().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}`: the error and its causes on one line, with no backtrace.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
