#!/usr/bin/env bash
# Run v3 (issue 39 item 4): run v2's recipe (3-layer KD drafters, both series in one loop) trained
# ~3x longer on more generated data, split over two device calls of at most 10 minutes, which
# must follow each other within the machine's 30 s warm period (everything in between is in /tmp):
#
#   phase 1: the target loads from the GGUF (sha256 checked) and is saved as an HF folder for
#            phase 2; the first run's token ids are reused and the target writes greedy responses
#            to the second prompt set for EXTRA_GEN_S seconds; taps; a 30-step probe sizes the step
#            count for this call's training time plus LATER_S more; training stops at this call's
#            deadline and saves its whole state (train.py --state-out)
#   phase 2: the HF folder loads in seconds; the same ids (the first run's + phase 1's extra ones);
#            taps; training resumes (train.py --resume) to the planned step count; the trainer's
#            evaluation of every checkpoint; packing; the first parts come back
#   send:    the parts left, and the extra token ids
#
#   bash tools/train-reference-drafter/run_v3_on_gpu.sh phase1 GGUF OUTDIR [DEADLINE_S]
#   bash tools/train-reference-drafter/run_v3_on_gpu.sh phase2 OUTDIR [DEADLINE_S]
#   bash tools/train-reference-drafter/run_v3_on_gpu.sh send OUTDIR
#
# Environment (defaults in brackets): EXTRA_GEN_S [200], LATER_S [430], LAYERS [3], INTERMEDIATE [1024],
# KD [0.5], LR [1e-3], GEN_BATCH [2048], GEN_TOKENS [1000000], TF_BATCH [128], TRAIN [/tmp/draftlens-train].
# Needs python3 with torch + transformers + accelerate, and gguf importable in phase 1.
set -uo pipefail
HERE=tools/train-reference-drafter
TR=${TRAIN:-/tmp/draftlens-train}
IDS=$HERE/runs/2026-11-29-b/ids.json.gz
EXTRA=data/device-v2/train_prompts_v2.jsonl.gz
LOG=$TR/log.txt # one log for all calls, copied into OUTDIR by each
phase=$1
shift

if [[ $phase == send ]]; then
    mkdir -p "$1"
    python3 $HERE/pack_out.py send "$TR/pack" "$1" --extra "$TR/ids_extra.json.gz" "$LOG"
    exit $?
fi

START=$(date +%s)
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
stage() { echo "[stage $(($(date +%s) - START)) s] $*" | tee -a "$LOG"; }
# The arguments both phases pass alike (the data and the recipe: a resumed run must see the same).
common=(--device cuda --train-prompts "$EXTRA" --ids-in "$IDS"
    --eval humaneval=crates/engine/builtin-prompts/humaneval.jsonl
    --eval gsm8k=crates/engine/builtin-prompts/gsm8k.jsonl
    --eval mtbench=crates/engine/builtin-prompts/mtbench.jsonl
    --extra-prompts "$EXTRA" --tf-batch "${TF_BATCH:-128}"
    --series reference,leaky --layers "${LAYERS:-3}" --intermediate "${INTERMEDIATE:-1024}"
    --kd-weight "${KD:-0.5}" --lr "${LR:-1e-3}" --train-sample 64 --steps 100000
    --out "$TR" --results results.json)

if [[ $phase == phase1 ]]; then
    GGUF=$1
    OUT=$2
    DEADLINE=$((START + ${3:-570}))
    rm -rf "$TR" && mkdir -p "$TR" "$OUT"
    stage "phase 1 start: $(date -u +%FT%TZ), deadline in $((DEADLINE - START)) s"
    echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $GGUF" | sha256sum -c - >>"$LOG" 2>&1 || {
        stage "$GGUF: sha256 mismatch (the GGUF parts were not all there, or not in order)"
        cp "$LOG" "$OUT/"
        exit 1
    }
    sha256sum "$IDS" "$EXTRA" >>"$LOG"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$LOG" 2>&1
    python3 -c 'import importlib.metadata as m, torch, transformers, gguf; print("torch", torch.__version__, "transformers", transformers.__version__, "gguf", m.version("gguf"))' >>"$LOG" 2>&1
    python3 $HERE/train.py --target "$GGUF" "${common[@]}" --export-target "$TR/target-hf" \
        --extra-gen-seconds "${EXTRA_GEN_S:-200}" --reserve-after-gen 150 \
        --gen-batch "${GEN_BATCH:-2048}" --gen-round "${GEN_BATCH:-2048}" --gen-tokens "${GEN_TOKENS:-1000000}" \
        --ids-extra-out "$TR/ids_extra.json.gz" --deadline-epoch "$DEADLINE" --eval-reserve 20 \
        --state-out "$TR/state.pt" --later-seconds "${LATER_S:-430}" 2>&1 | grep --line-buffered -v 'it/s\]' | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    stage "phase 1: train.py exited $rc"
    # the generated ids come back too: if the machine is gone before phase 2 (session 21: a 30 s
    # gap was missed), a later run reuses them (--ids-in) instead of generating again
    cp "$LOG" "$TR/results.json" "$TR/ids_extra.json.gz" "$OUT/" 2>/dev/null
    exit $rc
fi

if [[ $phase == phase2 ]]; then
    OUT=$1
    DEADLINE=$((START + ${2:-560}))
    mkdir -p "$OUT"
    stage "phase 2 start: $(date -u +%FT%TZ), deadline in $((DEADLINE - START)) s"
    for f in "$TR/state.pt" "$TR/ids_extra.json.gz" "$TR/target-hf/config.json"; do
        [[ -f $f ]] || { stage "missing $f: phase 1 did not finish on this machine (or the machine was given back)"; cp "$LOG" "$OUT/" 2>/dev/null; exit 1; }
    done
    mv "$TR/results.json" "$TR/results_phase1.json"
    python3 $HERE/train.py --target "$TR/target-hf" "${common[@]}" --ids-in "$TR/ids_extra.json.gz" \
        --resume "$TR/state.pt" --deadline-epoch "$DEADLINE" --eval-reserve 60 2>&1 |
        grep --line-buffered -v 'it/s\]' | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    stage "phase 2: train.py exited $rc"
    python3 $HERE/summarise_run.py "$TR/results.json" "$LOG" "$START" run_v3 2>&1 | tee -a "$LOG"
    stage "packing"
    python3 $HERE/pack_out.py pack "$TR" "$TR/pack" 2>&1 | tee -a "$LOG"
    stage "done (the parts that do not fit this call: run_v3_on_gpu.sh send OUTDIR in the next one)"
    python3 $HERE/pack_out.py send "$TR/pack" "$OUT" --extra "$LOG" "$TR/results.json" "$TR/results_phase1.json" 2>&1 | tee -a "$LOG"
    cp "$LOG" "$OUT/"
    exit $rc
fi
echo "usage: run_v3_on_gpu.sh phase1 GGUF OUTDIR [DEADLINE_S] | phase2 OUTDIR [DEADLINE_S] | send OUTDIR" >&2
exit 2
