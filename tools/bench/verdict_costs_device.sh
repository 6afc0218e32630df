#!/usr/bin/env bash
# The verdict's two estimates on CUDA (docs/verdict.md §9), in one device call: for each target,
#   1. `run --backend cuda` (the replayed τ),
#   2. `live --backend cuda --baseline --store RUN` (the measured speed-up, and the costs taken
#      from live decoding's own rounds),
#   3. `bench-costs --backend cuda --store RUN` (the costs measured apart from live decoding:
#      greedy decode steps, verify passes over 1, B/2 and B tokens, draft rounds, at 3 contexts
#      of every prompt, medians of $REPS repetitions after a warm-up),
#   4. `compare --json RUN`: the estimate from live costs, the estimate from bench-costs and the
#      measured speed-up, with both distances, printed as one line per target.
# Targets: a random Qwen3-8B-shaped target with a random 5-layer DFlash drafter built here
# (tools/bench/make_random_target.py, as session 21's call; τ ≈ 1 for a random drafter), and the
# SmolLM2 GGUF with the reference drafter where both are present (τ ≈ 1.6; set SMOL_TARGET /
# SMOL_DRAFTER, or carry models/SmolLM2-135M-Instruct.Q4_1.gguf).
# Everything is logged under $O and tarred into $OUT/verdict-costs.tgz. From the repository root,
# with the release binary and the Qwen3 tokenizer carried in B (as the other device scripts):
#   B=target-carry/vc bash tools/bench/verdict_costs_device.sh
# A CPU-only dry run of the logic (no GPU): DEV=cpu MK_DEVICE=cpu Q8B_ARCH=qwen3-tiny PY=<python
# with torch> LIMIT=2 MAX_NEW=12 REPS=2 W=/tmp/vc O=/tmp/vc/o OUT=/tmp/vc/out B=<folder with draftlens> bash …
set -u
B=${B:-target-carry/vc}
DEV=${DEV:-cuda}               # the backend measured
MK_DEVICE=${MK_DEVICE:-cuda}   # where make_random_target.py draws the weights
Q8B_ARCH=${Q8B_ARCH:-qwen3-8b}
PY=${PY:-python3}
LIMIT=${LIMIT:-8}              # HumanEval prompts
MAX_NEW=${MAX_NEW:-64}         # new tokens a prompt
REPS=${REPS:-10}               # timed repetitions at each context (bench-costs)
SMOL_TARGET=${SMOL_TARGET:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
SMOL_DRAFTER=${SMOL_DRAFTER:-drafters/smollm2-reference/step-2581}
OUT=${OUT:-/tmp/out}
W=${W:-/tmp}                   # where the random target and the databases go
source tools/bench/device_env.sh
export DRAFTLENS_DATA=$W/data DRAFTLENS_CACHE=$W/cache
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader || echo "no GPU"; } 2>&1 | tee $O/gpu.txt
step() { local n=$1 t=$2; shift 2; /usr/bin/time -f "%e s %M KB" timeout $t $B/draftlens "$@" > $O/$n.out 2> $O/$n.err; echo "== $n rc=$? $(tail -1 $O/$n.err)"; }
run_id() { $PY -c "import json;print(json.load(open('$O/$1.out'))[0]['run_id'])" 2>/dev/null; }

# verdict NAME TARGET DRAFTER: the four steps on one target, into its own database.
verdict() {
  local n=$1 t=$2 d=$3 db=$W/$1.sqlite
  rm -f $db
  local common=(--backend $DEV --target $t --drafter $d --prompts builtin:humaneval --limit $LIMIT --max-new-tokens $MAX_NEW --db $db)
  step run-$n 300 --json run "${common[@]}"
  local r; r=$(run_id run-$n)
  [ -n "$r" ] || { echo "$n: run failed"; tail -5 $O/run-$n.err; return; }
  step live-$n 400 --json live "${common[@]}" --baseline --store $r
  step bench-$n 400 --json bench-costs "${common[@]}" --reps $REPS --store $r
  $PY - $O/bench-$n.out <<'PYEOF' 2>&1
import json, sys
b = json.load(open(sys.argv[1])); s = b["summary"]
ms = lambda x: f"{x['median']*1e3:.3f} ms [p25 {x['p25']*1e3:.3f}, p75 {x['p75']*1e3:.3f}, n {x['n']}]"
print("bench-costs", b["backend"], b["dtype"], "B", b["block_size"], "contexts", s["contexts"], "cache lengths", s["context_len"])
print("  t_decode", ms(s["t_decode"])); print("  t_draft_round", ms(s["t_draft_round"]))
for v in s["t_verify"]: print(f"  t_verify({v['tokens']})", ms(v["spread"]))
PYEOF
  step compare-$n 60 --json compare $r --db $db
  $PY - $O/compare-$n.out $n <<'PYEOF' 2>&1
import json, sys
v = json.load(open(sys.argv[1]))["verdict"]; r = v["rows"][0]
ms = lambda c: None if c is None else {k: round(x * 1e3, 3) for k, x in c.items()}
pct = lambda x: "—" if x is None else f"{x:+.2f} %"
print(f"{sys.argv[2]}: tau {r['tau']} tau_live {r['tau_live']} | estimated (live costs) {r['estimated']} ({pct(r['estimate_error_pct'])}) | "
      f"estimated (bench-costs) {r['estimated_bench']} ({pct(r['estimate_bench_error_pct'])}) | measured {r['measured']} {r['measured_ci']}")
print("  live costs ms", ms(r["costs"]), "| bench-costs ms", ms(r["bench_costs"]))
PYEOF
}

mkdir -p $W
$PY tools/bench/make_random_target.py --device $MK_DEVICE --out $W/q8b --arch $Q8B_ARCH --drafters 1 > $O/make-q8b.log 2>&1 || echo "make_random_target failed"
tail -2 $O/make-q8b.log
verdict q8b $W/q8b $W/q8b-drafters/step-0
if [ -f "$SMOL_TARGET" ] && [ -d "$SMOL_DRAFTER" ]; then
  verdict smollm2 "$SMOL_TARGET" "$SMOL_DRAFTER"
else
  echo "smollm2: skipped ($SMOL_TARGET or $SMOL_DRAFTER missing)"
fi
echo "== all done at $(( $(date +%s) - T0 )) s"
mkdir -p $OUT && tar czf $OUT/verdict-costs.tgz -C $O .
