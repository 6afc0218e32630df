#!/usr/bin/env bash
# The whole GPU job in one command (goldens + training data + both drafter series + evaluation),
# sized to finish inside one 10-minute device call. Run from the repository root on the GPU machine:
#
#   bash tools/train-reference-drafter/run_on_gpu.sh GGUF OUTDIR [DEADLINE_SECONDS]
#
# GGUF     SmolLM2-135M-Instruct.Q4_1.gguf (sha256 checked here)
# OUTDIR   receives: log.txt, goldens_smollm2.tar (tests/fixtures/golden/smollm2 + tokenizer json),
#          results.json, and the checkpoints packed as <series>_<k>.tar (<= 2 checkpoints per tar,
#          so that every file stays under the device tool's 16 MiB limit)
# DEADLINE_SECONDS  wall-clock seconds from now by which training and evaluation must be done
#          (default 560); the trainer lowers its step count to fit and records the count it used.
#
# Needs: python3 with torch 2.11 + transformers 5.17 (+ accelerate), and the gguf package importable
# (the device machine has no gguf: pip install --no-index --target /tmp/site gguf-0.19.0-*.whl first).
set -uo pipefail
GGUF=$1
OUT=$2
DEADLINE=$(($(date +%s) + ${3:-560}))
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
LOG=$OUT/log.txt
G=/tmp/draftlens-goldens
HF=/tmp/draftlens-smollm2-hf
TR=/tmp/draftlens-train

echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $GGUF" | sha256sum -c - >>"$LOG" 2>&1 || {
    echo "run_on_gpu.sh: $GGUF: sha256 mismatch" | tee -a "$LOG"
    exit 1
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$LOG" 2>&1
python3 -c 'import torch, transformers, gguf; print("torch", torch.__version__, "transformers", transformers.__version__)' >>"$LOG" 2>&1

# 1. SmolLM2 goldens (+ the dequantised model as an HF folder for the trainer).
rm -rf "$G" && mkdir -p "$G/golden"
t=$(date +%s)
python3 tools/golden/make_goldens.py --only smollm2 --gguf "$GGUF" --out "$G/golden" \
    --tokenizer-out "$G/tokenizer/smollm2_hf.json" --export-hf "$HF" 2>&1 | grep -v 'it/s\]' | tee -a "$LOG"
echo "goldens: $(($(date +%s) - t)) s" | tee -a "$LOG"
(cd "$G" && tar cf "$OUT/goldens_smollm2.tar" .)

# 2. Drafters: data regeneration, two series, evaluation on held-out sets.
TARGET=$HF
[[ -f $HF/model.safetensors ]] || TARGET=$GGUF
t=$(date +%s)
python3 tools/train-reference-drafter/train.py --target "$TARGET" \
    --train-prompts data/device/train_prompts.jsonl \
    --eval humaneval=data/prompts/humaneval.jsonl --eval gsm8k=data/prompts/gsm8k.jsonl \
    --eval mtbench=data/prompts/mtbench.jsonl \
    --out "$TR" --gen-batch 512 --steps 6000 --time-budget 170 --deadline-epoch "$DEADLINE" 2>&1 | tee -a "$LOG"
echo "train.py: $(($(date +%s) - t)) s" | tee -a "$LOG"
cp "$TR/results.json" "$OUT/" 2>/dev/null

# 3. Pack the checkpoints (config.json + model.safetensors + train_metrics.json each).
cd "$TR" || exit 1
for s in reference leaky; do
    mapfile -t dirs < <(ls -d "smollm2-$s"/step-* 2>/dev/null | sort -t- -k3 -n)
    k=1
    for ((i = 0; i < ${#dirs[@]}; i += 2)); do
        tar cf "$OUT/${s}_$k.tar" "${dirs[@]:i:2}"
        k=$((k + 1))
    done
done
ls -la "$OUT" | tee -a "$LOG"
