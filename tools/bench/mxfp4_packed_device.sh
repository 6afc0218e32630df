#!/usr/bin/env bash
# MXFP4 experts kept packed on the GPU (issue 34; docs/cuda.md, "MXFP4 experts kept packed"), in
# one device call of about 6–8 minutes (steps can be run in separate calls: STEPS):
#   tests  cuda_mxfp4, every test: the device dequantisation of every code pair at every scale
#          against the CPU table, the packed grouped GEMM bit-identical to the bf16 one (1, 2, 7,
#          64, 300 rows, experts with no rows) and within bf16 rounding of the CPU, the gpt-oss
#          block and whole models packed == bf16 mode bit for bit (device and host routing), the
#          packed model's batches == each prompt alone; then cuda_moe, which must pass unchanged
#          (the grouped GEMM's launch now dispatches on the weights' kind)
#   make   a gpt-oss-20b-shaped target, 8 of its 24 layers (make_random_target.py --arch
#          gpt-oss-20b-8l), its experts turned into MXFP4 blocks and scales (mxfp4_target.py)
#   bench  after a short warm-up run, `draftlens generate` on that target with DRAFTLENS_MXFP4=packed and =bf16 (the same
#          folder, the same binary): --gen-batch 1 (8 prompts) and --gen-batch 64 (64 prompts),
#          128 new tokens; per run the decode step (the timeline's "generate: decode" seconds over
#          the steps taken: a batch takes max(new tokens) − 1 steps), the load, the peak device
#          memory (nvidia-smi every 100 ms); the two modes' continuations must be equal (the
#          packed path is bit-identical), and `inspect`'s estimate in both modes
# Build (build machine, CARGO_INCREMENTAL=0), then carry $B:
#   cargo test -p draftlens-engine --test cuda_mxfp4 --test cuda_moe --no-run   # prints both paths
#   cargo build --release -p draftlens-cli --no-default-features
#   mkdir -p target-carry/mx && cp <cuda_mxfp4 exe> target-carry/mx/cuda_mxfp4 && \
#     cp <cuda_moe exe> target-carry/mx/cuda_moe && strip target-carry/mx/cuda_* && xz -T2 -6 target-carry/mx/cuda_*
#   xz -T2 -6 -c target/release/draftlens > target-carry/mx/draftlens.xz
#   rm -rf /tmp/tokmin && cp -r data/tokenizer/qwen3-hf /tmp/tokmin && tar -C /tmp -cJf target-carry/mx/tok.tar.xz tokmin
# Usage (device): run(command="B=target-carry/mx bash tools/bench/mxfp4_packed_device.sh", carry=["target-carry"])
#   STEPS="tests" / STEPS="make bench" to split it; LIMIT: seconds this call may take (560).
set -u
B=${B:-target-carry/mx}
T0=$(date +%s)
source tools/bench/device_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
# The tests find the fixtures through the build machine's path (/work/main), linked here.
mkdir -p /work && [ -e /work/main ] || ln -sfn "$PWD" /work/main
LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
STEPS=${STEPS:-tests make bench}
TARGET=${TARGET:-/tmp/g20mx}

if [[ " $STEPS " == *" tests "* ]]; then
  for t in cuda_mxfp4 cuda_moe; do
    s=$(date +%s)
    timeout 200 "$B/$t" --test-threads 1 --nocapture > $O/$t.txt 2>&1
    echo "== $t rc=$? $(( $(date +%s) - s )) s (total $(( $(date +%s) - T0 )) s)"
    grep -E "^test |test result|panicked|SKIP|bit-identical|bit for bit|greedy tokens equal|differ" $O/$t.txt | head -60
  done
fi

if [[ " $STEPS " == *" make "* ]] && [ ! -e "$TARGET/config.json" ]; then
  s=$(date +%s)
  python3 tools/bench/make_random_target.py --out "$TARGET" --arch gpt-oss-20b-8l --drafters 0 > $O/make.log 2>&1
  tail -1 $O/make.log
  python3 tools/bench/mxfp4_target.py "$TARGET" >> $O/make.log 2>&1
  tail -1 $O/make.log
  echo "== make $(( $(date +%s) - s )) s; $(du -sh "$TARGET" | cut -f1) on disk"
fi

if [[ " $STEPS " == *" bench "* ]]; then
  # Warm-up: kernel compiles and the decode GEMMs' choices (remembered in the kernel cache) out of
  # the measured runs.
  s=$(date +%s)
  DRAFTLENS_CACHE=/tmp/c-warm timeout 150 "$B/draftlens" generate --backend cuda --target "$TARGET" \
    --prompts builtin:humaneval --limit 4 --gen-batch 4 --max-new-tokens 16 > $O/warm.out 2> $O/warm.err
  echo "== warm-up rc=$? $(( $(date +%s) - s )) s"
  for b in 1 64; do
    limit=$([ $b = 1 ] && echo 8 || echo 64)
    for mode in packed bf16; do
      if [ "$(left)" -lt 60 ]; then echo "== skip b$b $mode: $(left) s left"; continue; fi
      n=b$b-$mode
      nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > $O/$n.smi & smi=$!
      rm -rf /tmp/c-$n
      s=$(date +%s)
      DRAFTLENS_MXFP4=$mode DRAFTLENS_CACHE=/tmp/c-$n timeout $(( $(left) - 20 )) "$B/draftlens" --json \
        --timeline=$O/$n.timeline.json generate --backend cuda --target "$TARGET" \
        --prompts builtin:humaneval --limit $limit --gen-batch $b --max-new-tokens 128 > $O/$n.json 2> $O/$n.err
      rc=$?; kill $smi
      echo "== $n rc=$rc $(( $(date +%s) - s )) s"
      grep -iE "error|warn" $O/$n.err | head -3
      [ $rc = 0 ] && python3 - $O/$n.json $O/$n.timeline.json $O/$n.smi $b <<'PY'
import json, sys
out, tl, smi, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3], int(sys.argv[4])
phase = {p["name"]: p["seconds"] for p in tl["phases"]}
new = [p["new_tokens"] for p in out]
steps = sum(max(new[i:i + b]) - 1 for i in range(0, len(new), b))
dec = phase.get("generate: decode", 0.0)
used = [int(l) for l in open(smi) if l.strip().isdigit()]
print(f"  {len(new)} prompts, {sum(new)} tokens, {steps} decode steps: {1000 * dec / max(steps, 1):.3f} ms a step "
      f"(decode {dec:.2f} s); load target {phase.get('load target', 0):.2f} s, prefill {phase.get('generate: prefill', 0):.2f} s; "
      f"device memory peak {max(used) if used else 0} MiB; GPU busy {100 * (tl.get('gpu_busy') or 0):.0f} %")
PY
    done
    if [ -s $O/b$b-packed.json ] && [ -s $O/b$b-bf16.json ]; then
      python3 -c "
import json
a, b = json.load(open('$O/b$b-packed.json')), json.load(open('$O/b$b-bf16.json'))
same = sum(x['text'] == y['text'] for x, y in zip(a, b))
print(f'  batch $b: {same} of {len(a)} continuations equal in the two modes' + ('' if same == len(a) == len(b) else '  <-- MISMATCH'))"
    fi
  done
  for mode in packed bf16; do
    DRAFTLENS_MXFP4=$mode "$B/draftlens" --json inspect "$TARGET" --gen-batch 64 --max-new-tokens 128 > $O/inspect-$mode.json 2>/dev/null
    [ -s $O/inspect-$mode.json ] && python3 -c "
import json; e = json.load(open('$O/inspect-$mode.json'))['cuda_memory']
print(f'  inspect, $mode: weights {e[\"weights_bytes\"] / 2**30:.2f} GiB ({e[\"weights_as\"]}), total at batch 64 {e[\"total_bytes\"] / 2**30:.2f} GiB')"
  done
fi
tar czf $OUT/mxfp4.tgz -C $O .
echo "== total $(( $(date +%s) - T0 )) s"
