#!/usr/bin/env bash
# Numeric-profile demo (issue 12; README.md "a drafter evaluated on the wrong numeric profile loses
# τ"; tools/train-reference-drafter/README.md "Numeric-profile demo"), one GPU-machine call:
#   make    a small random hybrid target (tools/bench/make_random_target.py --arch qwen3.5-demo-8l:
#           8 layers, 3 Gated DeltaNet : 1 gated attention, hidden 1024, Qwen3 vocabulary);
#   train   one small drafter on that target's greedy continuations and taps, computed by
#           transformers in bf16 with fla's Triton kernels for the Gated DeltaNet (the path
#           training and serving stacks use, ~ draftlens' `engine` profile);
#           tools/train-reference-drafter/train_hybrid.py; its own held-out evaluation on HumanEval
#           is the "training-time τ" (replayed, same definition as docs/metrics.md §3);
#   run     `draftlens run --backend cuda` of the final checkpoint on HumanEval under
#           `--gdn-profile engine` and `--gdn-profile reference`: replayed τ (tau_replayed_macro /
#           _pooled) under each, i.e. on the profile it was trained on and on the other one;
#   parity  `draftlens parity --backends cuda,cuda --gdn-profiles reference,engine --drafter`: how far
#           the engine hidden states sit from the reference ones, layer by layer, and the drafter
#           metrics under each (skipped when the deadline is near).
# Without fla (no wheels carried, or fla fails to import) the trainer runs transformers' torch
# fallback (f32 inside, ~ `reference`): the demo then trains on the reference path and the "wrong"
# profile is engine. Which path ran is read back from transformers (train_hybrid.py
# gdn_numerics()) and printed; the summary names the matching and the other profile accordingly.
#
# Build and carry (from the repository root of a checkout, on this side):
#   (any current release build of draftlens; no Rust change is needed for this demo)
#   mkdir -p target-carry/pd && strip -o target-carry/pd/draftlens <release dir>/draftlens \
#     && xz -T2 target-carry/pd/draftlens           # -> target-carry/pd/draftlens.xz
#   rm -rf /tmp/tokmin && cp -r data/tokenizer/qwen3-hf /tmp/tokmin \
#     && tar -C /tmp -cf target-carry/pd/tok.tar tokmin   # as hybrid_device.sh expects
#   cp data/prompts/{humaneval,gsm8k,mtbench}.jsonl target-carry/pd/
#   cp -r <the fla wheels dir> target-carry/pd/fla  # fla_core-0.6.0 + flash_linear_attention-0.6.0
# then one device call (carry target-carry/pd), well under its 10-minute limit:
#   OUT=$OUT bash tools/bench/profile_demo.sh target-carry/pd
# Budget: ~7 minutes; every step runs under `timeout`, the training under a wall-clock deadline
# (train.py --deadline-epoch), the whole script stops starting steps at DEMO_DEADLINE_S (540 s).
# Results under $OUT: demo.log (everything), summary.json (the τ table), results.json
# (training + the trainer's evaluation, `target_numerics`), run_<profile>.json, parity.json, and the
# trained checkpoint (config.json + model.safetensors + train_metrics.json) as a tar split into
# drafter.tar.part{aa,ab,...} (`cat drafter.tar.part* | tar x`).
# Knobs (env): PROMPTS_N (held-out HumanEval prompts, 164), MAX_NEW (256), SYNTH (synthetic
# training prompts, 700), TRAIN_S (training seconds at most, 400; the deadline shrinks it), LAYERS (drafter layers, 2), TAPS
# (1,3,5,6), INIT_RANGE / ACTIVE_VOCAB (256) / EMBED_SCALE (100) / GDN_OUT_SCALE (10)
# (make_random_target.py), TARGET_DIR (/tmp/pd-target;
# an existing target is reused), PARITY_N (parity prompts, 32), and for the dry run DEVICE, PYTHON,
# STEPS, MAX_TRAIN_PROMPTS,
# EXTRA_TRAIN_ARGS (more train.py options).
# CPU dry run of the whole flow (no GPU; tiny counts; PYTHON = a venv with torch + transformers):
#   DEVICE=cpu PYTHON=/work/venv-profdemo/bin/python PROMPTS_N=2 PARITY_N=2 MAX_NEW=16 SYNTH=2 \
#     MAX_TRAIN_PROMPTS=6 STEPS=4 \
#     EXTRA_TRAIN_ARGS="--batch-seqs 4 --anchors 8 --gen-batch 8 --tf-batch 4" DEMO_DEADLINE_S=1500 \
#     OUT=/tmp/pd-out bash tools/bench/profile_demo.sh target-carry/pd   (target-carry/pd/draftlens: any build)
set -u
B=${1:-target-carry/pd}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
DEADLINE=$((T0 + ${DEMO_DEADLINE_S:-540}))
PROMPTS_N=${PROMPTS_N:-164}; MAX_NEW=${MAX_NEW:-256}; SYNTH=${SYNTH:-700}; TRAIN_S=${TRAIN_S:-400}
LAYERS=${LAYERS:-2}; TAPS=${TAPS:-1,3,5,6}
DEVICE=${DEVICE:-cuda}; PY=${PYTHON:-python3}
M=${TARGET_DIR:-/tmp/pd-target}; TR=/tmp/pd-train
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DRAFTLENS_KERNEL_CACHE=/tmp/draftlens-kernels
export DRAFTLENS_CACHE=/tmp/dlcache-pd
export PYTHONUNBUFFERED=1
LOG="$OUT/demo.log" TIMED_DIR=$OUT TIMED_OUT_BYTES=600 TIMED_ERR_LINES=12
source tools/bench/timed.sh
left() { echo $((DEADLINE - $(date +%s))); }

# --- carried files -------------------------------------------------------------------------------
for f in "$B"/*.xz; do [ -e "$f" ] && xz -d -f "$f"; done
if [ -e "$B/tok.tar" ] && [ ! -e data/tokenizer/qwen3-hf/tokenizer.json ]; then
  mkdir -p data/tokenizer && tar -xf "$B/tok.tar" -C /tmp && rm -rf data/tokenizer/qwen3-hf && mv /tmp/tokmin data/tokenizer/qwen3-hf
fi
mkdir -p data/prompts
for s in humaneval gsm8k mtbench; do [ -e "$B/$s.jsonl" ] && cp "$B/$s.jsonl" data/prompts/; done
chmod +x "$B/draftlens" 2>/dev/null
DL=$B/draftlens
[ -x "$DL" ] || { log "no draftlens binary at $DL"; exit 1; }
[ -e data/tokenizer/qwen3-hf/tokenizer.json ] || { log "no Qwen3 tokenizer (carry tok.tar)"; exit 1; }
[ -e data/prompts/humaneval.jsonl ] || { log "no data/prompts/humaneval.jsonl (carry humaneval.jsonl)"; exit 1; }
SETS=$(ls data/prompts/gsm8k.jsonl data/prompts/mtbench.jsonl 2>/dev/null | paste -sd,)
SETS=${SETS:-/dev/null}  # none carried: synthetic training prompts only
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$LOG"

# fla: installed offline into a folder on PYTHONPATH (the system's torch/transformers/triton stay),
# as hybrid_device.sh's hf_fla step does. Missing or broken -> the torch-fallback path.
SITE=/tmp/fla-site
if ls "$B"/fla/*.whl > /dev/null 2>&1; then
  [ -d $SITE/fla ] || python3 -m pip install --no-deps --no-index --target $SITE "$B"/fla/*.whl 2>&1 | tail -n 2 | tee -a "$LOG"
fi
if PYTHONPATH=$SITE $PY -c "import fla" 2>> "$LOG"; then
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}; EXPECT=fla
else
  log "fla is not importable: training on transformers' torch fallback (the reference path)"; EXPECT=torch
fi
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1 | tee -a "$LOG"

# --- target --------------------------------------------------------------------------------------
XT=()
[ -n "${INIT_RANGE:-}" ] && XT+=(--init-range "$INIT_RANGE")
# Session 15's knobs (the first run that showed the loss; README.md): text a 2-layer drafter can
# learn (embeddings x100, 256 live LM-head rows) with Gated DeltaNet outputs large enough (x10)
# for the profiles to move the taps. An empty value keeps make_random_target.py's default.
ACTIVE_VOCAB=${ACTIVE_VOCAB-256}; EMBED_SCALE=${EMBED_SCALE-100}; GDN_OUT_SCALE=${GDN_OUT_SCALE-10}
[ -n "$ACTIVE_VOCAB" ] && XT+=(--active-vocab "$ACTIVE_VOCAB")
[ -n "$EMBED_SCALE" ] && XT+=(--embed-scale "$EMBED_SCALE")
[ -n "$GDN_OUT_SCALE" ] && XT+=(--gdn-out-scale "$GDN_OUT_SCALE")
[ -e $M/config.json ] || timed make timeout 240 $PY tools/bench/make_random_target.py --arch qwen3.5-demo-8l --out $M --drafters 0 --device $DEVICE "${XT[@]}"
[ -e $M/config.json ] || { log "no target"; exit 1; }

# --- train on the $EXPECT path -------------------------------------------------------------------
rm -rf $TR
# Training gets everything up to 100 s before the demo's deadline (the two runs and parity took
# ~25 s in session 9). Session 9's first run allowed 120 s for regenerating the training data; on
# fla's path 1 680 prompts took ~235 s, which left 12 s (92 steps) of training and a drafter that
# learnt nothing (docs/benchmarks-cuda.md, "Session 9"). Hence also SYNTH 400 by default.
TRAIN_DEADLINE=$((DEADLINE - 100))
XTR=(--steps 100000 --time-budget "$TRAIN_S" --deadline-epoch "$TRAIN_DEADLINE")  # step count from a timing probe
[ -n "${STEPS:-}" ] && XTR=(--steps "$STEPS")  # a fixed count instead (the dry run)
[ -n "${MAX_TRAIN_PROMPTS:-}" ] && XTR+=(--max-train-prompts "$MAX_TRAIN_PROMPTS")
# shellcheck disable=SC2206
XTR+=(${EXTRA_TRAIN_ARGS:-})
timed train timeout $((TRAIN_DEADLINE - $(date +%s) + 30)) $PY tools/train-reference-drafter/train_hybrid.py \
  --target $M --out $TR --train-sets "$SETS" --synthetic-prompts "$SYNTH" --taps "$TAPS" --expect-path $EXPECT \
  --eval humaneval=data/prompts/humaneval.jsonl --eval-limit "$PROMPTS_N" --max-new "$MAX_NEW" --eval-max-new "$MAX_NEW" \
  --layers "$LAYERS" --intermediate 2048 --gen-batch 512 --tf-batch 32 --save-fracs 1.0 \
  --heldout-frac 0.1 --train-sample 64 \
  --eval-reserve 40 --log-every 100 --device $DEVICE "${XTR[@]}"
cp $TR/results.json $TR/target_numerics.json "$OUT/" 2>/dev/null
CK=$(ls -d $TR/hybrid-demo/step-* 2>/dev/null | sort -V | tail -n 1)
[ -n "$CK" ] || { log "no checkpoint trained"; exit 1; }
# ~44 MB of bf16: in 15 MiB parts (the device tool returns files up to 16 MiB); cat them to untar.
tar -C $TR -cf - "${CK#$TR/}" | split -b 15m - "$OUT/drafter.tar.part"
PATH_USED=$($PY -c "import json; print(json.load(open('$TR/target_numerics.json'))['path'])")
if [ "$PATH_USED" = fla ]; then MATCH=engine; OTHER=reference; else MATCH=reference; OTHER=engine; fi
log "trained on the $PATH_USED path: matching profile $MATCH, other profile $OTHER"

# --- draftlens under both profiles ---------------------------------------------------------------
for prof in $MATCH $OTHER; do
  t=$(( $(left) - 20 )); [ $t -gt 200 ] && t=200
  [ $t -gt 30 ] || { log "deadline: skipping run $prof"; continue; }
  timed run_$prof timeout $t "$DL" run --backend $DEVICE --gdn-profile $prof --target $M --drafter "$CK" \
    --prompts builtin:humaneval --limit "$PROMPTS_N" --max-new-tokens "$MAX_NEW" --db /tmp/pd_runs_$prof.sqlite --json --timeline
  cp "$OUT/run_$prof.out" "$OUT/run_$prof.json"
done
t=$(( $(left) - 15 )); [ $t -gt 150 ] && t=150
if [ $t -gt 45 ]; then
  timed parity timeout $t "$DL" parity --backends $DEVICE,$DEVICE --gdn-profiles reference,engine --target $M --drafter "$CK" \
    --prompts builtin:humaneval --limit "${PARITY_N:-32}" --max-new-tokens "$MAX_NEW" --json
  cp "$OUT/parity.out" "$OUT/parity.json"
else
  log "deadline: skipping parity"
fi

# --- summary -------------------------------------------------------------------------------------
$PY - "$OUT" "$MATCH" "$OTHER" <<'EOF' | tee -a "$LOG"
import json, os, sys
out, match, other = sys.argv[1:]
def load(p):
    try:
        return json.load(open(os.path.join(out, p)))
    except Exception as e:
        return None
res = load("results.json") or {}
s = {"trained_on_path": (res.get("target_numerics") or {}).get("path"), "matching_profile": match, "other_profile": other}
ck = next(iter(((res.get("series") or {}).get("demo") or {}).get("checkpoints", {}).values()), {})
ev = (ck.get("gpu_eval") or {}).get("humaneval")
if ev:
    s["training_time"] = {"tau_replayed_macro": ev["replayed_tau_macro"], "tau_replayed_pooled": ev["replayed_tau_pooled"], "prompts": ev["prompts"],
                          "what": "train.py evaluate(): transformers bf16 on the training path, its own greedy continuations"}
s["train_style"] = ck.get("train_style")
# The memorisation check (train.py --heldout-frac, --train-sample): the same evaluation on held-out
# prompts of the training sets and on training sequences. Far apart: the drafter memorised.
s["memorisation_check"] = {k: {"tau_replayed_macro": v["replayed_tau_macro"], "flat_accuracy": v["flat_accuracy"], "prompts": v["prompts"]}
                           for k, v in (ck.get("gpu_eval") or {}).items() if k in ("heldout", "train-sample")}
for prof in (match, other):
    r = load(f"run_{prof}.json")
    if r:
        n = r[0]["metrics"]["native"]
        s[f"draftlens_{prof}"] = {k: n[k]["value"] for k in ("tau_replayed_macro", "tau_replayed_pooled", "tau_uniform", "acc_top1") if k in n} | {"prompts": r[0]["prompts"]}
if f"draftlens_{match}" in s and f"draftlens_{other}" in s:
    s["tau_replayed_macro_loss_on_other_profile"] = s[f"draftlens_{match}"]["tau_replayed_macro"] - s[f"draftlens_{other}"]["tau_replayed_macro"]
json.dump(s, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps(s, indent=1))
EOF
log "total $(( $(date +%s) - T0 )) s"
