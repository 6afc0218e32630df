#!/usr/bin/env bash
# Session 31 (issue 38 item 2): the wgmma flash attention on the GPU, one call. $B holds
# cuda_attention_wgmma and cuda_bench of the build under test (e.g. with ../wgmma-v2.patch applied),
# v1/cuda_bench of the tree's kernel, optionally cuda_ops (xz); BENCH_BUILDS="v1 ." and
# SEQS="4x4096 2x8192 1x32768 16x1024" choose what runs, LIMIT (s) stops the prefill runs. Runs: the wgmma tests; the one-layer attention bench of both builds; the product
# prefill (`cuda_bench --only target`, TARGET_DEFAULTS_ONLY=1) on a random Qwen3-8B at 1k, 4k, 8k
# and 32k tokens per sequence with flash_attention2 and with DRAFTLENS_ATTENTION_KERNEL=wgmma;
# then cuda_ops with DRAFTLENS_DEPENDENT_LAUNCH=on.
#   B=target-carry/W bash docs/bench-logs/s31-2026-12-07/scripts/wgmma.sh
set -u
T0=$(date +%s)
source tools/bench/device_env.sh
for f in "$B"/v1/*.xz; do [ -e "${f%.xz}" ] || xz -dk "$f"; done; chmod +x "$B"/v1/* 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p $OUT/tests
s=$(date +%s); timeout 120 $B/cuda_attention_wgmma --test-threads 1 --nocapture > $OUT/tests/wgmma.txt 2>&1
echo "== cuda_attention_wgmma rc=$? $(( $(date +%s) - s )) s"; grep -E "^test |test result|panicked|max|rel" $OUT/tests/wgmma.txt | head -24
for v in ${BENCH_BUILDS:-v1 .}; do
  timeout 60 $B/$v/cuda_bench --only attention-wgmma > $OUT/attn_$v.txt 2>&1; echo "== attention bench [$v] rc=$?"; tail -9 $OUT/attn_$v.txt
done
python3 tools/bench/make_random_target.py --out /tmp/tg --arch qwen3-8b --drafters 0 > $OUT/make.log 2>&1; tail -1 $OUT/make.log
cat /tmp/tg/*.safetensors > /dev/null
for seqs in ${SEQS:-4x4096 2x8192 1x32768 16x1024}; do
  for k in fa2 wgmma; do
    [ $(( $(date +%s) - T0 )) -gt ${LIMIT:-470} ] && { echo "== out of time before $seqs $k"; continue; }
    env $([ $k = wgmma ] && echo DRAFTLENS_ATTENTION_KERNEL=wgmma) TARGET_DEFAULTS_ONLY=1 timeout 90 \
      $B/cuda_bench --only target --target /tmp/tg --target-seqs $seqs --forwards 3 > $OUT/target_${seqs}_$k.txt 2>&1
    echo "== target $seqs $k rc=$?"; grep -E "forward_packed|floor" $OUT/target_${seqs}_$k.txt | tail -2
  done
done
[ -e $B/cuda_ops ] && s=$(date +%s) && DRAFTLENS_DEPENDENT_LAUNCH=on timeout 120 $B/cuda_ops --test-threads 1 > $OUT/tests/ops_dl.txt 2>&1
echo "== cuda_ops DRAFTLENS_DEPENDENT_LAUNCH=on rc=$? $(( $(date +%s) - s )) s"; grep -E "test result|FAILED|panicked" $OUT/tests/ops_dl.txt | head -6
tar czf $OUT/tests.tgz -C $OUT tests && rm -rf $OUT/tests
echo "== done $(( $(date +%s) - T0 )) s"
