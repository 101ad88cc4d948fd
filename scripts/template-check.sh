#!/usr/bin/env bash
# The adapter template, followed as the README's "Writing an adapter" tells a third party: the
# built `wrpc-broker` writes it with `new-adapter` into a fresh folder outside the repository,
# `cargo build --target wasm32-wasip2 --release` builds it there, and `wrpc-broker check` runs
# the contract suite on the .wasm. Fails when any step does, when the template's Cargo.lock is
# out of date, or when the written crate is not formatted or not clippy-clean (the workspace's
# `cargo fmt` and `cargo clippy` do not reach it: it is no member). Prints the time of each step.
#
# Where the build goes: the README's command with CARGO_TARGET_DIR unset writes `target/` in
# the new folder. Here CARGO_TARGET_DIR is set, always, to a folder of the template's own,
# $WRPC_TEMPLATE_TARGET (default ~/.cache/wrpc-broker/template-target), never to the one a
# caller (CI) exported for the workspace: that one holds the workspace's build (and its lock,
# while cargo runs), and a template built into it would look like part of it. Kept between
# runs, so a rerun compiles only the template crate, not wit-bindgen.
#
# Usage: scripts/template-check.sh [path/to/wrpc-broker]
# (default: $CARGO_TARGET_DIR/release/wrpc-broker, else target/release/wrpc-broker).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

cli=${1:-${CARGO_TARGET_DIR:-$repo/target}/release/wrpc-broker}
[ -x "$cli" ] || {
  echo "template-check: no wrpc-broker at $cli (cargo build --release -p wrpc-broker-cli)" >&2
  exit 1
}
cli=$(cd "$(dirname "$cli")" && pwd)/$(basename "$cli")
export CARGO_TARGET_DIR=${WRPC_TEMPLATE_TARGET:-$HOME/.cache/wrpc-broker/template-target}
mkdir -p "$CARGO_TARGET_DIR"
# Outside the repository its rust-toolchain.toml does not apply: build with the toolchain it
# names (the one test.sh gave the wasm target), not with whatever the default is.
toolchain=$(rustup show active-toolchain 2>/dev/null | cut -d' ' -f1 || true)
[ -z "$toolchain" ] || export RUSTUP_TOOLCHAIN=$toolchain

scratch=$(mktemp -d "${TMPDIR:-/tmp}/wrpc-template.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
case "$scratch/" in
  "$repo"/*) echo "template-check: $scratch is inside the repository" >&2; exit 1 ;;
esac

now_ms() { date +%s%3N; }
started=$(now_ms)
step_started=$started
# `step NAME`: print the time since the previous step.
step() {
  local now
  now=$(now_ms)
  printf 'template-check: %-40s %4d.%01d s\n' "$1" $(((now - step_started) / 1000)) $(((now - step_started) % 1000 / 100))
  step_started=$now
}

cd "$scratch"
"$cli" new-adapter my-adapter >/dev/null
cp my-adapter/Cargo.lock written.lock
step "new-adapter my-adapter"

cd my-adapter
cargo build --target wasm32-wasip2 --release
step "cargo build (in $scratch)"
if ! cmp -s Cargo.lock ../written.lock; then
  echo "template-check: cargo had to change adapters/template/Cargo.lock:" >&2
  diff ../written.lock Cargo.lock >&2 || true
  echo "template-check: update it with: (cd adapters/template && cargo update --workspace)" >&2
  exit 1
fi

cargo fmt --check
cargo clippy --quiet --target wasm32-wasip2 --release -- -D warnings
step "cargo fmt --check, cargo clippy"

wasm=$CARGO_TARGET_DIR/wasm32-wasip2/release/my_adapter.wasm
"$cli" check "$wasm"
step "check my_adapter.wasm"
step_started=$started
step "total"
