#!/usr/bin/env bash
# Short libFuzzer runs of every fuzz target (cargo fuzz, nightly): `scripts/fuzz.sh [seconds]`
# (default 20 per target). encode_token and options are pure Rust; parse_id and init_options run
# the adapter components and lift the host's binding types from a component (they build
# wasmtime under cargo fuzz, with the components built by the stable cargo; parse_id needs the
# local Redis and NATS: WRPC_FUZZ_REDIS= / WRPC_FUZZ_NATS= set empty skip one); they run unless
# WRPC_FUZZ_COMPONENTS=0. Corpora grow in fuzz/corpus/<target> (not committed); a crash leaves
# its input in fuzz/artifacts/<target> and fails the script.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${1:-20}"
# Its own target dir (inside the caller's, when one is set): cargo fuzz builds everything with
# its instrumentation flags, nothing is shared with the root build, and a separate dir keeps
# either from waiting on the other's lock.
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
  export CARGO_TARGET_DIR="$CARGO_TARGET_DIR/fuzz"
fi
if ! cargo fuzz --version 2>/dev/null | grep -q '0\.13\.1'; then
  cargo install cargo-fuzz --version 0.13.1 --locked
fi
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal

run() { # target, extra cargo-fuzz flags...
  local target="$1"; shift
  mkdir -p "corpus/$target"
  local log status=0
  log="$(mktemp)"
  cargo +nightly fuzz run -O "$@" "$target" "corpus/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 >"$log" 2>&1 || status=$?
  grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==|SUMMARY|thread .* panicked)' "$log" || true
  [ "$status" -eq 0 ] || tail -n 40 "$log"
  rm -f "$log"
  echo "fuzz: $target: $(ls "corpus/$target" | wc -l) inputs in the corpus, exit $status"
  [ "$status" -eq 0 ]
}

run encode_token
run options
if [ "${WRPC_FUZZ_COMPONENTS:-1}" = 1 ]; then
  # The adapters are wasm32-wasip2 builds: the stable toolchain has that target, nightly may not.
  WRPC_COMPONENT_CARGO="$(rustup which cargo --toolchain stable)"
  export WRPC_COMPONENT_CARGO
  run parse_id --features components --sanitizer none
  run init_options --features components --sanitizer none
  run lift --features components --sanitizer none
fi
