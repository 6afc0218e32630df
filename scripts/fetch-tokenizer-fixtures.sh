#!/usr/bin/env bash
# Fetch the tokenizer golden vectors used by host/tests/tokenizer_*.rs.
#
# Source: the PyPI sdist of llama-cpp-python 0.3.36 (MIT), which vendors llama.cpp's vocab-only
# GGUF files (`vendor/llama.cpp/models/ggml-vocab-*.gguf`) with their test inputs (`.gguf.inp`)
# and expected token ids (`.gguf.out`), plus chat templates (`models/templates/*.jinja`).
# See shared/specs/fixtures.md, "Tokenizer golden vectors".
#
# Writes (all git-ignored):
#   data/.dl/llama_cpp_python-0.3.36.tar.gz   the verified sdist
#   data/tokenizer/ggml-vocab-*.gguf[.inp|.out] the vocab GGUFs and their goldens
#   data/tokenizer/templates/*.jinja           the chat templates
# and refreshes the small committed copies of the .inp/.out goldens in tests/fixtures/tokenizer/.
#
# Usage: scripts/fetch-tokenizer-fixtures.sh   (from anywhere; needs curl, python3, tar, sha256sum)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

version=0.3.36
sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
sdist="data/.dl/llama_cpp_python-${version}.tar.gz"
vocabs=(gpt-2 qwen2 llama-bpe starcoder refact)

mkdir -p data/.dl data/tokenizer/templates tests/fixtures/tokenizer

if [[ ! -f "$sdist" ]] || ! echo "$sha256  $sdist" | sha256sum -c --status; then
    rm -f "$sdist"
    # Only the sdist carries the vendored llama.cpp models/ folder. `pip download` of an sdist
    # runs its build backend (scikit-build-core, cmake) just to read metadata, so the file is
    # taken straight from PyPI's simple index (PEP 691 JSON) instead; the sha256 pin below is
    # what makes that safe.
    url="$(curl -fsSL -H 'Accept: application/vnd.pypi.simple.v1+json' \
        https://pypi.org/simple/llama-cpp-python/ |
        python3 -c 'import json, sys
name = sys.argv[1]
print(next(f["url"] for f in json.load(sys.stdin)["files"] if f["filename"] == name))' \
            "llama_cpp_python-${version}.tar.gz")"
    curl -fsSL -o "$sdist.part" "$url"
    mv "$sdist.part" "$sdist"
fi
echo "$sha256  $sdist" | sha256sum -c

prefix="llama_cpp_python-${version}/vendor/llama.cpp/models"
members=()
for v in "${vocabs[@]}"; do
    for ext in gguf gguf.inp gguf.out; do
        members+=("${prefix}/ggml-vocab-${v}.${ext}")
    done
done
# Not every vocab exists in every llama.cpp revision: list first, extract what is there.
mapfile -t present < <(tar -tzf "$sdist" | grep -Fx -f <(printf '%s\n' "${members[@]}") || true)
mapfile -t templates < <(tar -tzf "$sdist" | grep -E "^${prefix}/templates/[^/]+\.jinja$" || true)
if [[ ${#present[@]} -eq 0 ]]; then
    echo "error: $sdist contains none of the expected ggml-vocab files" >&2
    exit 1
fi
tar -xzf "$sdist" -C data/tokenizer --strip-components=4 "${present[@]}"
if [[ ${#templates[@]} -gt 0 ]]; then
    tar -xzf "$sdist" -C data/tokenizer/templates --strip-components=5 "${templates[@]}"
fi

# Commit-worthy small goldens: the test strings and expected ids (text files, a few KiB each).
for f in data/tokenizer/ggml-vocab-*.gguf.inp data/tokenizer/ggml-vocab-*.gguf.out; do
    [[ -f "$f" ]] && cp "$f" tests/fixtures/tokenizer/
done

echo "vocab files in data/tokenizer/:"
ls -l data/tokenizer/ | sed 's/^/  /'
echo "templates: ${#templates[@]} in data/tokenizer/templates/"
