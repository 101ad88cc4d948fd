//! `wrpc-broker`: the command line of the host — `inspect` an adapter component, or run the
//! `demo` scenario on the embedded memory adapter. Logs go to stderr, filtered by `RUST_LOG`
//! (default `warn`); results go to stdout.

mod cli;

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
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
