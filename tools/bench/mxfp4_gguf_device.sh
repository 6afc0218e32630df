#!/usr/bin/env bash
# A gpt-oss GGUF's MXFP4 experts kept packed on the GPU (docs/cuda.md, "MXFP4 experts kept
# packed"; crates/engine/tests/cuda_mxfp4_gguf.rs), one device call of under a minute:
#   cuda_mxfp4_gguf  the gpt-oss MXFP4 fixture written as a llama.cpp GGUF: every expert weight
#                    packed on the device (none in bf16 mode), packed == bf16 mode and packed ==
#                    the MXFP4 folder packed (prefill states bit for bit, 32 greedy tokens each)
#   cuda_mxfp4       must pass unchanged (the folder's packed path), when carried
# Build (build machine, CARGO_INCREMENTAL=0), then carry $B:
#   cargo test -p draftlens-engine --test cuda_mxfp4_gguf --test cuda_mxfp4 --no-run   # prints the paths
#   mkdir -p target-carry/mxg && cp <cuda_mxfp4_gguf exe> target-carry/mxg/cuda_mxfp4_gguf && \
#     cp <cuda_mxfp4 exe> target-carry/mxg/cuda_mxfp4 && strip target-carry/mxg/cuda_* && \
#     xz -T2 -6 target-carry/mxg/cuda_*
# Usage (device): run(command="B=target-carry/mxg bash tools/bench/mxfp4_gguf_device.sh", carry=["target-carry"])
set -u
B=${B:-target-carry/mxg}
T0=$(date +%s)
source tools/bench/device_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
# The tests find the fixtures through the build machine's path (/work/main), linked here.
mkdir -p /work && [ -e /work/main ] || ln -sfn "$PWD" /work/main
for t in cuda_mxfp4_gguf cuda_mxfp4; do
  [ -e "$B/$t" ] || { echo "== $t not carried"; continue; }
  s=$(date +%s)
  timeout 200 "$B/$t" --test-threads 1 --nocapture > $O/$t.txt 2>&1
  echo "== $t rc=$? $(( $(date +%s) - s )) s (total $(( $(date +%s) - T0 )) s)"
  grep -E "^test |test result|panicked|SKIP|bit-identical|greedy tokens equal|differ" $O/$t.txt | head -40
done
tar czf $OUT/mxfp4_gguf.tgz -C $O .
echo "== total $(( $(date +%s) - T0 )) s"
