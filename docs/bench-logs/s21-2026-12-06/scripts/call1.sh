#!/usr/bin/env bash
# Session 21 on the GPU machine, one call: the new drafter families on CUDA against the f32 CPU
# reference, through the product's own commands on random-weight targets built there
# (tools/bench/make_random_target.py --drafter-family / --mtp):
#   1. a tiny Qwen3 target (4 layers, hidden 256, Qwen3 vocabulary) with an EAGLE-3, a DFlash2 and a
#      DFlash drafter, and tiny Qwen3.5 hybrids (dense and MoE) with their native MTP head: for each
#      family `lint`, then `run --backend cpu` and `run --backend cuda` on 8 HumanEval prompts
#      (32 new tokens) into one database, both τ (tau_replayed_macro), `compare` of the pair and
#      the drafts' agreement (draft_stats.py), then `live --backend cuda --baseline` on 4 prompts
#      (session 21's one loop for every family: τ, divergences, speed-up);
#   2. a Qwen3-8B-shaped target with a DFlash drafter: `run --backend cuda`, then
#      `live --backend cuda --baseline --store RUN` on the same 8 prompts and `compare --json`:
#      the estimated against the measured speed-up (docs/verdict.md).
# Everything is logged under $O and tarred into $OUT/s21-call1.tgz. From the repository root, with
# the release binary and the Qwen3 tokenizer carried in B:
#   B=target-carry/s21 bash docs/bench-logs/s21-2026-12-06/scripts/call1.sh
# A CPU-only dry run of the logic (no GPU): DEV=cpu MK_DEVICE=cpu Q8B_ARCH=qwen3-tiny PY=<python with
# torch> O=/tmp/o OUT=/tmp/out B=<folder with draftlens> bash .../call1.sh
set -u
B=${B:-target-carry/s21}
DEV=${DEV:-cuda}               # the backend checked against the CPU (cpu for a dry run)
MK_DEVICE=${MK_DEVICE:-cuda}   # where make_random_target.py draws the weights
Q8B_ARCH=${Q8B_ARCH:-qwen3-8b}
PY=${PY:-python3}
S=docs/bench-logs/s21-2026-12-06/scripts
source tools/bench/device_env.sh
export DRAFTLENS_DATA=/tmp/data DRAFTLENS_CACHE=/tmp/cache
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no GPU"; } 2>&1 | tee $O/gpu.txt
mk() { local n=$1; shift; /usr/bin/time -f "%e s" $PY tools/bench/make_random_target.py --device $MK_DEVICE "$@" > $O/make-$n.log 2>&1 || echo "make $* failed"; grep -E "^#|s$" $O/make-$n.log | tail -5; }
step() { local n=$1 t=$2; shift 2; /usr/bin/time -f "%e s %M KB" timeout $t $B/draftlens "$@" > $O/$n.out 2> $O/$n.err; echo "== $n rc=$? $(tail -1 $O/$n.err)"; }
# run_id NAME: the id of the run stored by step NAME (`run --json`), empty if it failed.
run_id() { $PY -c "import json;print(json.load(open('$O/$1.out'))[0]['run_id'])" 2>/dev/null; }
tau() { $PY -c "import json;d=json.load(open('$O/$1.out'))[0];m=d['metrics']['native']['tau_replayed_macro'];print('$1 tau_replayed_macro',m['value'],'prompts',m['count'],'records_cached',d['timings'].get('records_cached'))" 2>&1; }
mk q3t --out /tmp/q3t --arch qwen3-tiny --drafters 1 --drafter-family eagle3,dflash2,dflash
mk q35t --out /tmp/q35t --arch qwen3.5-tiny --drafters 0 --mtp
mk q35m --out /tmp/q35m --arch qwen3.5-moe-tiny --drafters 0 --mtp
DB=/tmp/families.sqlite; rm -f $DB
pair() {  # pair NAME TARGET DRAFTER: lint, run on the CPU and on $DEV, τ of both, compare, drafts
  local n=$1 t=$2 d=$3
  [ "${d#target:}" = "$d" ] && step lint-$n 60 lint --target $t --drafter $d && cat $O/lint-$n.out
  # ref: the f32 CPU reference; dev: the backend under test (named apart so that a dry run with
  # DEV=cpu keeps both).
  local side be
  for side in ref dev; do
    be=cpu; [ $side = dev ] && be=$DEV
    step run-$n-$side 150 --json run --backend $be --target $t --drafter $d --prompts builtin:humaneval --limit 8 --max-new-tokens 32 --db $DB
    tau run-$n-$side
  done
  local a b; a=$(run_id run-$n-ref); b=$(run_id run-$n-dev)
  if [ -n "$a" ] && [ -n "$b" ]; then
    step compare-$n 60 compare $a $b --db $DB; cat $O/compare-$n.out
    $PY $S/draft_stats.py $DB $a:$b 2>&1 | grep -E "^runs|^run ($a|$b) "
  fi
  # live decoding on the backend under test (one loop for every family): τ, divergences from
  # plain greedy decoding (reported as data, docs/live.md), and the wall-clock speed-up
  step live-$n 120 --json live --backend $DEV --target $t --drafter $d --prompts builtin:humaneval --limit 4 --max-new-tokens 32 --baseline
  $PY -c "import json;r=json.load(open('$O/live-$n.out'));rows=r['rows'] if isinstance(r,dict) else r;print('live $n tau',[x.get('tau') for x in rows],'diverged',sum(1 for x in rows if x.get('divergence')),'of',len(rows),'speed',json.dumps(r.get('speed')) if isinstance(r,dict) else None)" 2>&1
}
pair eagle3 /tmp/q3t /tmp/q3t-eagle3/step-0
pair dflash2 /tmp/q3t /tmp/q3t-dflash2/step-0
pair dflash /tmp/q3t /tmp/q3t-drafters/step-0
pair mtp /tmp/q35t target:mtp
pair mtp-moe /tmp/q35m target:mtp
echo "== families done at $(( $(date +%s) - T0 )) s"
rm -rf /tmp/q3t* /tmp/q35t /tmp/q35m
mk q8b --out /tmp/q8b --arch $Q8B_ARCH --drafters 1
Q8DB=/tmp/q8b.sqlite; rm -f $Q8DB
step run-q8b 240 --json run --backend $DEV --target /tmp/q8b --drafter /tmp/q8b-drafters/step-0 --prompts builtin:humaneval --limit 8 --max-new-tokens 64 --db $Q8DB
tau run-q8b
R=$(run_id run-q8b)
if [ -n "$R" ]; then
  step live-q8b 240 --json live --backend $DEV --target /tmp/q8b --drafter /tmp/q8b-drafters/step-0 --prompts builtin:humaneval --limit 8 --max-new-tokens 64 --baseline --store $R --db $Q8DB
  $PY -c "import json;r=json.load(open('$O/live-q8b.out'));print('live speed',json.dumps(r.get('speed')),'stored_with_run',r.get('stored_with_run'));print('diverged',sum(1 for x in r['rows'] if x.get('divergence')),'of',len(r['rows']))" 2>&1
  step compare-q8b 60 --json compare $R --db $Q8DB
  $PY -c "
import json;v=json.load(open('$O/compare-q8b.out'))['verdict']
for r in v['rows']: print('q8b run',r['run'],'tau',r['tau'],'estimated',r['estimated'],'measured',r['measured'],'measured_ci',r['measured_ci'],'estimate_error_pct',r['estimate_error_pct'],'costs',r['costs'],'missing',r['missing'])" 2>&1
fi
echo "== all done at $(( $(date +%s) - T0 )) s"
tar czf $OUT/s21-call1.tgz -C $O .
