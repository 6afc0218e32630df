#!/usr/bin/env bash
# draftlens's own measurement of the reference drafters (docs/reference-drafters.md, "Measured by
# draftlens") and the SmolLM2 end-to-end GPU vs CPU timing (docs/benchmarks.md), in one device call.
# Run from the repository root on the GPU machine, right after run_on_gpu.sh (same machine):
#
#   bash tools/train-reference-drafter/eval_on_gpu.sh DRAFTLENS GGUF CKPTS OUTDIR
#
# DRAFTLENS  the release binary built on the build machine (cargo build --release -p draftlens-cli)
# GGUF       SmolLM2-135M-Instruct.Q4_1.gguf
# CKPTS      folder holding smollm2-reference/ and smollm2-leaky/ (checkpoints step-N inside)
# OUTDIR     receives runs.json (every stored run with its metrics), timing.txt and the logs
# Env: BACKEND (cuda), LIMIT (all prompts), E2E_LIMIT (16): smaller values for a dry run on a CPU.
set -uo pipefail
BIN=$1
GGUF=$2
CK=$3
OUT=$4
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DRAFTLENS_KERNEL_CACHE=/tmp/draftlens-kernels
BE=${BACKEND:-cuda}
LIM=()
[[ -n ${LIMIT:-} ]] && LIM=(--limit "$LIMIT")
DB=/tmp/draftlens-eval.sqlite
rm -f "$DB"*
T=$OUT/timing.txt
nproc >"$T"
# seconds of one command, appended to timing.txt with a label
timed() {
    local label=$1
    shift
    local t0 ms
    t0=$(date +%s%N)
    "$@" >>"$OUT/eval.log" 2>&1
    local rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    echo "$label rc=$rc $((ms / 1000)).$(printf %03d $((ms % 1000))) s" | tee -a "$T"
}

# 1. End to end on SmolLM2 (generate + extract + draft, cold caches): the GPU vs this machine's CPU.
FINAL=$(ls -d "$CK"/smollm2-reference/step-* | sort -V | tail -1)
for be in $(echo "$BE cpu" | tr ' ' '\n' | sort -u); do
    timed "e2e $be humaneval limit ${E2E_LIMIT:-16} max-new 128" timeout 200 "$BIN" --cache-dir /tmp/e2e-$be run \
        --backend $be --target "$GGUF" --drafter "$FINAL" --prompts builtin:humaneval --limit "${E2E_LIMIT:-16}" \
        --max-new-tokens 128 --db /tmp/e2e-$be.sqlite
done

# 2. Every checkpoint, three held-out sets, 256 new tokens (the trainer's setting), deployment mode;
#    the leaky series also in train-style mode with the mask it was trained with.
C=/tmp/eval-cache
for set in humaneval gsm8k mtbench; do
    timed "reference $set" timeout 150 "$BIN" --cache-dir $C run --backend "$BE" --target "$GGUF" \
        --drafter "$CK/smollm2-reference" --prompts builtin:$set --max-new-tokens 256 --top-k 4 "${LIM[@]}" --db "$DB"
    timed "leaky $set" timeout 150 "$BIN" --cache-dir $C run --backend "$BE" --target "$GGUF" \
        --drafter "$CK/smollm2-leaky" --prompts builtin:$set --max-new-tokens 256 --top-k 4 "${LIM[@]}" --db "$DB"
    timed "leaky $set train-style inclusive" timeout 150 "$BIN" --cache-dir $C run --backend "$BE" \
        --target "$GGUF" --drafter "$CK/smollm2-leaky" --prompts builtin:$set --max-new-tokens 256 \
        --top-k 4 --mode train-style --mask inclusive "${LIM[@]}" --db "$DB"
done
"$BIN" --json runs ls --db "$DB" >"$OUT/runs_ls.json" 2>>"$OUT/eval.log"
python3 - "$BIN" "$DB" "$OUT/runs.json" <<'EOF'
import json, subprocess, sys
bin_, db, out = sys.argv[1:]
runs = json.load(open(out.replace("runs.json", "runs_ls.json")))
rows = runs.get("runs", runs) if isinstance(runs, dict) else runs
full = []
for r in rows:
    rid = str(r.get("id"))
    p = subprocess.run([bin_, "--json", "runs", "show", rid, "--db", db], capture_output=True, text=True)
    full.append(json.loads(p.stdout) if p.returncode == 0 else {"id": rid, "error": p.stderr[-2000:]})
json.dump(full, open(out, "w"), indent=1)
print(f"{len(full)} runs written to {out}")
EOF

# 3. Backend parity on the final reference checkpoint (hidden states, greedy agreement, drafter metrics).
t0=$(date +%s)
timeout 120 "$BIN" --json parity --target "$GGUF" --drafter "$FINAL" --backends "cpu,$BE" \
    --prompts builtin:humaneval --limit 4 >"$OUT/parity.json" 2>>"$OUT/eval.log"
echo "parity cpu,$BE rc=$? $(($(date +%s) - t0)) s" | tee -a "$T"
grep -v '^\s*$' "$OUT/eval.log" | tail -5
