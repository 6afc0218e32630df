#!/usr/bin/env python3
"""A Hugging Face folder (config.json + tokenizer) for a GGUF target, for llama.cpp's converter.

llama.cpp's `convert_hf_to_gguf.py` converts a DFlash drafter only with `--target-model-dir`, a
Hugging Face folder of the target whose tokenizer it copies into the drafter's GGUF (llama.cpp's
speculative decoding then refuses a drafter whose vocabulary differs from the target's). The
fixtures hold the target only as a GGUF file (models/SmolLM2-135M-Instruct.Q4_1.gguf), so this
writes the folder from it with transformers' own GGUF reader (`gguf_file=`): the tokenizer
(tokenizer.json, tokenizer_config.json) and config.json. No weights: the converter reads none.

    python3 tools/llamacpp_e2e/target_dir.py models/SmolLM2-135M-Instruct.Q4_1.gguf OUT_DIR

Needs transformers and the `gguf` module (llama.cpp's gguf-py on PYTHONPATH will do).
"""

import os
import sys

from transformers import AutoConfig, AutoTokenizer


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: target_dir.py TARGET.gguf OUT_DIR")
    gguf_path, out = sys.argv[1], sys.argv[2]
    folder, name = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    cfg = AutoConfig.from_pretrained(folder, gguf_file=name)
    # The converter picks the target's tokenizer handler by config.json's `architectures`, which
    # a config read from a GGUF file does not carry.
    if not cfg.architectures:
        cfg.architectures = [{"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[cfg.model_type]]
    os.makedirs(out, exist_ok=True)
    tok.save_pretrained(out)
    cfg.save_pretrained(out)
    print(f"target_dir: {out}: {type(cfg).__name__}, {len(tok)} tokens")


if __name__ == "__main__":
    main()
