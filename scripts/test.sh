#!/usr/bin/env bash
# The project's test command: installs what the tests need, starts what is not running, then
# checks formatting and lints and runs every test (cargo test at the root builds the components).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# The wasm target: rustup first; where it cannot download the standard library here, the copy
# bundled in ../shared (for this toolchain) is unpacked.
if ! rustup target add wasm32-wasip2; then
  shared_script="$(pwd)/../shared/scripts/wasm-target.sh"
  [ -f "$shared_script" ] || { echo "test: rustup could not add wasm32-wasip2 and $shared_script is missing" >&2; exit 1; }
  bash "$shared_script"
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
scripts/services.sh
# Clients the `serve` tests use that nobody here wrote: curl, Debian's Chromium (a browser's
# EventSource), Python's `websockets` and schemathesis (pinned).
missing=""
command -v curl >/dev/null || missing="$missing curl"
command -v chromium >/dev/null || missing="$missing chromium"
if [ -n "$missing" ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
fi
python3 -c 'import websockets, sys; sys.exit(websockets.__version__ != "15.0.1")' 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check 'websockets==15.0.1'
python3 -c 'import schemathesis, sys; sys.exit(schemathesis.__version__ != "4.32.5")' 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check 'schemathesis==4.32.5'

# componentize-py, pinned to the version that pairs with the host's wasmtime (the component
# model's async ABI still moves between releases): tests/build.rs builds the Python adapter.
python3 -c 'import importlib.metadata as m, sys; sys.exit(m.version("componentize-py") != "0.25.1")' 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check 'componentize-py==0.25.1'

cargo fmt --all -- --check
cargo clippy --release --all-targets -- -D warnings
cargo test --release
# Fuzzing (cargo fuzz, libFuzzer, nightly): a short run of every target — encode_token and
# options, and the component targets parse_id, init_options and lift, which build wasmtime under
# cargo fuzz in its own target dir (≈20–30 min the first time on 2 cores, incremental after).
# WRPC_FUZZ_COMPONENTS=0 leaves the component targets out of a local run.
WRPC_FUZZ_COMPONENTS="${WRPC_FUZZ_COMPONENTS:-1}" scripts/fuzz.sh "${WRPC_FUZZ_SECONDS:-15}"
# The adapter template, written by `wrpc-broker new-adapter` outside the repository, built as the
# README says and checked. Always in CI; elsewhere WRPC_SKIP_TEMPLATE_CHECK=1 skips it.
if [ "${CI:-}" = true ] || [ -z "${WRPC_SKIP_TEMPLATE_CHECK:-}" ]; then
  cargo build --release -p wrpc-broker-cli
  scripts/template-check.sh "${CARGO_TARGET_DIR:-target}/release/wrpc-broker"
fi
