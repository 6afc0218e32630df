# Shared set-up of a device call's script (source it from the repository root on the GPU machine):
#   B=target-carry/x; source tools/bench/device_env.sh
# unpacks the carried binaries (*.xz) and the Qwen3 tokenizer (tok.tar.xz, as `tokmin/`), sets the
# library path and the NVRTC kernel cache, empties the output folder O (/tmp/o), and defines
#   dl_run NAME TARGET DRAFTERS [WRAPPER...]
# which runs `draftlens run --backend cuda` over 164 HumanEval prompts with --json --timeline
# (optionally under WRAPPER, e.g. tools/bench/kernel_trace.sh OUT), keeps its JSON and stderr as
# $O/NAME.json / $O/NAME.err, and prints its exit status and the stderr lines matching $DL_SHOW.
# The carried binary is built without the demo's drafters (37 MiB the transfer cannot spare; the
# device never runs `setup`): cargo build --release -p draftlens-cli --no-default-features, then
# xz -T2 -6 -c target/release/draftlens > target-carry/x/draftlens.xz
O=${O:-/tmp/o}; rm -rf "$O"; mkdir -p "$O"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64 DRAFTLENS_KERNEL_CACHE=/tmp/dk
for f in "$B"/*.xz; do [ -e "${f%.xz}" ] || xz -dk "$f"; done
chmod +x "$B"/* 2>/dev/null
if [ -e "$B/tok.tar.xz" ]; then
  tar -xJf "$B/tok.tar.xz" -C /tmp && mkdir -p data/tokenizer && rm -rf data/tokenizer/qwen3-hf \
    && mv /tmp/tokmin data/tokenizer/qwen3-hf
fi
DL_SHOW=${DL_SHOW:-"timeline:|Maximum resident|Elapsed"}
dl_run() {
  local n=$1 t=$2 d=$3; shift 3
  /usr/bin/time -v timeout 300 "$@" "$B/draftlens" run --backend cuda --target "$t" --drafter "$d" \
    --prompts builtin:humaneval --limit 164 --json --timeline > "$O/$n.json" 2> "$O/$n.err"
  echo "$n rc=$?"; grep -E "$DL_SHOW" "$O/$n.err"
}
# A call script's steps (set T0, LIMIT and STEPS first): `has STEP` (is it in $STEPS), `left`
# (seconds of $LIMIT left) and `t NAME CMD...` (CMD's streams kept as $O/NAME.{out,err}; prints
# its exit status, milliseconds and the stderr lines of the timeline and of errors).
has() { [[ " ${STEPS:-} " == *" $1 "* ]]; }
left() { echo $(( ${LIMIT:-560} - ($(date +%s) - T0) )); }
t() {
  local n=$1; shift; local s=$(date +%s%N)
  "$@" > "$O/$n.out" 2> "$O/$n.err"; local rc=$?
  echo "== $n rc=$rc $(( ($(date +%s%N) - s) / 1000000 )) ms"
  grep -E "timeline|generate: |target forward|gemm tuning|kernel compile|cache read|weights hash|error|Error|diverged" "$O/$n.err" | tail -6
}
