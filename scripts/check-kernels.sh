#!/usr/bin/env bash
# Compiles every CUDA kernel module offline and fails on a compile error or a new register spill
# (docs/cuda.md, "Checking kernels without a GPU"): NVRTC and ptxas come from two PyPI wheels pinned
# by hash (scripts/requirements-kernels.txt), unpacked once into $KERNEL_TOOLS (default
# ~/.cache/draftlens/kernel-tools). No GPU, driver or CUDA installation needed.
# Known, documented spills and stack frames are allowed by name (--allow-spill, --allow-local);
# any other fails.
set -euo pipefail
cd "$(dirname "$0")/.."
T=${KERNEL_TOOLS:-$HOME/.cache/draftlens/kernel-tools}
if [[ ! -e "$T/libnvrtc.so.13" || ! -x "$T/ptxas" ]]; then
  mkdir -p "$T/wheels"
  python3 -m pip download --quiet --no-deps --require-hashes -r scripts/requirements-kernels.txt -d "$T/wheels"
  python3 - "$T" <<'PY'
import pathlib, sys, zipfile
t = pathlib.Path(sys.argv[1])
for whl in (t / "wheels").glob("*.whl"):
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            base = name.rsplit("/", 1)[-1]
            if base.startswith(("libnvrtc.so", "libnvrtc-builtins.so")) or name.endswith("/bin/ptxas"):
                (t / base).write_bytes(z.read(name))
(t / "ptxas").chmod(0o755)
PY
  rm -rf "$T/wheels"
fi
# Known and documented (docs/cuda.md, "Checking kernels without a GPU"): flash_attention2_hd128
# spills (72 bytes with NVRTC 13.0: reloaded once per K/V tile); the sine/cosine slow path gives
# the RoPE and decode-attention kernels (both table instances) a 32-byte frame.
log=$(mktemp)
status=0
LD_LIBRARY_PATH="$T" python3 tools/check_kernels.py --nvrtc "$T/libnvrtc.so.13" --ptxas "$T/ptxas" \
  --allow-spill flash_attention2_hd128 \
  --allow-local rope_bf16 --allow-local rope_cs_table_f32 --allow-local qk_norm_rope_bf16 \
  --allow-local qk_norm_rope_vec_bf16 --allow-local decode_attention_hd64 \
  --allow-local decode_attention_hd128 --allow-local decode_attention_hd256 \
  --allow-local decode_attention_tabp_hd64 --allow-local decode_attention_tabp_hd128 \
  --allow-local decode_attention_tabp_hd256 \
  "$@" > "$log" 2>&1 || status=$?
grep -vE "registers" "$log" || true
rm -f "$log"
exit $status
