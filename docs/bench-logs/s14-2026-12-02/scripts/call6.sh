#!/usr/bin/env bash
# Session 14, call 6: call 4's steps with target-carry/s14d (call 4's binaries plus the top-K in
# slices of 4 096 logits at every row count, not one block per row above 64 rows; reverted after
# this call).
B=target-carry/s14d exec bash "$(dirname "$0")/call4.sh"
