#!/usr/bin/env python3
"""The mixture-of-experts goldens (tests/fixtures/golden/{qwen3_moe,qwen3_5_moe}) as llama.cpp's own
converter writes them, for draftlens' GGUF MoE loader (crates/engine/src/formats/gguf_moe.rs,
crates/engine/tests/golden_moe_gguf.rs, docs/moe-models.md "GGUF").

Each committed Hugging Face checkpoint (bf16, per-expert tensors, made by make_moe_goldens.py) is
converted by `convert_hf_to_gguf.py` (classes Qwen3MoeModel -> general.architecture `qwen3moe`,
Qwen3_5MoeTextModel -> `qwen35moe`): the experts stacked into `blk.N.ffn_{gate,up,down}_exps.weight`
[E, I, D] / [E, D, I], the router `ffn_gate_inp`, the shared expert `ffn_{gate,up,down}_shexp` and
its gate `ffn_gate_inp_shexp` [D], the keys `expert_count`, `expert_used_count`,
`expert_feed_forward_length`, `expert_shared_feed_forward_length`.

Outputs (tests/fixtures/golden/moe_gguf/):

    qwen3_moe-bf16.gguf     the converter's default for a bf16 checkpoint: the same values
    qwen3_moe-q8_0.gguf     --outtype q8_0 (blocks of 32 along rows of 64 and 8: the routed
                            experts' down projections (rows of 8) stay F16/BF16 as the converter
                            decides; see the manifest's tensor types)
    qwen3_5_moe-bf16.gguf   Qwen3.5-MoE hybrid (value heads tiled, norms stored 1 + w, ...)
    qwen3_5_moe-f16.gguf    --outtype f16
    manifest.json           versions, commands, sha256 of inputs and outputs, tensor types

F32 is not committed (twice the bytes, the same values as BF16 here), nor the converter's
`--fuse-gate-up-exps` file of qwen3_5_moe (experts as ffn_gate_up_exps; the test builds the same
layout from the BF16 file); the script writes them to /tmp/moe_gguf_f32/, and the test checks them
when pointed there: DRAFTLENS_MOE_GGUF_EXTRA=/tmp/moe_gguf_f32 cargo test -p draftlens-engine
--test golden_moe_gguf uncommitted.

The converter ships with the gguf-py it writes with in the llama-cpp-python sdist
(vendor/llama.cpp), as for make_gguf_drafters.py:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lcp
    tar xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp
    /root/.pyenv/versions/3.12.1/bin/python3.12 tools/golden/make_moe_gguf.py \\
        --llama-cpp /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp

The random models have no tokenizer and a vocabulary of 256 ids, so a byte-level BPE of 256 ids
(248 byte tokens and 8 two-letter merges, no special tokens) is written next to a copy of each checkpoint;
its pre-tokenizer hash is unknown to llama.cpp, so the converter is told "qwen2" (only the
tokenizer.ggml.pre string). Qwen3.5-MoE's checkpoint carries an `mtp.fc.weight` without MTP layers
(mtp_num_hidden_layers absent), which the converter's MTP export cannot count: `--no-mtp`.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

GOLDEN = "tests/fixtures/golden"
OUT = "tests/fixtures/golden/moe_gguf"
# (model, outtypes committed)
MODELS = [("qwen3_moe", ["bf16", "q8_0"]), ("qwen3_5_moe", ["bf16", "f16"])]


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def checkpoint_with_tokenizer(name, dir_):
    """A copy of the golden checkpoint plus a 256-token byte-level BPE (see the docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    os.makedirs(dir_)
    for f in ["config.json", "model.safetensors"]:
        shutil.copy(os.path.join(GOLDEN, name, f), dir_)
    byte_char = bytes_to_unicode()
    # 248 byte tokens (control bytes 1..8 left out) and 8 two-letter merges: 256 ids, and a
    # merges list (a gpt2-style GGUF vocabulary needs one; the converter writes none if empty).
    pairs = ["t h", "h e", "i n", "e r", "a n", "r e", "o n", "a t"]
    vocab = [byte_char[b] for b in range(256) if not 1 <= b <= 8] + [p.replace(" ", "") for p in pairs]
    assert len(vocab) == 256 and len(set(vocab)) == 256
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(vocab)},
                               merges=[tuple(p.split()) for p in pairs]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(dir_)


def convert(llama_cpp, model_dir, outtype, outfile, extra):
    """Run llama.cpp's convert_hf_to_gguf.py in a child Python with gguf-py from the same tree."""
    shim = (
        "import sys, runpy\n"
        f"sys.path[:0] = [{llama_cpp!r}, {os.path.join(llama_cpp, 'gguf-py')!r}]\n"
        "from conversion.base import TextModel\n"
        # sentencepiece is not needed: the converter tries a tokenizer.model first (none here).
        "def no_spm(self, *a, **k): raise FileNotFoundError('no tokenizer.model')\n"
        "TextModel._create_vocab_sentencepiece = no_spm\n"
        "TextModel.get_vocab_base_pre = lambda self, tokenizer: 'qwen2'\n"
        # llama.cpp's QWEN3MOE tensor list has only sparse MLPs; the golden's dense layer
        # (mlp_only_layers [1]) is written under the dense names every architecture uses.
        "import gguf\n"
        "T = gguf.MODEL_TENSOR\n"
        "gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN3MOE] += [T.FFN_GATE, T.FFN_UP, T.FFN_DOWN]\n"
        f"sys.argv = ['convert_hf_to_gguf.py', {model_dir!r}, '--outtype', {outtype!r},"
        f" '--outfile', {outfile!r}] + {extra!r}\n"
        f"runpy.run_path({os.path.join(llama_cpp, 'convert_hf_to_gguf.py')!r}, run_name='__main__')\n"
    )
    subprocess.run([sys.executable, "-c", shim], check=True)


def tensor_types(path, gguf):
    r = gguf.GGUFReader(path)
    types = {}
    for t in r.tensors:
        kind = t.name.split(".", 2)[-1] if t.name.startswith("blk.") else t.name
        types.setdefault(kind, set()).add(t.tensor_type.name)
    keys = {
        k: (f.contents() if hasattr(f, "contents") else None)
        for k, f in r.fields.items()
        if "expert" in k or k.endswith(".block_count") or k.endswith("feed_forward_length")
    }
    return {k: sorted(v) for k, v in sorted(types.items())}, keys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, help="vendor/llama.cpp of the llama-cpp-python sdist")
    ap.add_argument("--f32-dir", default="/tmp/moe_gguf_f32", help="where the uncommitted F32 files go")
    args = ap.parse_args()
    llama_cpp = os.path.abspath(args.llama_cpp)
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(args.f32_dir, exist_ok=True)
    sys.path[:0] = [os.path.join(llama_cpp, "gguf-py")]
    import gguf

    outputs, inputs, layout = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, outtypes in MODELS:
            ckpt = os.path.join(tmp, name)
            checkpoint_with_tokenizer(name, ckpt)
            inputs[name] = sha256(os.path.join(ckpt, "model.safetensors"))
            extra = ["--no-mtp"] if name == "qwen3_5_moe" else []
            for outtype in outtypes + ["f32"]:
                committed = outtype != "f32"
                out_dir = OUT if committed else args.f32_dir
                out = os.path.abspath(os.path.join(out_dir, f"{name}-{outtype}.gguf"))
                convert(llama_cpp, ckpt, outtype, out, extra)
                if outtype == "bf16" and name == "qwen3_5_moe":
                    # llama.cpp's fused experts (ffn_gate_up_exps), not committed: the test builds
                    # the same layout from the BF16 file; this is the converter's own, to compare.
                    fused = os.path.join(args.f32_dir, f"{name}-bf16-fused.gguf")
                    convert(llama_cpp, ckpt, outtype, fused, extra + ["--fuse-gate-up-exps"])
                if committed:
                    outputs[os.path.basename(out)] = sha256(out)
                    types, keys = tensor_types(out, gguf)
                    layout[os.path.basename(out)] = {"tensor_types": types, "keys": keys}

    manifest = {
        "what": "llama.cpp's convert_hf_to_gguf.py output for the random MoE goldens (tools/golden/make_moe_gguf.py)",
        "inputs_model_safetensors_sha256": inputs,
        "outputs_sha256": outputs,
        "layout": layout,
        "uncommitted": f"{args.f32_dir}/<model>-f32.gguf (--outtype f32), {args.f32_dir}/qwen3_5_moe-bf16-fused.gguf (--fuse-gate-up-exps)",
        "converter": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp/convert_hf_to_gguf.py <checkpoint + 256-token byte BPE> --outtype T [--no-mtp for qwen3_5_moe]; get_vocab_base_pre forced to 'qwen2'",
        "versions": {"python": sys.version.split()[0], "gguf_py": getattr(gguf, "__version__", "vendored")},
    }
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, default=str)
        f.write("\n")
    print(json.dumps({k: manifest[k] for k in ["outputs_sha256", "inputs_model_safetensors_sha256"]}, indent=1))


if __name__ == "__main__":
    main()
