#!/usr/bin/env bash
# A real serving engine against draftlens, end to end (docs/traces.md §7): llama.cpp built from
# the pinned llama-cpp-python sdist (its vendor/llama.cpp; CMake, Release, CPU only), the shipped
# reference DFlash drafter (drafters/smollm2-reference/step-2581) converted to GGUF by llama.cpp's
# own convert_hf_to_gguf.py, llama-server decoding a few HumanEval prompts of the default target
# (models/SmolLM2-135M-Instruct.Q4_1.gguf) with it, and draftlens importing, diffing and linting
# what came out:
#
#   1. the correct conversion: `lint --against` passes; the trace imported both ways
#      (`--format llamacpp`, the response bodies; `--format jsonl`, the same requests with the
#      server's round log) gives one τ; that τ agrees with `draftlens live`'s τ (the reference
#      drafter decoding the same prompts in draftlens) within TAU_TOLERANCE; `trace diff` against
#      the reference drafter (on llama.cpp's own tokens) commits another number of tokens in at most
#      ROUND_TOLERANCE of the engine's rounds, and its τ − the engine's has a 95% interval holding 0;
#   2. the same drafter converted with its layer ids unshifted (off by one): `trace diff` finds more
#      than ROUND_TOLERANCE of the rounds differing and the engine's τ below the reference's (95%
#      interval above 0), and `lint --against` fails naming layer-ids-off-by-one.
#
# Needs: cmake, a C/C++ compiler, curl, python3; a Python with torch + transformers for the
# converter ($LLAMACPP_PYTHON, else the first of python3 / python3.12 that imports them, else a
# virtual environment under data/llamacpp-e2e/venv with llama.cpp's own converter requirements);
# the fixtures (scripts/setup-fixtures.sh). Writes under data/llamacpp-e2e/ (git-ignored); the
# llama.cpp build is kept there and reused while the sdist and the build flags are the same.
#
#   DRAFTLENS_BIN=target/debug/draftlens bash scripts/llamacpp-e2e.sh
set -euo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)

bin="${DRAFTLENS_BIN:-target/debug/draftlens}"
[[ -x $bin ]] || { echo "llamacpp-e2e: error: $bin: not an executable draftlens binary (set DRAFTLENS_BIN)" >&2; exit 1; }
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"

PROMPTS=${LLAMACPP_E2E_PROMPTS:-8}   # the first N HumanEval prompts
NEW_TOKENS=${LLAMACPP_E2E_TOKENS:-64}
# Agreement bounds, measured and argued in docs/traces.md §7.
TAU_TOLERANCE=0.10    # |τ llama.cpp − τ live| / τ live
ROUND_TOLERANCE=0.05  # share of engine rounds where the reference commits another number of tokens

TARGET=models/SmolLM2-135M-Instruct.Q4_1.gguf
DRAFTER=drafters/smollm2-reference/step-2581
PROMPT_FILE=data/prompts/humaneval.jsonl
for f in "$TARGET" "$DRAFTER/config.json" "$PROMPT_FILE"; do
    [[ -e $f ]] || { echo "llamacpp-e2e: error: $f missing: run scripts/setup-fixtures.sh first" >&2; exit 1; }
done

# The pinned sdist: the same file and pin as scripts/fetch-tokenizer-fixtures.sh (checked here).
version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
grep -q "sha256=$sha256" scripts/fetch-tokenizer-fixtures.sh ||
    { echo "llamacpp-e2e: error: the llama-cpp-python pin differs from scripts/fetch-tokenizer-fixtures.sh's" >&2; exit 1; }
sdist="data/.dl/llama_cpp_python-${version}.tar.gz"
mkdir -p data/.dl
if [[ ! -f $sdist ]] || ! echo "$sha256  $sdist" | sha256sum -c --status; then
    rm -f "$sdist"
    # `pip download --no-binary :all:` of this sdist runs its build backend (scikit-build-core,
    # CMake) just to read its metadata; the file is taken from PyPI's simple index (PEP 691 JSON)
    # instead, as fetch-tokenizer-fixtures.sh does: the sha256 pin is what makes it safe.
    url="$(curl -fsSL -H 'Accept: application/vnd.pypi.simple.v1+json' https://pypi.org/simple/llama-cpp-python/ |
        python3 -c 'import json, sys
print(next(f["url"] for f in json.load(sys.stdin)["files"] if f["filename"] == sys.argv[1]))' \
            "llama_cpp_python-${version}.tar.gz")"
    curl -fsSL -o "$sdist.part" "$url"
    mv "$sdist.part" "$sdist"
fi
echo "$sha256  $sdist" | sha256sum -c --quiet

work=data/llamacpp-e2e
src=$work/src/llama_cpp_python-${version}/vendor/llama.cpp
mkdir -p "$work"
if [[ "$(cat "$work/src/.sha256" 2>/dev/null)" != "$sha256" ]]; then
    rm -rf "$work/src"
    mkdir -p "$work/src"
    tar xzf "$sdist" -C "$work/src" "llama_cpp_python-${version}/vendor/llama.cpp"
    echo "$sha256" >"$work/src/.sha256"
fi

# Build llama-server only: Release, CPU only, static, portable (GGML_NATIVE=OFF: x86-64 with AVX2,
# not this machine's -march=native), no web UI, no HTTPS, no tests or examples.
cmake_flags=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_CUDA=OFF -DGGML_BLAS=OFF
    -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF)
stamp="$sha256 ${cmake_flags[*]}"
server=$work/build/bin/llama-server
if [[ ! -x $server || "$(cat "$work/build/.stamp" 2>/dev/null)" != "$stamp" ]]; then
    command -v cmake >/dev/null || { echo "llamacpp-e2e: error: cmake not found (apt-get install cmake)" >&2; exit 1; }
    rm -rf "$work/build"
    t0=$(date +%s)
    cmake -S "$src" -B "$work/build" "${cmake_flags[@]}" >"$work/cmake.log" 2>&1 ||
        { tail -30 "$work/cmake.log" >&2; exit 1; }
    nice -n 10 cmake --build "$work/build" --config Release -j2 --target llama-server >"$work/build.log" 2>&1 ||
        { tail -30 "$work/build.log" >&2; exit 1; }
    echo "$stamp" >"$work/build/.stamp"
    echo "llamacpp-e2e: built llama-server in $(($(date +%s) - t0)) s"
fi

# A Python for llama.cpp's converter (torch, transformers, numpy, safetensors).
needs='import torch, transformers, numpy, safetensors'
py="${LLAMACPP_PYTHON:-}"
# LLAMACPP_E2E_CONVERT=0: use the committed conversions even where a converter Python exists.
if [[ -z $py && ${LLAMACPP_E2E_CONVERT:-1} != 0 ]]; then
    for p in python3 python3.12 /root/.pyenv/versions/3.12.1/bin/python3.12; do
        if command -v "$p" >/dev/null && "$p" -c "$needs" 2>/dev/null; then py=$p; break; fi
    done
fi
# Without one (CI: its Python has no torch, and llama.cpp's converter requirements pull a 3 GB
# CUDA build of torch from PyPI), the two files this script's converter step wrote on a machine
# that had one are used: drafters/llamacpp/ (committed, converted by llama.cpp's own
# convert_hf_to_gguf.py from this sdist by tools/llamacpp_e2e/convert.py; docs/traces.md §7).
committed=drafters/llamacpp/
committed+=smollm2-reference-step-2581 # .gguf, -layer-ids-unshifted.gguf
if [[ -z $py ]]; then
    echo "llamacpp-e2e: no Python with torch + transformers: using the committed conversions in drafters/llamacpp/"
    echo "5b3d558613db62c931139cf5908cba8e9abc99429e617fb8006a164b84d9d342  $committed.gguf" | sha256sum -c --status &&
        echo "108608b861793ef9e3eb9f51d872a4deb6afa757d1b8d84ce75559b813dbc82a  $committed-layer-ids-unshifted.gguf" | sha256sum -c --status ||
        { echo "llamacpp-e2e: error: drafters/llamacpp/*.gguf differ from the recorded sha256" >&2; exit 1; }
    cp "$committed.gguf" "$work/dflash-good.gguf"
    cp "$committed-layer-ids-unshifted.gguf" "$work/dflash-bad.gguf"
fi
export PYTHONPATH="$PWD/$src/gguf-py${PYTHONPATH:+:$PYTHONPATH}"

# The target as the Hugging Face folder the converter wants, then both conversions.
[[ -z $py || -f $work/target/tokenizer.json ]] || "$py" tools/llamacpp_e2e/target_dir.py "$TARGET" "$work/target" >"$work/target.log" 2>&1 ||
    { tail -20 "$work/target.log" >&2; exit 1; }
for kind in good bad; do
    [[ -z $py ]] && break
    mistake=none
    [[ $kind == bad ]] && mistake=layer-ids-unshifted
    "$py" tools/llamacpp_e2e/convert.py --llama-cpp "$src" --drafter "$DRAFTER" --target-dir "$work/target" \
        --pre smollm --mistake "$mistake" --outfile "$work/dflash-$kind.gguf" >"$work/convert-$kind.log" 2>&1 ||
        { tail -20 "$work/convert-$kind.log" >&2; exit 1; }
done

# lint --against: the correct file passes, the wrong one fails naming the cause.
"$bin" --data-dir data lint --drafter "$work/dflash-good.gguf" --against "$DRAFTER" >"$work/lint-good.txt" 2>&1 ||
    { cat "$work/lint-good.txt" >&2; echo "llamacpp-e2e: FAIL: lint --against rejects the correct conversion" >&2; exit 1; }
if "$bin" --data-dir data lint --drafter "$work/dflash-bad.gguf" --against "$DRAFTER" >"$work/lint-bad.txt" 2>&1; then
    cat "$work/lint-bad.txt" >&2; echo "llamacpp-e2e: FAIL: lint --against passes the wrong conversion" >&2; exit 1
fi
grep -q "layer-ids-off-by-one" "$work/lint-bad.txt" ||
    { cat "$work/lint-bad.txt" >&2; echo "llamacpp-e2e: FAIL: lint does not name layer-ids-off-by-one" >&2; exit 1; }

# llama.cpp decodes; draftlens imports (both formats), diffs, and decodes the same prompts live.
db=$work/runs.sqlite
rm -f "$db"
for kind in good bad; do
    python3 tools/llamacpp_e2e/capture.py --server "$server" --target "$TARGET" --drafter "$work/dflash-$kind.gguf" \
        --prompts "$PROMPT_FILE" --limit "$PROMPTS" --max-new-tokens "$NEW_TOKENS" --out "$work/capture-$kind"
    # This llama.cpp's responses do not carry speculative.n_max (generation_settings holds only
    # speculative.types), so the llamacpp import is told the block size; rounds.jsonl carries it.
    for fmt in llamacpp jsonl; do
        file=$work/capture-$kind/$([[ $fmt == llamacpp ]] && echo llamacpp.jsonl || echo rounds.jsonl)
        "$bin" --data-dir data --json trace import "$file" --format "$fmt" --block-size 16 --prompts builtin:humaneval \
            --target "$TARGET" --db "$db" --name "llamacpp-$kind-$fmt" --drafter "$work/dflash-$kind.gguf" \
            >"$work/import-$kind-$fmt.json"
    done
    run=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["run"])' "$work/import-$kind-jsonl.json")
    "$bin" --data-dir data --cache-dir "$work/cache" --json trace diff "$run" --drafter "$DRAFTER" \
        --target "$TARGET" --backend cpu --db "$db" >"$work/diff-$kind.json"
done
"$bin" --data-dir data --cache-dir "$work/cache" --json live --drafter "$DRAFTER" --target "$TARGET" \
    --prompts builtin:humaneval --limit "$PROMPTS" --max-new-tokens "$NEW_TOKENS" --backend cpu >"$work/live.json"

python3 tools/llamacpp_e2e/check.py --work "$work" --tau-tolerance "$TAU_TOLERANCE" --round-tolerance "$ROUND_TOLERANCE"
echo "llamacpp-e2e: ok in $(($(date +%s) - START)) s"
