#!/usr/bin/env bash
# End-to-end benchmark on the GPU machine (docs/benchmarks-cuda.md, "End to end"): draftlens vs the
# plain transformers script (tools/bench/hf_e2e.py) on the same random-weight Qwen3-8B folder, in
# one call. Every step is bounded by a timeout and logged under $OUT.
#
# Build here (no cargo on the GPU machine) and carry the binary:
#   cargo build --release -p draftlens-cli && mkdir -p target-carry/e2e && cp target/release/draftlens target-carry/e2e/ && strip target-carry/e2e/draftlens
# On the device (carry: target-carry/e2e, data/prompts, data/tokenizer/qwen3-hf):
#   bash tools/bench/e2e_device.sh [target-carry/e2e] [N prompts, default 164]
# HF_ONLY=1 runs only the transformers side, DL_ONLY=1 only draftlens.
set -u
BIN=${1:-target-carry/e2e}
N=${2:-164}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DRAFTLENS_KERNEL_CACHE=/tmp/draftlens-kernels
export DRAFTLENS_CACHE=/tmp/dlcache
export PYTHONUNBUFFERED=1
M=/tmp/q8b
DL="$BIN/draftlens"
TAPS=1,9,17,25,33
LOG="$OUT/e2e.log" TIMED_DIR="$OUT" TIMED_ERR_LINES=26
source tools/bench/timed.sh
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader | tee -a "$OUT/e2e.log"
[ -d $M ] || timeout 300 python3 tools/bench/make_random_target.py --out $M 2>&1 | tail -n 3 | tee -a "$OUT/e2e.log"
du -sh $M | tee -a "$OUT/e2e.log"
cat $M/*.safetensors > /dev/null
timed cat_floor bash -c "cat $M/*.safetensors > /dev/null"
[ -z "${HF_ONLY:-}" ] && timed inspect timeout 60 "$DL" inspect $M
[ -z "${DL_ONLY:-}" ] && timed hf_extract timeout 400 python3 tools/bench/hf_e2e.py --model $M --prompts data/prompts/humaneval.jsonl --limit "$N" --layers $TAPS
# transformers at batch 64 too (draftlens decodes 64 prompts at a time by default).
[ -z "${DL_ONLY:-}" ] && timed hf_extract_b64 timeout 400 python3 tools/bench/hf_e2e.py --model $M --prompts data/prompts/humaneval.jsonl --limit "$N" --layers $TAPS --batch 64
[ -z "${DL_ONLY:-}" ] && timed hf_run3 timeout 500 python3 tools/bench/hf_e2e.py --model $M --prompts data/prompts/humaneval.jsonl --limit "$N" --layers $TAPS --drafters $M-drafters
if [ -z "${HF_ONLY:-}" ] && [ -z "${RUNS_ONLY:-}" ]; then
  rm -rf /tmp/dlcache
  timed extract_cold timeout 400 "$DL" extract --backend cuda --target $M --prompts builtin:humaneval --limit "$N" --layers $TAPS --json --timeline
  timed extract_cached timeout 200 "$DL" extract --backend cuda --target $M --prompts builtin:humaneval --limit "$N" --layers $TAPS --json --timeline
  # The same cold extract again with the NVRTC kernel cache warm (what any later process sees).
  rm -rf /tmp/dlcache
  timed extract_cold_warm_kernels timeout 400 "$DL" extract --backend cuda --target $M --prompts builtin:humaneval --limit "$N" --layers $TAPS --json --timeline
fi
# RUNS_ONLY=1: only the `run` of three checkpoints, cold then cached (twice), with the drafter's
# sub-phases in the timeline; NSYS=1 also profiles the cached run with Nsight Systems if present.
if [ -z "${HF_ONLY:-}" ]; then
  rm -rf /tmp/dlcache /tmp/runs.sqlite /tmp/runs2.sqlite /tmp/runs3.sqlite
  timed run_cold3 timeout 400 "$DL" run --backend cuda --target $M --drafter $M-drafters --prompts builtin:humaneval --limit "$N" --db /tmp/runs.sqlite --json --timeline
  timed run_cached3 timeout 300 "$DL" run --backend cuda --target $M --drafter $M-drafters --prompts builtin:humaneval --limit "$N" --db /tmp/runs2.sqlite --json --timeline
  # EXTRA_AB="128 256": the cached run again with those --anchor-batch values.
  for ab in ${EXTRA_AB:-}; do
    timed run_cached3_ab$ab timeout 300 "$DL" run --backend cuda --target $M --drafter $M-drafters --prompts builtin:humaneval --limit "$N" --db /tmp/runs_ab$ab.sqlite --json --timeline --anchor-batch $ab
  done
  if [ -n "${NSYS:-}" ] && command -v nsys > /dev/null; then
    timed run_cached3_nsys timeout 300 nsys profile --stats=true -o "$OUT/run_cached3" -f true "$DL" run --backend cuda --target $M --drafter $M-drafters --prompts builtin:humaneval --limit "$N" --db /tmp/runs3.sqlite --json
    grep -A40 -E "cuda_gpu_kern_sum|cuda_api_sum" "$OUT/run_cached3_nsys.out" | head -n 120 > "$OUT/nsys_summary.txt"
    rm -f "$OUT"/run_cached3.nsys-rep "$OUT"/run_cached3.sqlite
  fi
fi
# The mixed-length set (tools/bench/make_mixed_prompts.py, carried as $BIN/mixed.jsonl): MIXED=1.
if [ -n "${MIXED:-}" ] && [ -e "$BIN/mixed.jsonl" ]; then
  [ -z "${DL_ONLY:-}" ] && timed hf_mixed_extract timeout 400 python3 tools/bench/hf_e2e.py --model $M --prompts "$BIN/mixed.jsonl" --layers $TAPS
  if [ -z "${HF_ONLY:-}" ]; then
    rm -rf /tmp/dlcache
    timed mixed_extract_cold timeout 400 "$DL" extract --backend cuda --target $M --prompts "$BIN/mixed.jsonl" --layers $TAPS --json --timeline
  fi
fi
# One 32k-token prompt (issue 11's memory goal): LONG=1. The prompt repeats HumanEval prompts
# until the Qwen3 tokenizer counts about 32 000 tokens.
if [ -n "${LONG:-}" ] && [ -z "${HF_ONLY:-}" ]; then
  python3 tools/bench/make_long_prompt.py /tmp/q8b /tmp/long32k.jsonl
  rm -rf /tmp/dlcache
  timed long32k_extract timeout 200 "$DL" extract --backend cuda --target $M --prompts /tmp/long32k.jsonl --max-new-tokens 32 --layers $TAPS --json --timeline
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader | tee -a "$OUT/e2e.log"
