#!/usr/bin/env bash
# Session 16, call 7 (target-carry/s16e): after the review (one q/k-norm argument check, one
# "fits" predicate shared with the decode attention, the row norms' shared load and sum helpers):
# the bit-identity and fused-op tests of cuda_ops, and cuda_decode's fused decode attention,
# batched greedy and split-KV tests.
set -u
B=${B:-target-carry/s16e}
source tools/bench/device_env.sh
timeout 120 $B/cuda_ops --test-threads=1 row_norm swiglu_rows fused_trait q_norm_inside cuda_every_op 2>&1 | grep -E "^test |test result|panicked|differ"
timeout 200 $B/cuda_decode --test-threads=1 fused_decode batched_greedy split_kv batched_decode 2>&1 | grep -E "^test |test result|panicked"
