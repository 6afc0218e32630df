#!/usr/bin/env bash
# Compiles every CUDA kernel module offline and fails on a compile error or a new register spill
# (docs/cuda.md, "Checking kernels without a GPU"): NVRTC and ptxas come from two PyPI wheels pinned
# by hash (scripts/requirements-kernels.txt), unpacked once into $KERNEL_TOOLS (default
# ~/.cache/draftlens/kernel-tools). No GPU, driver or CUDA installation needed.
# Known, documented spills are allowed by name (--allow-spill); any other spill fails.
set -euo pipefail
cd "$(dirname "$0")/.."
T=${KERNEL_TOOLS:-$HOME/.cache/draftlens/kernel-tools}
if [[ ! -e "$T/libnvrtc.so.12" || ! -x "$T/ptxas" ]]; then
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
# flash_attention2_hd128 spills 32 bytes (docs/cuda.md, "Kernels": reloaded once per K/V tile).
log=$(mktemp)
status=0
python3 tools/check_kernels.py --nvrtc "$T/libnvrtc.so.12" --ptxas "$T/ptxas" \
  --allow-spill flash_attention2_hd128 "$@" > "$log" 2>&1 || status=$?
grep -vE "registers" "$log" || true
rm -f "$log"
exit $status
