#!/usr/bin/env bash
# Issue 34 item 4 on the GPU machine: Qwen3.5-35B-A3B in bf16 (64.56 GiB of weights) and
# gpt-oss-120b with MXFP4 experts (60.77 GiB) run one 32k-token prompt through `draftlens extract
# --backend cuda` on one GPU with host memory under 2 GB plus the cache being written, and
# Qwen3.5-122B-A10B in bf16 (227.45 GiB) is refused before any work, with the numbers.
#
# The weights do not fit the machine's 64 GiB disk, so the targets are `random:DIR` folders
# (docs/loading.md §7): config.json, tokenizer and random.json written by
# tools/bench/make_random_target.py --no-weights, the weights generated at load through the real
# loader, upload, memory estimate and forward. Per model it prints: the exit status; the timeline
# (`load target` = generating + uploading the weights; its host RSS peak "besides queued cache
# writes" is the goal's figure); the process's peak host RSS (time -v) next to the bytes of cache
# entries written (the allowance: 2 GB + those); the device memory used,
# sampled every 100 ms by nvidia-smi, next to `inspect --json`'s estimate at the same lengths.
#
# From the repository root on the GPU machine, carrying only the binary (and the Qwen3 tokenizer,
# tools/bench/device_env.sh's tok.tar.xz):
#   B=target-carry/x bash tools/bench/moe_memory_device.sh
# Outputs in $O (/tmp/o) and, tarred, in $OUT when set.
set -u
source tools/bench/device_env.sh
DL="$B/draftlens"
T0=$(date +%s)
[ -x "$DL" ] || { echo "no draftlens binary in $B (draftlens.xz)"; exit 1; }
[ -e data/tokenizer/qwen3-hf/tokenizer.json ] \
  || { echo "no Qwen3 tokenizer: carry $B/tok.tar.xz (tools/bench/device_env.sh unpacks it)"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee "$O/gpu.txt"
nproc | sed 's/^/cores: /'

# The 32k-token prompt: HumanEval prompts counted by the target's tokenizer (the Qwen3 one in
# every folder here, so one file serves both models).
for m in q35:qwen3.5-35b-a3b oss120:gpt-oss-120b q122:qwen3.5-122b-a10b; do
  python3 tools/bench/make_random_target.py --out "/tmp/r-${m%%:*}" --arch "${m#*:}" --no-weights \
    > "$O/make-${m%%:*}.log" 2>&1 || { echo "make_random_target ${m#*:} failed:"; tail -5 "$O/make-${m%%:*}.log"; exit 1; }
  tail -1 "$O/make-${m%%:*}.log"
done
python3 tools/bench/make_long_prompt.py /tmp/r-q35 /tmp/long32k.jsonl 32000 > "$O/long.log" 2>&1 \
  || { echo "make_long_prompt failed:"; tail -5 "$O/long.log"; exit 1; }
tail -1 "$O/long.log"

# NAME DIR: extract the long prompt (5 taps, 128 new tokens) with peak host and device memory.
measure() {
  local n=$1 dir=$2
  local cache=/tmp/c-$n
  rm -rf "$cache"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$O/$n.smi" &
  local smi=$!
  DRAFTLENS_CACHE=$cache /usr/bin/time -v timeout 500 "$DL" extract --backend cuda \
    --target "random:$dir" --prompts /tmp/long32k.jsonl --max-new-tokens 128 --timeline \
    > "$O/$n.out" 2> "$O/$n.err"
  echo "$n rc=$? (want 0)"
  kill $smi 2>/dev/null
  # The timeline (its own host RSS column, and the peak besides queued cache writes), then time -v.
  sed -n '/^timeline:/,/Command being timed/p' "$O/$n.err" | grep -v "Command being timed"
  grep -E "Maximum resident|Elapsed|error" "$O/$n.err"
  "$DL" inspect "random:$dir" --json --gen-batch 1 --prompt-tokens 32100 --max-new-tokens 128 \
    > "$O/$n.inspect.json"
  python3 - "$O/$n.smi" "$O/$n.inspect.json" "$O/$n.err" "$cache" <<'EOF'
import json, os, re, sys
used = [int(l) for l in open(sys.argv[1]) if l.strip().isdigit()]
est = json.load(open(sys.argv[2]))["cuda_memory"]
err = open(sys.argv[3]).read()
rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
cache = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(sys.argv[4]) for f in fs)
print(f"  device used: idle {used[0] if used else '?'} MiB, peak {max(used) if used else '?'} MiB; "
      f"estimate {est['total_bytes'] / 2**20:.0f} MiB (weights {est['weights_bytes'] / 2**20:.0f}, "
      f"KV/state {est['kv_state_bytes'] / 2**20:.0f}, prefill {est['prefill_bytes'] / 2**20:.0f}, "
      f"target pass {est['target_pass_bytes'] / 2**20:.0f})")
if rss:
    peak = int(rss.group(1)) * 1024
    print(f"  host: peak RSS {peak / 2**30:.2f} GiB, cache written {cache / 2**30:.2f} GiB, "
          f"RSS less cache {(peak - cache) / 2**30:.2f} GiB (goal: under 2 GB = 1.86 GiB)")
EOF
  head -c 400 "$O/$n.out"; echo
  rm -rf "$cache"
  echo "== $(( $(date +%s) - T0 )) s"
}
# Qwen3.5-122B-A10B: refused before anything is generated or uploaded (rc 1, about a second, the
# one-line "does not fit" with the estimate and the free memory).
DRAFTLENS_CACHE=/tmp/c-q122 /usr/bin/time -v timeout 120 "$DL" extract --backend cuda \
  --target random:/tmp/r-q122 --prompts /tmp/long32k.jsonl --max-new-tokens 128 --timeline \
  > "$O/q122.out" 2> "$O/q122.err"
echo "q122 refusal rc=$? (want 1)"
grep -E "does not fit|Maximum resident|Elapsed" "$O/q122.err"

measure q35_32k /tmp/r-q35
measure oss120_32k /tmp/r-oss120

echo "== total $(( $(date +%s) - T0 )) s"
[ -n "${OUT:-}" ] && tar czf "$OUT/moe_memory.tgz" -C "$O" .
exit 0
