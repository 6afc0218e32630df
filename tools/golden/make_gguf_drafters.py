#!/usr/bin/env python3
"""GGUF drafters written by llama.cpp's own converter, for draftlens' GGUF drafter loader and
`lint --against` (crates/engine/src/drafter/gguf/, docs/gguf-drafters.md).

A small random-weight DFlash drafter is written in the z-lab layout (config.json +
model.safetensors, bf16) for the random Qwen3 golden target (tests/fixtures/golden/qwen3:
hidden 128, 4 layers, vocabulary 512), then converted by llama.cpp's `convert_hf_to_gguf.py`
(`DFlashModel`, general.architecture = dflash) twice: `--outtype bf16` (the same values, so the
records must equal the checkpoint's exactly) and `--outtype q8_0` (lint --against's quantisation
tolerance). The EAGLE-3 golden checkpoint (tests/fixtures/golden/eagle3, SpecForge layout) is
converted the same way (`--outtype bf16`; llama.cpp's `LlamaModel` in EAGLE-3 mode, architecture
eagle3), from a copy whose taps are also given at the top level (see `main`).

The converter is not pip-installable on its own: it ships, with the gguf-py it writes with, in
the sdist of llama-cpp-python (vendor/llama.cpp). Version used: llama-cpp-python 0.3.36 (the
newest on PyPI when this was written; it has conversion/qwen.py DFlashModel and
conversion/llama.py's EAGLE-3 mode). To get it:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lcp
    # (pip then tries to build it; the .tar.gz it fetched first is all that is needed)
    tar xzf llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp

The converter needs the target's tokenizer (`--target-model-dir`) and only writes it into the
GGUF; draftlens reads the drafter's tensors and its dflash.* / eagle3.* keys, never that copy.
The golden target has no tokenizer, so a tiny byte-level BPE of at most 512 ids is trained here
and put next to a copy of the target's config.json. llama.cpp recognises a tokenizer's
pre-tokenizer by hashing how it splits a fixed text; this one is unknown to it, so the script
tells the converter it is "qwen2" (the Qwen3 pre-tokenizer), which touches only the
tokenizer.ggml.pre string.

Written to tests/fixtures/golden/gguf_drafters/:

    dflash/config.json, dflash/model.safetensors   the HF checkpoint (converter input)
    dflash-bf16.gguf, dflash-q8_0.gguf            llama.cpp's conversions of it
    eagle3-bf16.gguf                              llama.cpp's conversion of ../eagle3
    manifest.json                                 versions, commands, sha256s

    /root/.pyenv/versions/3.12.1/bin/python3.12 tools/golden/make_gguf_drafters.py \\
        --llama-cpp /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import save_file

TARGET = "tests/fixtures/golden/qwen3"
EAGLE3 = "tests/fixtures/golden/eagle3"
OUT = "tests/fixtures/golden/gguf_drafters"
SEED = 20261207
# The drafter: 2 layers of the target's width, heads of 32 (not the target's 64), taps [0, 2]
# (stored by the converter as [1, 3]: both in range, so a missing un-shift is silent).
D, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER = 128, 2, 4, 2, 32, 96
TAPS, BLOCK, MASK_ID = [0, 2], 8, 500


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def write_dflash(dir_):
    os.makedirs(dir_, exist_ok=True)
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": BLOCK,
        "dflash_config": {"mask_token_id": MASK_ID, "target_layer_ids": TAPS},
        "num_target_layers": 4,
        "num_hidden_layers": LAYERS,
        "hidden_size": D,
        "intermediate_size": INTER,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "attention_bias": False,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "vocab_size": 512,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "layer_types": ["full_attention"] * LAYERS,
    }
    with open(os.path.join(dir_, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    g = torch.Generator().manual_seed(SEED)

    def mat(out, inp):
        # Uniform with the fan-in's scale: activations stay O(1) through the layers.
        return ((torch.rand(out, inp, generator=g) * 2 - 1) / inp**0.5 * 1.7).to(torch.bfloat16)

    def norm(n):
        return (1 + 0.3 * (torch.rand(n, generator=g) * 2 - 1)).to(torch.bfloat16)

    t = {"fc.weight": mat(D, len(TAPS) * D), "hidden_norm.weight": norm(D), "norm.weight": norm(D)}
    qd, kvd = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    for i in range(LAYERS):
        p = f"layers.{i}"
        t[f"{p}.input_layernorm.weight"] = norm(D)
        t[f"{p}.self_attn.q_proj.weight"] = mat(qd, D)
        t[f"{p}.self_attn.k_proj.weight"] = mat(kvd, D)
        t[f"{p}.self_attn.v_proj.weight"] = mat(kvd, D)
        t[f"{p}.self_attn.o_proj.weight"] = mat(D, qd)
        t[f"{p}.self_attn.q_norm.weight"] = norm(HEAD_DIM)
        t[f"{p}.self_attn.k_norm.weight"] = norm(HEAD_DIM)
        t[f"{p}.post_attention_layernorm.weight"] = norm(D)
        t[f"{p}.mlp.gate_proj.weight"] = mat(INTER, D)
        t[f"{p}.mlp.up_proj.weight"] = mat(INTER, D)
        t[f"{p}.mlp.down_proj.weight"] = mat(D, INTER)
    save_file(t, os.path.join(dir_, "model.safetensors"), metadata={"format": "pt"})
    return len(t)


def write_dflash2(dir_):
    """The DFlash2 golden's checkpoint (tools/golden/make_dflash2_golden.py: its config, its
    weights by the same rule, its stored final norm), rounded to bf16 so that llama.cpp's bf16
    conversion holds the same values."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_dflash2_golden as d2
    from safetensors.torch import load_file

    os.makedirs(dir_, exist_ok=True)
    with open(os.path.join(dir_, "config.json"), "w") as f:
        json.dump(d2.config(), f, indent=2)
    w = {name: d2.formula(name, shape, kind, scale) for name, shape, kind, scale in d2.weight_rules()}
    w["norm.weight"] = load_file("tests/fixtures/golden/dflash2/golden.safetensors")["weights.norm.weight"]
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in w.items()}, os.path.join(dir_, "model.safetensors"))
    return len(w)


def write_target_with_tokenizer(dir_):
    """The golden target's config.json plus a byte-level BPE of at most 512 ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    os.makedirs(dir_, exist_ok=True)
    shutil.copy(os.path.join(TARGET, "config.json"), dir_)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["def f(x):\n    return x * 2\n", "The quick brown fox jumps over the lazy dog.",
            "speculative decoding drafts tokens that the target verifies"] * 20
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.save_pretrained(dir_)
    assert len(fast) <= 512, len(fast)


def convert(llama_cpp, model_dir, target_dir, outtype, outfile):
    """Run llama.cpp's convert_hf_to_gguf.py in a child Python with gguf-py from the same tree."""
    shim = (
        "import sys, runpy\n"
        f"sys.path[:0] = [{llama_cpp!r}, {os.path.join(llama_cpp, 'gguf-py')!r}]\n"
        "from conversion.base import TextModel\n"
        # sentencepiece is not installed here and not needed: the converter imports it before it
        # looks for a tokenizer.model (the target has none) and then falls back to tokenizer.json.
        "def no_spm(self, *a, **k): raise FileNotFoundError('no tokenizer.model')\n"
        "TextModel._create_vocab_sentencepiece = no_spm\n"
        # The trained tokenizer's pre-tokenizer hash is unknown to llama.cpp (see the docstring).
        "TextModel.get_vocab_base_pre = lambda self, tokenizer: 'qwen2'\n"
        f"sys.argv = ['convert_hf_to_gguf.py', {model_dir!r}, '--target-model-dir', {target_dir!r},"
        f" '--outtype', {outtype!r}, '--outfile', {outfile!r}]\n"
        f"runpy.run_path({os.path.join(llama_cpp, 'convert_hf_to_gguf.py')!r}, run_name='__main__')\n"
    )
    subprocess.run([sys.executable, "-c", shim], check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, help="vendor/llama.cpp of the llama-cpp-python sdist")
    args = ap.parse_args()
    llama_cpp = os.path.abspath(args.llama_cpp)
    os.makedirs(OUT, exist_ok=True)
    n_tensors = write_dflash(os.path.join(OUT, "dflash"))
    n_tensors2 = write_dflash2(os.path.join(OUT, "dflash2"))
    outputs = {}
    with tempfile.TemporaryDirectory() as tmp:
        target = os.path.join(tmp, "target")
        write_target_with_tokenizer(target)
        for outtype in ["bf16", "q8_0"]:
            out = os.path.join(OUT, f"dflash-{outtype}.gguf")
            convert(llama_cpp, os.path.abspath(os.path.join(OUT, "dflash")), target, outtype, os.path.abspath(out))
            outputs[os.path.basename(out)] = sha256(out)
        # The converter reads only a top-level eagle_aux_hidden_state_layer_ids (vLLM's layer-input
        # convention) and otherwise writes its default [2, L/2, L-3]; the golden, like SpecForge,
        # nests its taps (layer outputs) under eagle_config. A copy with the equivalent top-level
        # ids (each + 1) converts correctly; the default's mistake is made in the Rust tests.
        eagle = os.path.join(tmp, "eagle3")
        shutil.copytree(EAGLE3, eagle)
        with open(os.path.join(eagle, "config.json")) as f:
            cfg = json.load(f)
        cfg["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
        with open(os.path.join(eagle, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        out = os.path.join(OUT, "eagle3-bf16.gguf")
        convert(llama_cpp, eagle, target, "bf16", os.path.abspath(out))
        outputs[os.path.basename(out)] = sha256(out)
        out = os.path.join(OUT, "dflash2-bf16.gguf")
        convert(llama_cpp, os.path.abspath(os.path.join(OUT, "dflash2")), target, "bf16", os.path.abspath(out))
        outputs[os.path.basename(out)] = sha256(out)
    sys.path[:0] = [os.path.join(llama_cpp, "gguf-py")]
    import gguf

    manifest = {
        "what": "llama.cpp's convert_hf_to_gguf.py output for a random DFlash drafter and the EAGLE-3 golden (tools/golden/make_gguf_drafters.py)",
        "dflash": {
            "checkpoint": "dflash/ (z-lab layout, bf16, seed %d)" % SEED,
            "target": TARGET,
            "target_layer_ids": TAPS,
            "stored_target_layers": [i + 1 for i in TAPS],
            "mask_token_id": MASK_ID,
            "block_size": BLOCK,
            "hf_tensors": n_tensors,
            "model_safetensors_sha256": sha256(os.path.join(OUT, "dflash", "model.safetensors")),
        },
        "dflash2": {
            "checkpoint": "dflash2/ (the DFlash2 golden's config and weights, bf16)",
            "hf_tensors": n_tensors2,
            "model_safetensors_sha256": sha256(os.path.join(OUT, "dflash2", "model.safetensors")),
        },
        "eagle3": {"checkpoint": EAGLE3, "model_safetensors_sha256": sha256(os.path.join(EAGLE3, "model.safetensors"))},
        "outputs_sha256": outputs,
        "converter": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp/convert_hf_to_gguf.py --target-model-dir <golden target + trained BPE> --outtype {bf16,q8_0}; get_vocab_base_pre forced to 'qwen2'",
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "gguf_py": getattr(gguf, "__version__", "vendored")},
    }
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main()
