#!/usr/bin/env bash
# Session 15, call 5 (target-carry/s15d): the top-K kernels after the review (the two scans share
# their group fold, block log-sum-exp and k rounds): cuda_decode's top-K and batched-greedy tests
# (ids equal to the CPU's on tie-filled logits, k = 1, 8, 40) and cuda_ops' drafter blocks.
set -u
B=${B:-target-carry/s15d}
source tools/bench/device_env.sh
timeout 100 $B/cuda_decode --test-threads=1 top_k batched_greedy 2>&1 | grep -E "^test |test result|panicked"
timeout 60 $B/cuda_ops --test-threads=1 cuda_drafter_blocks cuda_every_op 2>&1 | grep -E "^test |test result|panicked"
