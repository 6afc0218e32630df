# Sourced by the device scripts (e2e_device.sh, hybrid_device.sh): `log` and `timed` append to
# $LOG; `timed NAME CMD...` runs CMD under GNU time, keeps its streams in $TIMED_DIR/NAME.{out,err}
# and logs the tails: GNU time's line (wall seconds, peak RSS) and, for draftlens, its
# --timeline table.
log() { echo "=== $*" | tee -a "$LOG"; }
timed() {
  local name=$1; shift
  log "$name: $*"
  /usr/bin/time -f "$name wall_s=%e max_rss_kb=%M" "$@" > "$TIMED_DIR/$name.out" 2> "$TIMED_DIR/$name.err"
  local rc=$?
  tail -n "${TIMED_ERR_LINES:-30}" "$TIMED_DIR/$name.err" | grep -v 'registers, ' | tee -a "$LOG"
  tail -c "${TIMED_OUT_BYTES:-1500}" "$TIMED_DIR/$name.out" | tee -a "$LOG"
  echo "rc=$rc" | tee -a "$LOG"
}
