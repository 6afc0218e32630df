#!/usr/bin/env bash
# The main job on the default model: install fixtures, build, evaluate the shipped reference
# drafter series (3 checkpoints) on HumanEval, store the runs and say where to look.
#   DEMO_LIMIT=N      evaluate only the first N prompts (default: all 164)
#   DEMO_BACKEND=cpu|cuda   (default: cuda when an NVIDIA driver is present, else cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-fixtures.sh
if [ -x plugins/build.sh ] && rustup target list --installed 2>/dev/null | grep -q wasm32-unknown-unknown; then
  bash plugins/build.sh >/dev/null
fi
cargo build --release -p draftlens-cli
backend="${DEMO_BACKEND:-}"
if [ -z "$backend" ]; then
  if ls /dev/nvidia0 >/dev/null 2>&1; then backend=cuda; else backend=cpu; fi
fi
limit=()
[ -n "${DEMO_LIMIT:-}" ] && limit=(--limit "$DEMO_LIMIT")
./target/release/draftlens run --backend "$backend" \
  --target models/SmolLM2-135M-Instruct.Q4_1.gguf \
  --drafter drafters/smollm2-reference --prompts builtin:humaneval "${limit[@]}" \
  --max-new-tokens 128 --db runs.sqlite
echo
echo "Runs are stored in runs.sqlite. Look at them with:"
echo "  ./target/release/draftlens runs ls --db runs.sqlite"
echo "  ./target/release/draftlens serve --db runs.sqlite     # then open http://127.0.0.1:8080"
