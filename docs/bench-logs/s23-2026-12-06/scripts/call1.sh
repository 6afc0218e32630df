#!/usr/bin/env bash
# Session 23, device call 1.
#  1. Issue 34: the MoE decode step routed on the device (tests/cuda_moe.rs: row invariance 1..64,
#     device vs host routing, batched greedy bit-identical, the transformers goldens on CUDA) and
#     tests/cuda_decode.rs (the decode GEMM refactored into dg_accumulate: bits unchanged).
#  2. Issue 35: session 22's prepared check (every family's known answers on CUDA, EAGLE-3's
#     dynamic tree on CUDA), docs/bench-logs/s22-2026-12-06/scripts/call1.sh.
#  3. Issue 34 item 5: session 20's end-to-end comparison again (random Qwen3-30B-A3B-shaped target,
#     8 of 48 layers, 164 HumanEval prompts x 128 tokens, taps 1,3,5,6, 3 DFlash checkpoints) with
#     the A/B of routing on the device against the host (DRAFTLENS_MOE_ROUTING=host), same call.
#   B=target-carry/s23 bash docs/bench-logs/s23-2026-12-06/scripts/call1.sh
set -u
B=${B:-target-carry/s23}
T0=$(date +%s)
source tools/bench/device_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
mkdir -p /work && ln -sfn "$PWD" /work/main   # test binaries find fixtures under the build path
for t in cuda-moe cuda-decode; do
  timeout 240 "$B/$t" --test-threads 1 --nocapture > $OUT/$t.txt 2>&1
  echo "== $t rc=$? $(( $(date +%s) - T0 )) s"; grep -E "^test |test result|panicked|rel |bit-identical|greedy equals" $OUT/$t.txt | head -60
done
# 2. issue 35 (families, EAGLE-3 trees)
O2=$O; B=$B O=/tmp/o35 timeout 200 bash docs/bench-logs/s22-2026-12-06/scripts/call1.sh > $OUT/families.txt 2>&1
echo "== issue 35 checks rc=$? $(( $(date +%s) - T0 )) s"; tail -30 $OUT/families.txt
O=$O2
# 3. MoE end to end
export DRAFTLENS_DATA=/tmp/data PYTHONUNBUFFERED=1
P=crates/engine/builtin-prompts/humaneval.jsonl
python3 tools/bench/make_random_target.py --out /tmp/moe --arch qwen3-30b-a3b-8l --drafters 3 --taps 1,3,5,6 > $O/make.log 2>&1; tail -1 $O/make.log
cat /tmp/moe/*.safetensors > /dev/null
t() { local n=$1; shift; local s=$(date +%s%N); "$@" > $O/$n.out 2> $O/$n.err; local rc=$?; echo "== $n rc=$rc $(( ($(date +%s%N) - s) / 1000000 )) ms"; grep -E "timeline" $O/$n.err | tail -2; }
X="extract --backend cuda --target /tmp/moe --prompts builtin:humaneval --limit 164 --layers 1,3,5,6 --max-new-tokens 128 --timeline"
rm -rf /tmp/dk
DRAFTLENS_CACHE=/tmp/c1 t dl_extract_cold timeout 200 $B/draftlens --json $X
DRAFTLENS_CACHE=/tmp/c2 DRAFTLENS_MOE_ROUTING=host t dl_extract_host_warmk timeout 200 $B/draftlens --json $X
DRAFTLENS_CACHE=/tmp/c3 t dl_extract_dev_warmk timeout 200 $B/draftlens --json $X
DRAFTLENS_CACHE=/tmp/c1 t dl_extract_cached timeout 100 $B/draftlens --json $X
DRAFTLENS_CACHE=/tmp/c1 t dl_run3 timeout 200 $B/draftlens --json run --backend cuda --target /tmp/moe --drafter /tmp/moe-drafters --prompts builtin:humaneval --limit 164 --max-new-tokens 128 --db /tmp/moe.sqlite
echo "== before hf: $(( $(date +%s) - T0 )) s"
t hf_run3 timeout 150 python3 tools/bench/hf_e2e.py --model /tmp/moe --prompts $P --limit 164 --layers 1,3,5,6 --max-new 128 --batch 32 --out /tmp/hf_out2 --drafters /tmp/moe-drafters
tail -3 $O/hf_run3.out
tar czf $OUT/moe-e2e.tgz -C $O .
echo "== total $(( $(date +%s) - T0 )) s"
