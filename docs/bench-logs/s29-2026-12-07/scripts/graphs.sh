#!/usr/bin/env bash
# Session 29 (issue 38 item 1): decode steps recorded as CUDA graphs against the same steps issued
# launch by launch (DRAFTLENS_STEP_GRAPHS=off), one binary, one machine, one call: the GPU tests of
# $TESTS first (NAME or NAME:FILTER), then `generate` at batch 1 ($B1_PROMPTS prompts × 127 steps)
# and batch 64 (164 prompts) on a random target of $ARCH (gpt-oss-20b-8l or qwen3-8b), each
# variant from a copy of the same warmed cache (identity remembered, GEMMs tuned, no continuation
# of that length decoded yet), and the device copy rate. VARIANTS names the two settings compared
# (default `DRAFTLENS_STEP_GRAPHS=off DRAFTLENS_STEP_GRAPHS=on`). With TRACE=1, also the per-kernel
# timeline (tools/bench/kernel_trace.sh) of 2 prompts at batch 1 with graphs on and off. Logs in
# $OUT/logs-$ARCH.tgz.
#   B=target-carry/s29a ARCH=gpt-oss-20b-8l B1_PROMPTS=32 TESTS="cuda_step_graph cuda_moe" \
#     bash docs/bench-logs/s29-2026-12-07/scripts/graphs.sh
set -u
B=${B:-target-carry/s29a}
ARCH=${ARCH:-gpt-oss-20b-8l}
T0=$(date +%s)
OUTDIR=$OUT
O=$OUTDIR/o-$ARCH
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUTDIR/gpu.txt
mkdir -p /work && for d in /work/main /work/relsrc; do [ -e $d ] || ln -sfn "$PWD" $d; done
for t in ${TESTS:-}; do
  bin=${t%%:*}; filter=${t#*:}; [ "$filter" = "$t" ] && filter=
  [ -e $B/$bin ] || continue
  s=$(date +%s); timeout ${TEST_LIMIT:-150} $B/$bin $filter --test-threads 1 --nocapture > $O/$bin.txt 2>&1
  echo "== $t rc=$? $(( $(date +%s) - s )) s"; grep -E "test result|FAILED|panicked|recorded, " $O/$bin.txt | head -8
done
python3 tools/bench/make_random_target.py --out /tmp/tg --arch $ARCH --drafters 0 > $O/make.log 2>&1; tail -1 $O/make.log
cat /tmp/tg/*.safetensors > /dev/null
G="generate --backend cuda --target /tmp/tg --prompts builtin:humaneval --timeline"
DRAFTLENS_CACHE=/tmp/cw timeout 90 $B/draftlens $G --limit 8 --gen-batch 1 --max-new-tokens 125 > $O/warm.out 2> $O/warm.err
echo "warm rc=$?"
# Each variant is an environment assignment (VARIANTS, default: graphs off, then on).
VARIANTS=${VARIANTS:-DRAFTLENS_STEP_GRAPHS=off DRAFTLENS_STEP_GRAPHS=on}
names=()
for a in $VARIANTS; do
  v=${a#*=}; v=${v//[^a-z0-9]/}; names+=($v)
  rm -rf /tmp/c-$v && cp -r /tmp/cw /tmp/c-$v
  for b in 1 64; do
    n=$([ $b = 1 ] && echo ${B1_PROMPTS:-32} || echo 164)
    env $a DRAFTLENS_CACHE=/tmp/c-$v timeout 120 $B/draftlens $G --limit $n --gen-batch $b \
      --max-new-tokens 128 --json > $O/gen_${v}_b$b.json 2> $O/gen_${v}_b$b.err
    echo "== $a batch $b ($n prompts) rc=$?"; grep -E "generate: (decode|prefill)" $O/gen_${v}_b$b.err | head -3
  done
done
for b in 1 64; do
  python3 - $O/gen_${names[0]}_b$b.json $O/gen_${names[1]}_b$b.json $b <<'PY'
import json, sys
a, b = ([(r["id"], r["new_tokens"], r["text"]) for r in json.load(open(p))] for p in sys.argv[1:3])
print(f"batch {sys.argv[3]}: {len(a)} continuations,", "identical in both variants" if a == b and a else "OUTPUTS DIFFER")
PY
done
if [ -n "${TRACE:-}" ]; then
  for v in on off; do
    rm -rf /tmp/c-t$v && cp -r /tmp/cw /tmp/c-t$v
    DRAFTLENS_STEP_GRAPHS=$v DRAFTLENS_CACHE=/tmp/c-t$v timeout 120 bash tools/bench/kernel_trace.sh $O/trace_$v.txt \
      $B/draftlens $G --limit 2 --gen-batch 1 --max-new-tokens 128
    python3 tools/bench/kernel_trace.py $O/trace_$v.txt gaps - --top 12 > $O/trace_${v}_gaps.txt 2>&1; head -8 $O/trace_${v}_gaps.txt
    python3 tools/bench/kernel_trace.py $O/trace_$v.txt kernels - --top 30 > $O/trace_${v}_kernels.txt 2>&1; head -24 $O/trace_${v}_kernels.txt
    xz -T0 -6 $O/trace_$v.txt
  done
fi
python3 tools/bench/copy_rate.py | tee $O/copy_rate.txt
tar czf $OUTDIR/logs-$ARCH.tgz -C $O . && rm -rf $O
echo "== done $(( $(date +%s) - T0 )) s"
