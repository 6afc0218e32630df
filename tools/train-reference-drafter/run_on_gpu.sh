#!/usr/bin/env bash
# The whole GPU training job in one command, sized to finish inside one 10-minute device call:
#   1. regenerate the training (and evaluation) responses with the target, once, and keep their
#      token ids (train.py --ids-out): the labels are the target's greedy tokens;
#   2. train the `reference` and `leaky` series (same step count, chosen by a timing probe to fit
#      the deadline; both see exactly the same batches and anchors);
#   3. each process evaluates its checkpoints on the held-out sets; pack the checkpoints.
# Run from the repository root on the GPU machine:
#
#   bash tools/train-reference-drafter/run_on_gpu.sh GGUF OUTDIR [DEADLINE_SECONDS] [IDS]
#
# GGUF     SmolLM2-135M-Instruct.Q4_1.gguf (sha256 checked here)
# OUTDIR   receives: log.txt, ids.json.gz (regenerated token ids), results.json, and the
#          checkpoints packed as <series>_<k>.tar (<= 2 checkpoints per tar, so that every file stays
#          under the device tool's 16 MiB limit)
# DEADLINE_SECONDS  wall-clock seconds from now by which training and evaluation must be done
#          (default 540); the step count is chosen from a timing probe to fit, and recorded.
# IDS      optional ids.json.gz from an earlier run: skips step 1 (the regeneration, ~140 s).
#
# Needs: python3 with torch 2.11 + transformers 5.17 (+ accelerate), and the gguf package importable
# (the device machine has no gguf: pip install --no-index --target /tmp/site gguf-0.19.0-*.whl first).
set -uo pipefail
GGUF=$1
OUT=$2
DEADLINE=$(($(date +%s) + ${3:-540}))
IDS=${4:-}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
LOG=$OUT/log.txt
TR=/tmp/draftlens-train
HERE=tools/train-reference-drafter
EVALS=(--eval humaneval=data/prompts/humaneval.jsonl --eval gsm8k=data/prompts/gsm8k.jsonl
    --eval mtbench=data/prompts/mtbench.jsonl)

echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $GGUF" | sha256sum -c - >>"$LOG" 2>&1 || {
    echo "run_on_gpu.sh: $GGUF: sha256 mismatch" | tee -a "$LOG"
    exit 1
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$LOG" 2>&1
python3 -c 'import torch, transformers, gguf; print("torch", torch.__version__, "transformers", transformers.__version__)' >>"$LOG" 2>&1
rm -rf "$TR" && mkdir -p "$TR"

# 1. Regenerate the responses (token ids only; every process recomputes its own taps in ~15 s).
t=$(date +%s)
if [[ -z $IDS ]]; then
    IDS=$TR/ids.json.gz
    python3 $HERE/train.py --target "$GGUF" --train-prompts data/device/train_prompts.jsonl "${EVALS[@]}" \
        --out "$TR/data" --series "" --gen-batch 512 --ids-out "$IDS" 2>&1 | tee -a "$LOG"
    echo "regeneration: $(($(date +%s) - t)) s" | tee -a "$LOG"
fi
cp "$IDS" "$OUT/ids.json.gz"

# 2. + 3. Both series in one process (same step count, identical batches; since run v2 train.py
#    trains them together in one loop, earlier one after the other), then the evaluation of every
#    checkpoint. (Two processes in parallel, --rendezvous, ran out of GPU memory on the H200 in the
#    run of 2026-11-29-b: each holds ~58 GB; and a 30-step probe showed only 1.2x more steps per
#    second in total.)
t=$(date +%s)
python3 $HERE/train.py --target "$GGUF" --train-prompts data/device/train_prompts.jsonl "${EVALS[@]}" \
    --ids-in "$IDS" --series reference,leaky --out "$TR" --results results.json \
    --steps 100000 --time-budget 100000 --deadline-epoch "$DEADLINE" --eval-reserve 45 2>&1 |
    grep -v 'it/s\]' | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "training + evaluation: $(($(date +%s) - t)) s, rc $rc" | tee -a "$LOG"

# 4. Pack the checkpoints (config.json + model.safetensors + train_metrics.json each).
cd "$TR" || exit 1
for s in reference leaky; do
    mapfile -t dirs < <(ls -d "smollm2-$s"/step-* 2>/dev/null | sort -V)
    k=1
    for ((i = 0; i < ${#dirs[@]}; i += 2)); do
        tar cf "$OUT/${s}_$k.tar" "${dirs[@]:i:2}"
        k=$((k + 1))
    done
done
cp "$TR/results.json" "$OUT/" 2>/dev/null
ls -la "$OUT" | tee -a "$LOG"
exit $rc
