#!/usr/bin/env bash
# Cold start with the weights hash in the background (issue 38 item 6, docs/loading.md §2): a cold
# `extract` of the random-weight Qwen3-8B folder with the hash before the upload (the old order,
# `DRAFTLENS_IDENTITY_HASH=foreground`) and overlapping it (the default), same binary, each on
# weights never seen (fresh cache folder, hence a fresh identity store) and with the weight files
# evicted from the page cache. NVRTC kernels and GEMM choices are warmed first by a throwaway run,
# so that the measured runs differ only in the hash.
#
# Build here (no cargo on the GPU machine) and carry the binary:
#   cargo build --release -p draftlens-cli && mkdir -p target-carry/cold && cp target/release/draftlens target-carry/cold/ && strip target-carry/cold/draftlens
# On the device (carry: target-carry/cold, data/prompts, data/tokenizer/qwen3-hf):
#   bash tools/bench/cold_identity_device.sh [target-carry/cold] [N prompts, default 164]
# What to read in $OUT/cold.log, per run: `wall_s`, and in the --timeline table `load target`,
# `cache read` (foreground: holds the hash, ≈ 3.6 s on the H100 of issue 38), `weights hash (wait)`
# (background: ≈ 0 when the upload outlasts the hash) and, under "in the background",
# `weights hashed (background)` (≈ what the foreground run hashed in `cache read`).
set -u
BIN=${1:-target-carry/cold}
N=${2:-164}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DRAFTLENS_KERNEL_CACHE=/tmp/draftlens-kernels
M=/tmp/q8b
TAPS=1,9,17,25,33
DL="$BIN/draftlens"
LOG="$OUT/cold.log" TIMED_DIR="$OUT" TIMED_ERR_LINES=30
source tools/bench/timed.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$LOG"
[ -d $M ] || timeout 300 python3 tools/bench/make_random_target.py --out $M --drafters 0 2>&1 | tail -n 3 | tee -a "$LOG"
du -sh $M | tee -a "$LOG"

# Drop the weight files' pages: the whole page cache where this machine lets us, else each file's
# pages (POSIX_FADV_DONTNEED through dd's nocache, no root needed). Logs what stayed resident.
evict() {
  sync
  if (echo 3 > /proc/sys/vm/drop_caches) 2> /dev/null; then
    log "evict: drop_caches"
  else
    for f in $M/*.safetensors; do dd if="$f" iflag=nocache count=0 status=none; done
    log "evict: fadvise DONTNEED per file (drop_caches not permitted)"
  fi
  command -v fincore > /dev/null && fincore $M/*.safetensors | tee -a "$LOG"
}

# The disk's floor for reading the weights once, cold.
evict
timed read_floor_cold bash -c "cat $M/*.safetensors > /dev/null"

# The first extract on this machine (empty NVRTC kernel cache, the GEMM choices of this GPU model
# shipped with the binary or, where none are, tuned now; weights evicted): the fresh machine's job.
# It warms the kernel cache and the GEMM choices for the measured runs below.
rm -rf /tmp/dlcache-warm
evict
timed warmup_fresh_machine timeout 400 "$DL" extract --backend cuda --target $M --prompts builtin:humaneval --limit "$N" --layers $TAPS --cache-dir /tmp/dlcache-warm --json --timeline -v

# $ROUNDS rounds (2), alternating, each cold (weights evicted, fresh cache and identity store).
for round in $(seq 1 "${ROUNDS:-2}"); do
  for hash in foreground background; do
    rm -rf /tmp/dlcache-$hash
    evict
    timed extract_cold_${hash}_$round env DRAFTLENS_IDENTITY_HASH=$hash timeout 400 "$DL" extract --backend cuda --target $M --prompts builtin:humaneval --limit "$N" --layers $TAPS --cache-dir /tmp/dlcache-$hash --json --timeline -v
  done
done
# The identity (part of every key) is the same either way: the identity stores' file hashes agree.
for hash in foreground background; do
  cat /tmp/dlcache-$hash/identity/*.json 2> /dev/null | grep '"sha256"' | sort > "$OUT/identity_sha_$hash.txt"
done
if [ -s "$OUT/identity_sha_foreground.txt" ] && cmp -s "$OUT/identity_sha_foreground.txt" "$OUT/identity_sha_background.txt"; then
  log "identity: the same file hashes"
else
  log "identity: DIFFERENT or missing file hashes"
fi
