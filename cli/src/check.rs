//! `wrpc-broker check`: the contract suite (the same library the cargo tests use) against any
//! adapter component file, a third party's included, with a verdict table.

use std::io::Write as _;
use std::path::PathBuf;

use std::io::IsTerminal as _;

use wrpc_broker_contract::{Factory, RunOptions, any_failed, report, run};

/// Run the suite and print the table; `Ok(false)` when a test failed.
pub async fn run_check(path: PathBuf, url: String, filter: Option<String>) -> anyhow::Result<bool> {
    if !path.is_file() {
        anyhow::bail!("no component file at {}", path.display());
    }
    let factory = Factory::for_url(&url, Some(path.clone()), Vec::new()).await?;
    let options = RunOptions {
        filter: filter.as_deref(),
        stop_on_failure: false,
    };
    eprintln!("checking {} on {url}", path.display());
    // A progress line that rewrites itself, on a terminal only (no escape codes in a file).
    let terminal = std::io::stderr().is_terminal();
    let outcomes = run(&factory, options, |i, total, test| {
        if !terminal {
            return;
        }
        eprint!(
            "\r\x1b[2K[{}/{total}] {}/{}",
            i + 1,
            test.capability.name(),
            test.name
        );
        let _ = std::io::stderr().flush();
    })
    .await?;
    if terminal {
        eprintln!("\r\x1b[2K");
    }
    print!("{}", report(&outcomes));
    Ok(!any_failed(&outcomes))
}
