#!/usr/bin/env bash
# Session 30 (issue 38 item 1): decode steps under several settings, one binary, one machine, one
# call. The GPU tests of $TESTS first (NAME or NAME:FILTER), then for each target of $ARCHS
# (gpt-oss-20b-8l, qwen3-8b) a random folder and `generate` at batch 1 ($B1_PROMPTS prompts × 127
# steps) and batch 64 (164 prompts) under each variant of $VARIANTS — a variant is one or more
# environment assignments joined by commas ("-" for none) — each from a copy of the same warmed
# cache (identity remembered, GEMMs tuned, no continuation of that length decoded yet). Every
# variant's generated text is compared with the first's. With TRACE="VARIANT ...", the per-kernel
# timeline (tools/bench/kernel_trace.sh) of 2 prompts at batch 1 under those variants. Then the
# device copy rate (COPY_RATE= skips it). Logs in $OUT/logs-$ARCH.tgz, test outputs in $OUT/tests.tgz.
#   B=target-carry/s30a ARCHS=gpt-oss-20b-8l TESTS=cuda_step_graph \
#     VARIANTS="DRAFTLENS_DEPENDENT_LAUNCH=off DRAFTLENS_DEPENDENT_LAUNCH=on" \
#     bash docs/bench-logs/s30-2026-12-07/scripts/variants.sh
set -u
B=${B:-target-carry/s30a}
T0=$(date +%s)
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /work && for d in /work/main /work/relsrc; do [ -e $d ] || ln -sfn "$PWD" $d; done
mkdir -p $OUT/tests
for t in ${TESTS:-}; do
  bin=${t%%:*}; filter=${t#*:}; [ "$filter" = "$t" ] && filter=
  [ -e $B/$bin ] || { echo "== $t: no binary"; continue; }
  s=$(date +%s); timeout ${TEST_LIMIT:-150} $B/$bin $filter --test-threads 1 --nocapture > $OUT/tests/$bin.txt 2>&1
  echo "== $t rc=$? $(( $(date +%s) - s )) s"; grep -E "test result|FAILED|panicked|recorded, " $OUT/tests/$bin.txt | head -8
done
envs() { [ "$1" = "-" ] && return; echo "${1//,/ }"; }
for ARCH in ${ARCHS:-gpt-oss-20b-8l}; do
  O=$OUT/o-$ARCH; mkdir -p $O
  rm -rf /tmp/tg /tmp/cw
  python3 tools/bench/make_random_target.py --out /tmp/tg --arch $ARCH --drafters 0 > $O/make.log 2>&1; tail -1 $O/make.log
  cat /tmp/tg/*.safetensors > /dev/null
  G="generate --backend cuda --target /tmp/tg --prompts builtin:humaneval --timeline"
  DRAFTLENS_CACHE=/tmp/cw timeout 90 $B/draftlens $G --limit 8 --gen-batch 1 --max-new-tokens 125 > $O/warm.out 2> $O/warm.err
  echo "== $ARCH warm rc=$?"
  i=0
  for a in ${VARIANTS:--}; do
    rm -rf /tmp/c-$i && cp -r /tmp/cw /tmp/c-$i
    for b in 1 64; do
      n=$([ $b = 1 ] && echo ${B1_PROMPTS:-32} || echo 164)
      env $(envs $a) DRAFTLENS_CACHE=/tmp/c-$i timeout 150 $B/draftlens $G --limit $n --gen-batch $b \
        --max-new-tokens 128 --json > $O/gen_${i}_b$b.json 2> $O/gen_${i}_b$b.err
      echo "== $ARCH [$i] $a batch $b ($n prompts) rc=$?"; grep -E "generate: (decode|prefill)" $O/gen_${i}_b$b.err | head -2
      [ $i -gt 0 ] && python3 - $O/gen_0_b$b.json $O/gen_${i}_b$b.json <<'PY'
import json, sys
a, b = ([(r["id"], r["new_tokens"], r["text"]) for r in json.load(open(p))] for p in sys.argv[1:3])
print(f"   {len(b)} continuations,", "identical to variant 0" if a == b and a else "OUTPUTS DIFFER FROM VARIANT 0")
PY
    done
    i=$((i + 1))
  done
  j=0
  for a in ${TRACE:-}; do
    rm -rf /tmp/c-t && cp -r /tmp/cw /tmp/c-t
    env $(envs $a) DRAFTLENS_CACHE=/tmp/c-t timeout 120 bash tools/bench/kernel_trace.sh $O/trace_$j.txt \
      $B/draftlens $G --limit 2 --gen-batch ${TRACE_BATCH:-1} --max-new-tokens 128 > /dev/null 2>&1
    echo "== trace [$j] $a"
    python3 tools/bench/kernel_trace.py $O/trace_$j.txt gaps - --top 12 > $O/trace_${j}_gaps.txt 2>&1; head -8 $O/trace_${j}_gaps.txt
    python3 tools/bench/kernel_trace.py $O/trace_$j.txt kernels - --top 30 > $O/trace_${j}_kernels.txt 2>&1; head -24 $O/trace_${j}_kernels.txt
    xz -T0 -6 $O/trace_$j.txt
    j=$((j + 1))
  done
  tar czf $OUT/logs-$ARCH.tgz -C $O . && rm -rf $O
done
[ -n "${COPY_RATE:-1}" ] && python3 tools/bench/copy_rate.py | tee $OUT/copy_rate.txt
[ -n "${TESTS:-}" ] && tar czf $OUT/tests.tgz -C $OUT tests
rm -rf $OUT/tests
echo "== done $(( $(date +%s) - T0 )) s"
