#!/usr/bin/env bash
# Session 17, call 2 (target-carry/s17b: session 15's draftlens, right after call 1 while the machine
# is warm): the same `generate` as call 1 with the binary from before this session's decode
# attention, on the same model; the texts must be identical (the arithmetic is unchanged). Then
# where a hybrid forward's time goes: a kernel trace of the 16-layer random Qwen3.6-27B's packed
# prefill (4 x 4096 tokens), default kernels, both profiles (issue 12's 70 %); and the Gated
# DeltaNet prep and output phases with every global load of a block issued before its first shared
# store (A/B: gdn_bench --breakdown and the 16-layer forward, old and new binaries; cuda_gdn checks
# the bits).
set -u
B=${B:-target-carry/s17b}
O=/tmp/o2; source tools/bench/device_env.sh
# A fresh machine (call 1's /tmp gone): the same seeded model again; compare the printed hashes.
[ -e /tmp/q8b/config.json ] || { python3 tools/bench/make_random_target.py --out /tmp/q8b --drafters 0 > $O/make.log 2>&1; echo "make rc=$?"; }
DRAFTLENS_DATA=/tmp/data-s15 DRAFTLENS_CACHE=/tmp/cache-s15 /usr/bin/time -f "%e s %M KB" timeout 300 $B/draftlens_s15 generate --backend cuda \
  --target /tmp/q8b --prompts builtin:humaneval --limit 64 --max-new-tokens 128 --json > $O/gen_s15.json 2> $O/gen_s15.err
echo "generate s15 rc=$?"; tail -1 $O/gen_s15.err
python3 - "$O" <<'PY'
import json, sys
o = sys.argv[1]
import hashlib, os
a = json.load(open(f"{o}/gen_s15.json"))
print("texts sha256 (session 15 binary):", hashlib.sha256("\x00".join(x["text"] for x in a).encode()).hexdigest())
if not os.path.exists("/tmp/gen_new.json"): sys.exit(0)
b = json.load(open("/tmp/gen_new.json"))
same = sum(x["text"] == y["text"] and x["new_tokens"] == y["new_tokens"] for x, y in zip(a, b))
print(f"generate: {same} of {len(a)} continuations identical (session 15 binary vs new), {sum(x['new_tokens'] for x in b)} new tokens")
PY
timeout 200 $B/cuda_gdn --test-threads=1 > $O/cuda_gdn.log 2>&1; echo "cuda_gdn rc=$?"
grep -E "test result|FAILED|panicked" $O/cuda_gdn.log | head
for v in old new; do
  bin=$B/gdn_bench; [ $v = old ] && bin=$B/gdn_bench_old
  timeout 60 $bin --seqs 4 --reps 5 --breakdown > $O/gdn_breakdown_$v.log 2>&1; echo "gdn_bench $v rc=$?"
  grep -E "^\|" $O/gdn_breakdown_$v.log | head -40
done
timeout 120 python3 tools/bench/make_random_target.py --arch qwen3.6-27b-16l --out /tmp/q27 --taps 1,9,15 --drafters 0 > $O/make27.log 2>&1; echo "make27 rc=$?"
for v in old new; do
  bin=$B/cuda_bench; [ $v = old ] && bin=$B/cuda_bench_old
  TARGET_DEFAULTS_ONLY=1 timeout 120 $bin --only target --target /tmp/q27 --forwards 3 > $O/target27_$v.log 2>&1; echo "target $v rc=$?"
  grep -E "forward_packed|during" $O/target27_$v.log
done
TARGET_DEFAULTS_ONLY=1 timeout 200 bash tools/bench/kernel_trace.sh $O/ht.txt $B/cuda_bench --only target --target /tmp/q27 --forwards 3; echo "trace rc=$?"
python3 tools/bench/kernel_trace.py $O/ht.txt kernels - --top 40 > $O/hybrid_kernels.txt; cat $O/hybrid_kernels.txt
rm -f $O/ht.txt $O/ht.txt.stdout
tar czf $OUT/all.tgz -C $O .
