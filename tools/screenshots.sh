#!/usr/bin/env bash
# Regenerates docs/screenshots/ (1280 px) from runs made by `draftlens run` on the CPU with the
# default SmolLM2 target: the three reference checkpoints in deployment mode and the last one in
# train-style mode (the inflation row), on the first PROMPTS MT-Bench prompts (default 20, the
# fewest for a comparison verdict). Needs `bash scripts/setup-fixtures.sh` and Debian's chromium +
# chromium-driver. Usage: bash tools/screenshots.sh [PROMPTS] [MAX_NEW_TOKENS]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
N="${1:-20}"
NEW="${2:-48}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
DB="$WORK/runs.sqlite"
export CARGO_INCREMENTAL=0
cargo build -q -p draftlens-cli
DL=(target/debug/draftlens --cache-dir "$WORK/cache")
COMMON=(--prompts builtin:mtbench --limit "$N" --max-new-tokens "$NEW" --db "$DB")
"${DL[@]}" run --drafter drafters/smollm2-reference "${COMMON[@]}"
"${DL[@]}" run --drafter drafters/smollm2-reference/step-2581 --mode train-style --mask inclusive "${COMMON[@]}"
DRAFTLENS_SHOTS_DB="$DB" cargo test -q -p draftlens-web --test browser -- screenshots_from_real_runs --nocapture
echo "screenshots: docs/screenshots/ (from $N prompts, $NEW new tokens each)"
