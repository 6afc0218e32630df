#!/usr/bin/env bash
# Per-kernel GPU timeline of one command on the GPU machine, without Nsight Systems (the image has
# none): builds the CUPTI sample `cupti_trace_injection` that ships with the CUDA toolkit and
# runs the command with it injected (CUDA_INJECTION64_PATH), keeping only the kernel, copy and
# memset records. Read the result with tools/bench/kernel_trace.py.
#   bash tools/bench/kernel_trace.sh OUT.txt command args...
# e.g. bash tools/bench/kernel_trace.sh /tmp/o/trace.txt target-carry/x/cuda_bench --only decode --quick
set -eu
out=$1; shift
S=/usr/local/cuda/extras/CUPTI/samples
W=/tmp/cupti-inject
if [ ! -e $W/cupti_trace_injection/libcupti_trace_injection.so ]; then
  mkdir -p $W && cp -r $S/cupti_trace_injection $S/common $W/
  (cd $W/cupti_trace_injection && make CUDA_INSTALL_PATH=/usr/local/cuda > /dev/null)
fi
# The command's own output is kept beside the trace: stdout without the records in OUT.stdout,
# stderr (a --timeline table, say) in OUT.stderr.
CUDA_INJECTION64_PATH=$W/cupti_trace_injection/libcupti_trace_injection.so "$@" > "$out.all" 2> "$out.stderr" || true
grep -E "^(CONCURRENT_KERNEL|MEMCPY|MEMSET)" "$out.all" > "$out" || true
grep -vE "^(CONCURRENT_KERNEL|MEMCPY|MEMSET|DEVICE|CONTEXT|RUNTIME|DRIVER)" "$out.all" > "$out.stdout" || true
rm -f "$out.all"
wc -l "$out"
