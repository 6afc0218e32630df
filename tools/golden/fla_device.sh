#!/usr/bin/env bash
# Engine-profile goldens from fla itself, then draftlens' CUDA engine profile against them
# (docs/hybrid-models.md, "Two numeric profiles"; docs/gdn-cuda.md). Runs on the GPU machine (no
# network, no cargo; PyTorch, transformers 5.17 and triton present). Everything it writes goes to
# $OUT: golden/<model>/{config.json, model.safetensors, golden-fla.safetensors, manifest-fla.json}
# for qwen3_5, qwen3_next and qwen3_5_d128 (made here; ~3 MB in all), pip.log, goldens.log, test.log.
#
# Prepared on the build machine:
#   1. the wheels, pinned (sha256 checked below), in target-carry/fla-wheels/ (git-ignored, 1.5 MB):
#        pip download --no-deps fla-core==0.6.0 flash-linear-attention==0.6.0 einops==0.8.2 \
#            -d target-carry/fla-wheels
#   2. the CUDA test binary:
#        CARGO_INCREMENTAL=0 cargo test --release -p draftlens-engine \
#            --test cuda_fla_golden --no-run        # prints the path target/release/deps/cuda_fla_golden-<hash>
#        mkdir -p target-carry/flacuda && cp <that path> target-carry/flacuda/cuda_fla_golden \
#            && strip target-carry/flacuda/cuda_fla_golden && gzip -9 target-carry/flacuda/cuda_fla_golden
#      (stripped ~7 MB, gzipped ~2.8 MB: with the wheels ~4.3 MB to carry)
# Carried to the device: target-carry/fla-wheels and target-carry/flacuda. Command there:
#   bash tools/golden/fla_device.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
W=${FLA_WHEELS:-target-carry/fla-wheels}
T=${FLA_TEST:-target-carry/flacuda/cuda_fla_golden}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"

# ---- the wheels: exactly these files -----------------------------------------------------------
declare -A SHA=(
    [fla_core-0.6.0-py3-none-any.whl]=b0708b70e0b119cd58a0a5146ea56cb175cef6ed969d8ac60267e3e077ce3ebd
    [flash_linear_attention-0.6.0-py3-none-any.whl]=6dec9735f8454523c13553622e98aff30152dde6586b4ac7d88010fbb7a06b5f
    [einops-0.8.2-py3-none-any.whl]=54058201ac7087911181bfec4af6091bb59380360f069276601256a76af08193
)
for f in "${!SHA[@]}"; do
    got=$(sha256sum "$W/$f" 2>/dev/null | cut -d' ' -f1)
    [[ $got == "${SHA[$f]}" ]] || { echo "fla_device: $W/$f: sha256 '$got', expected ${SHA[$f]}" >&2; exit 1; }
done

# Installed offline into one folder put on PYTHONPATH for the golden script only (the system's
# torch / transformers / triton stay as they are, and nothing else sees fla). One pip call, since
# both fla wheels fill the `fla` package; if pip is missing, the pure-Python wheels are unpacked.
SITE=/tmp/fla-site
rm -rf "$SITE" && mkdir -p "$SITE"
WHEELS=("$W/fla_core-0.6.0-py3-none-any.whl" "$W/flash_linear_attention-0.6.0-py3-none-any.whl")
python3 -c "import einops" 2>/dev/null || WHEELS+=("$W/einops-0.8.2-py3-none-any.whl")
if ! python3 -m pip install --no-deps --no-index --target "$SITE" "${WHEELS[@]}" >"$OUT/pip.log" 2>&1; then
    echo "pip install failed (see above); unpacking the wheels instead" >>"$OUT/pip.log"
    for w in "${WHEELS[@]}"; do python3 -m zipfile -e "$w" "$SITE"; done
fi
PY="env PYTHONPATH=$SITE python3"
$PY -c "import fla, torch, transformers, triton; print('fla', fla.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" 2>&1 | tee -a "$OUT/pip.log"
[[ ${PIPESTATUS[0]} == 0 ]] || { echo "fla_device: fla does not import (see $OUT/pip.log)" >&2; exit 1; }

# ---- goldens: the committed models (and the 128-wide one the script makes) under fla ------------
G="$OUT/golden"
mkdir -p "$G"
for m in qwen3_5 qwen3_next; do
    mkdir -p "$G/$m"
    cp tests/fixtures/golden/$m/{config.json,model.safetensors} "$G/$m/"
done
timeout 900 $PY tools/golden/make_hybrid_goldens.py --out "$G" --fla 2>&1 | tee "$OUT/goldens.log"
[[ ${PIPESTATUS[0]} == 0 ]] || { echo "fla_device: the golden script failed (see $OUT/goldens.log)" >&2; exit 1; }

# ---- draftlens' CUDA profiles against them --------------------------------------------------------
if [[ ! -x $T && -f $T.gz ]]; then
    gunzip -c "$T.gz" >/tmp/cuda_fla_golden && chmod +x /tmp/cuda_fla_golden && T=/tmp/cuda_fla_golden
fi
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export DRAFTLENS_KERNEL_CACHE=/tmp/draftlens-kernels
DRAFTLENS_FLA_GOLDENS="$G" timeout 600 "$T" --nocapture --test-threads=1 2>&1 | grep -v "registers, " | tee "$OUT/test.log"
exit "${PIPESTATUS[0]}"
