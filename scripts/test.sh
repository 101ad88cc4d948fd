#!/usr/bin/env bash
# The project's test command: installs what the tests need, starts what is not running, then
# checks formatting and lints and runs every test (cargo test at the root builds the components).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
rustup target add wasm32-wasip2
rustup component add rustfmt clippy >/dev/null 2>&1 || true
scripts/services.sh

cargo fmt --all -- --check
cargo clippy --release --all-targets -- -D warnings
cargo test --release
