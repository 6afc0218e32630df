#!/usr/bin/env bash
# Hybrid end to end on the GPU machine (issue 12, docs/benchmarks-cuda.md "Hybrid target"):
# Qwen3.6-27B's text model at 16 of its 64 layers (tools/bench/make_random_target.py --arch
# qwen3.6-27b-16l: every layer at the 27B's shapes, random weights, 3 random DFlash checkpoints with
# taps 1,7,14), then
#   bench   the product's packed prefill (`cuda_bench --only ceilings,target`) under both Gated
#           DeltaNet profiles, against the compute floor of its FLOP count;
#   dl      `draftlens run` of the checkpoints (reference profile) cold (`run`) and cached
#           (`cached`), then `extract --gdn-profile engine` (`engine`; cold: the profile is part
#           of the cache key);
#   long    `extract` of one ~32k-token prompt (the memory check and the long forward);
#   hf      the transformers script a user would write (tools/bench/hf_e2e.py: generate, one
#           forward with hidden states, the 3 drafters) with transformers' torch fallback for the
#           Gated DeltaNet (`hf_torch`) and with fla's Triton kernels (`hf_fla`: the carried
#           fla-core / flash-linear-attention 0.6.0 wheels on PYTHONPATH over the system's torch).
# Usage (carry $B with draftlens, cuda_bench, tok.tar, humaneval.jsonl, fla/ wheels, *.xz ok):
#   [ARCH=qwen3.6-27b|qwen3-32b] STEPS="make bench dl long hf_torch hf_fla" bash tools/bench/hybrid_device.sh $B [N prompts]
set -u
B=${1:-target-carry/hyb}
N=${2:-164}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DRAFTLENS_KERNEL_CACHE=/tmp/draftlens-kernels
export DRAFTLENS_CACHE=/tmp/dlcache-hyb
export PYTHONUNBUFFERED=1
STEPS=${STEPS:-make bench dl hf_torch hf_fla}
has() { [[ " $STEPS " == *" $1 "* ]]; }
# ARCH=qwen3.6-27b: the whole 64-layer model (one drafter, taps 1,31,61; written where there is
# room for its 54 GB: /dev/shm when it has it, else /tmp).
ARCH=${ARCH:-qwen3.6-27b-16l}
# ARCH=qwen3-32b: the 27B-class dense target of issue 11 (Qwen3-32B's shapes, 65.5 GB; one
# drafter, taps 1,17,33,49,61; needs /dev/shm).
if [ "$ARCH" = qwen3.6-27b ]; then
  TAPS=${TAPS:-1,31,61}; DRAFTERS=${DRAFTERS:-1}
  M=/tmp/q27full
  [ "$(df --output=avail -B1G /dev/shm 2>/dev/null | tail -n 1)" -ge 60 ] 2>/dev/null && M=/dev/shm/q27full
elif [ "$ARCH" = qwen3-32b ]; then
  TAPS=${TAPS:-1,17,33,49,61}; DRAFTERS=${DRAFTERS:-1}
  M=/dev/shm/q32
else
  TAPS=${TAPS:-1,7,14}; DRAFTERS=${DRAFTERS:-3}
  M=/tmp/q27
fi
LOG="$OUT/hybrid.log" TIMED_DIR=/tmp TIMED_OUT_BYTES=1200
source tools/bench/timed.sh
for f in "$B"/*.xz; do [ -e "$f" ] && xz -d "$f"; done
if [ -e "$B/tok.tar" ] && [ ! -e data/tokenizer/qwen3-hf/tokenizer.json ]; then
  mkdir -p data/prompts data/tokenizer && tar -xf "$B/tok.tar" -C /tmp && rm -rf data/tokenizer/qwen3-hf && mv /tmp/tokmin data/tokenizer/qwen3-hf
fi
[ -e "$B/humaneval.jsonl" ] && mkdir -p data/prompts && cp "$B/humaneval.jsonl" data/prompts/
chmod +x "$B"/draftlens "$B"/cuda_bench 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader | tee -a "$LOG"
df -h /tmp /dev/shm | tail -n 2 | tee -a "$LOG"
if has make && [ ! -e $M/config.json ]; then
  timed make timeout 300 python3 tools/bench/make_random_target.py --arch $ARCH --out $M --taps $TAPS --drafters $DRAFTERS
  du -sh $M | tee -a "$LOG"
fi
if has bench; then
  timed cat_floor bash -c "cat $M/*.safetensors > /dev/null"
  timed cuda_bench timeout 240 "$B/cuda_bench" --only ceilings,target --target $M --target-seqs 4x4096 --forwards 3 --out "$OUT/bench_hybrid.json"
fi
# `dl` = `run` + `cached` + `engine`.
has dl && STEPS="$STEPS run cached engine"
if has run; then
  # `run` of the checkpoints from nothing (continuations, hidden states, drafters: the job
  # hf_e2e.py does).
  rm -rf "$DRAFTLENS_CACHE" /tmp/hyb_runs*.sqlite*
  timed dl_run3_cold timeout 400 "$B/draftlens" run --backend cuda --target $M --drafter $M-drafters --prompts builtin:humaneval --limit "$N" --db /tmp/hyb_runs.sqlite --json --timeline
fi
if has cached; then
  # The same again with everything cached, after `sync` (the first run's gigabytes of cache
  # writes flushed).
  sync; sleep 1
  timed dl_run3_cached timeout 200 "$B/draftlens" run --backend cuda --target $M --drafter $M-drafters --prompts builtin:humaneval --limit "$N" --db /tmp/hyb_runs2.sqlite --json --timeline
fi
if has engine; then
  # `extract` under the engine profile (cold: the profile is part of the cache key).
  timed dl_extract_engine timeout 400 "$B/draftlens" extract --backend cuda --gdn-profile engine --target $M --prompts builtin:humaneval --limit "$N" --layers $TAPS --json --timeline
fi
# One prompt of ~32k tokens (issue 11's memory goal, tools/bench/make_long_prompt.py): `long` in STEPS.
if has long; then
  python3 tools/bench/make_long_prompt.py "$M" /tmp/long32k.jsonl
  timed dl_long32k timeout 300 "$B/draftlens" extract --backend cuda --target $M --prompts /tmp/long32k.jsonl --max-new-tokens 32 --layers $TAPS --json --timeline
fi
if has hf_torch; then
  python3 -c "import fla" 2> /dev/null && log "warning: fla is importable by the system python; hf_torch would use it"
  timed hf_torch timeout 500 python3 tools/bench/hf_e2e.py --model $M --prompts data/prompts/humaneval.jsonl --limit "$N" --layers $TAPS --drafters $M-drafters
fi
if has hf_fla; then
  # Installed offline into a folder put on PYTHONPATH for this step only (the system's torch,
  # transformers and triton stay as they are; a venv would not see a user-site torch).
  SITE=/tmp/fla-site
  [ -d $SITE/fla ] || python3 -m pip install --no-deps --no-index --target $SITE "$B"/fla/*.whl 2>&1 | tail -n 2 | tee -a "$LOG"
  PYTHONPATH=$SITE python3 -c "import fla, torch, transformers; print('fla', fla.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tee -a "$LOG"
  timed hf_fla timeout 500 env PYTHONPATH=$SITE python3 tools/bench/hf_e2e.py --model $M --prompts data/prompts/humaneval.jsonl --limit "$N" --layers $TAPS --drafters $M-drafters
fi
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader | tee -a "$LOG"
