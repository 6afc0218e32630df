#!/usr/bin/env bash
# Session 20 on the GPU machine, one call: the CUDA paths this session changed, through the product's
# own commands on random-weight targets built there (tools/bench/make_random_target.py).
#   1. mixture-of-experts (issue 34): a Qwen3-30B-A3B-shaped target (8 of 48 layers, 128 experts,
#      top-8): `inspect`, `parity --backends cpu,cuda` (per-layer hidden-state error and greedy
#      agreement of CUDA against the f32 CPU reference), and `run --backend cuda` with a DFlash drafter;
#   2. packed sequence starts (issue 37: `SeqStarts` in every packed backend op): `parity` on the
#      hybrid demo target (Gated DeltaNet packed prefill, varlen attention) and `run` on a
#      Qwen3-8B-shaped target;
#   3. `live --backend cuda` (issue 39): divergences reported as data, exit status 0 without --strict.
# From the repository root, with the release binary and the Qwen3 tokenizer carried in B:
#   B=target-carry/s20 bash docs/bench-logs/s20-2026-12-06/scripts/call1.sh
set -u
B=${B:-target-carry/s20}
source tools/bench/device_env.sh
export DRAFTLENS_DATA=/tmp/data DRAFTLENS_CACHE=/tmp/cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $O/gpu.txt
mk() { local n=$1; shift; /usr/bin/time -f "%e s" python3 tools/bench/make_random_target.py "$@" > $O/make-$n.log 2>&1 || echo "make $* failed"; tail -2 $O/make-$n.log; }
mk moe --out /tmp/moe --arch qwen3-30b-a3b-8l --drafters 1 --taps 1,3,5,6
mk hy --out /tmp/hy --arch qwen3.5-demo-8l --drafters 0
mk q8b --out /tmp/q8b --arch qwen3-8b --drafters 1
step() { local n=$1; shift; /usr/bin/time -f "%e s %M KB" timeout 240 $B/draftlens "$@" > $O/$n.out 2> $O/$n.err; echo "== $n rc=$? $(tail -1 $O/$n.err)"; }
step inspect-moe inspect /tmp/moe
head -30 $O/inspect-moe.out
step parity-moe parity --target /tmp/moe --backends cpu,cuda --limit 4 --max-new-tokens 32
tail -25 $O/parity-moe.out
step run-moe --json run --backend cuda --target /tmp/moe --drafter /tmp/moe-drafters --prompts builtin:humaneval --limit 32 --db /tmp/moe.sqlite
python3 -c "import json;d=json.load(open('$O/run-moe.out'));m=d[0]['metrics']['native'];print('moe run tau_replayed_macro',m['tau_replayed_macro']['value'],'prompts',m['tau_replayed_macro']['count'])" 2>&1
step parity-hy parity --target /tmp/hy --backends cpu,cuda --limit 4 --max-new-tokens 32
tail -25 $O/parity-hy.out
step run-q8b --json run --backend cuda --target /tmp/q8b --drafter /tmp/q8b-drafters --prompts builtin:humaneval --limit 64 --db /tmp/q8b.sqlite
step live-q8b --json live --backend cuda --target /tmp/q8b --drafter /tmp/q8b-drafters/step-0 --prompts builtin:humaneval --limit 8 --max-new-tokens 64
tail -3 $O/live-q8b.err
python3 -c "import json;r=json.load(open('$O/live-q8b.out'));print('live rows',len(r),'diverged',sum(1 for x in r if x.get('divergence')));print([x.get('divergence') for x in r][:3])" 2>&1
tar czf $OUT/s20-call1.tgz -C $O .
