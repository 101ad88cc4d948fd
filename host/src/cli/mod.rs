//! The subcommands of the `wrpc-broker` binary, parsed with clap.

mod demo;
mod inspect;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Host for message-broker adapters that are WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "wrpc-broker", version, about)]
pub struct Cli {
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
        /// The broker to run on; only `memory` (the embedded adapter) works for now.
        #[arg(long, value_name = "URL", default_value = "memory")]
        broker: String,
    },
}

impl Cli {
    /// Run the chosen subcommand.
    pub async fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Inspect { component } => inspect::run(&component).await,
            Command::Demo { broker } => demo::run(&broker).await,
        }
    }
}
