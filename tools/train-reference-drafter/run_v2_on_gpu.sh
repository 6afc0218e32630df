#!/usr/bin/env bash
# The second reference-drafter run in ONE device call (~9 minutes on an H200 or H100):
#   1. the target (GGUF, sha256 checked) loads; the token ids of the first run are reused
#      (runs/2026-11-29-b/ids.json.gz: 4,565 training + 344 evaluation sequences, no regeneration);
#   2. the target writes greedy responses to the second prompt set (EXTRA, from build_prompts.py:
#      library functions as HumanEval-style prompts + more evals sets, disjoint from the first set
#      and from the evaluation sets) for EXTRA_GEN_S seconds, as many as that allows;
#   3. taps of every training sequence; the `reference` and `leaky` series train together, one
#      loop, identical batches and anchors (LAYERS-layer drafters, MLP INTERMEDIATE, KD weight KD),
#      the step count fitted to the deadline by a 30-step probe;
#   4. the trainer's evaluation of every checkpoint (HumanEval, GSM8K, MT-Bench; train-style for
#      leaky; a sample of training sequences as the memorisation check);
#   5. the checkpoints packed into parts of < 16 MiB (pack_out.py): the call returns log.txt,
#      results.json, manifest.txt and the first parts; the rest stays in /tmp for `--send`.
#
#   bash tools/train-reference-drafter/run_v2_on_gpu.sh GGUF OUTDIR [DEADLINE_S] [IDS] [EXTRA]
#   bash tools/train-reference-drafter/run_v2_on_gpu.sh --send OUTDIR   # next call: the parts left, ids_extra.json.gz
#
# GGUF        SmolLM2-135M-Instruct.Q4_1.gguf (sha256 checked)
# OUTDIR      log.txt (every stage's time, then tau per checkpoint), results.json (train.py's, with a
#             `run_v2` key: stage seconds and the tau table), manifest.txt, ckpts.tar.partNN
# DEADLINE_S  seconds from now by which training and evaluation are done (default 530); packing
#             and copying take ~5 s more
# IDS         default tools/train-reference-drafter/runs/2026-11-29-b/ids.json.gz
# EXTRA       default data/device-v2/train_prompts_v2.jsonl.gz
#
# Environment (defaults in brackets): LAYERS [3], INTERMEDIATE [1024], KD [0.5], EXTRA_GEN_S [150],
# GEN_BATCH [2048], GEN_TOKENS [1000000] (KV-cache rows per generation batch), TF_BATCH [128],
# STEPS [100000] (an upper bound: the deadline decides), LR [1e-3], DEVICE [cuda], TRAIN [/tmp/draftlens-train],
# TRAIN_ARGS (more train.py arguments, e.g. for a CPU dry run: see README.md).
# Needs: python3 with torch 2.11 + transformers 5.17 + accelerate, and gguf importable (the device
# machine has none: pip install --no-index --target /tmp/site gguf-0.19.0-*.whl first, PYTHONPATH).
set -uo pipefail
HERE=tools/train-reference-drafter
TR=${TRAIN:-/tmp/draftlens-train}

if [[ ${1:-} == --send ]]; then
    OUT=$2
    mkdir -p "$OUT"
    python3 $HERE/pack_out.py send "$TR/pack" "$OUT" --extra "$TR/ids_extra.json.gz" "$TR/log.txt"
    exit $?
fi

GGUF=$1
OUT=$2
START=$(date +%s)
DEADLINE=$((START + ${3:-530}))
IDS=${4:-$HERE/runs/2026-11-29-b/ids.json.gz}
EXTRA=${5:-data/device-v2/train_prompts_v2.jsonl.gz}
DEVICE=${DEVICE:-cuda}
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$OUT"
rm -rf "$TR" && mkdir -p "$TR"
LOG=$TR/log.txt # copied into OUT at the end (and by --send): one log for both calls
stage() { echo "[stage $(($(date +%s) - START)) s] $*" | tee -a "$LOG"; }

stage "start: $(date -u +%FT%TZ), deadline in $((DEADLINE - START)) s, device $DEVICE"
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $GGUF" | sha256sum -c - >>"$LOG" 2>&1 || {
    stage "$GGUF: sha256 mismatch (the GGUF parts were not all there, or not in order)"
    cp "$LOG" "$OUT/"
    exit 1
}
for f in "$IDS" "$EXTRA"; do
    [[ -f $f ]] || { stage "missing $f"; cp "$LOG" "$OUT/"; exit 1; }
done
sha256sum "$IDS" "$EXTRA" >>"$LOG"
[[ $DEVICE == cuda ]] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$LOG" 2>&1
python3 -c 'import importlib.metadata as m, torch, transformers, gguf; print("torch", torch.__version__, "transformers", transformers.__version__, "gguf", m.version("gguf"))' >>"$LOG" 2>&1

stage "train.py: load, generate (EXTRA_GEN_S ${EXTRA_GEN_S:-150} s), taps, train both series, evaluate"
# (--train-prompts is required but unread when --ids-in is given: the first set's ids are reused)
# shellcheck disable=SC2086 # TRAIN_ARGS is a list of words on purpose
python3 $HERE/train.py --target "$GGUF" --device "$DEVICE" \
    --train-prompts "$EXTRA" --ids-in "$IDS" \
    --eval humaneval=crates/engine/builtin-prompts/humaneval.jsonl \
    --eval gsm8k=crates/engine/builtin-prompts/gsm8k.jsonl \
    --eval mtbench=crates/engine/builtin-prompts/mtbench.jsonl \
    --extra-prompts "$EXTRA" --extra-gen-seconds "${EXTRA_GEN_S:-150}" --reserve-after-gen 270 \
    --gen-batch "${GEN_BATCH:-2048}" --gen-round "${GEN_BATCH:-2048}" --gen-tokens "${GEN_TOKENS:-1000000}" \
    --tf-batch "${TF_BATCH:-128}" --ids-extra-out "$TR/ids_extra.json.gz" \
    --series reference,leaky --layers "${LAYERS:-3}" --intermediate "${INTERMEDIATE:-1024}" \
    --kd-weight "${KD:-0.5}" --lr "${LR:-1e-3}" --train-sample 64 \
    --steps "${STEPS:-100000}" --deadline-epoch "$DEADLINE" --eval-reserve 50 \
    --out "$TR" --results results.json ${TRAIN_ARGS:-} 2>&1 | grep --line-buffered -v 'it/s\]' | tee -a "$LOG"
rc=${PIPESTATUS[0]}
stage "train.py exited $rc"

# Stage times and the tau table, into the log and results.json.
python3 $HERE/summarise_run.py "$TR/results.json" "$LOG" "$START" run_v2 2>&1 | tee -a "$LOG"

stage "packing"
python3 $HERE/pack_out.py pack "$TR" "$TR/pack" 2>&1 | tee -a "$LOG"
stage "done (the parts that do not fit this call: run_v2_on_gpu.sh --send OUTDIR in the next one)"
python3 $HERE/pack_out.py send "$TR/pack" "$OUT" --extra "$LOG" "$TR/results.json" 2>&1 | tee -a "$LOG"
cp "$LOG" "$OUT/"
exit $rc
