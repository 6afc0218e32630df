#!/usr/bin/env python3
"""Convert a DFlash drafter checkpoint to GGUF with llama.cpp's own convert_hf_to_gguf.py,
correctly or with one converter mistake made on purpose. Used by scripts/llamacpp-e2e.sh.

    convert.py --llama-cpp SRC/vendor/llama.cpp --drafter CKPT --target-dir DIR \\
        --outfile OUT.gguf [--outtype bf16] [--mistake layer-ids-unshifted]

The converter runs unchanged from llama.cpp's tree (with its gguf-py), with two shims that only
concern the tokenizer copy (as tools/golden/make_gguf_drafters.py does): sentencepiece is not
needed (the target has no tokenizer.model; the converter imports it before looking), and the
pre-tokenizer name is the target GGUF's own `tokenizer.ggml.pre` (--pre), since the tokenizer.json
written from the GGUF by target_dir.py is not byte-identical to the original one llama.cpp hashes.

--mistake layer-ids-unshifted: the converter writes the checkpoint's target_layer_ids as they are
into dflash.target_layers, without the + 1 llama.cpp needs (it reads them as layer *inputs*, the
checkpoint means layer *outputs*): every tap one layer early, the "layer ids off by one" bug.
"""

import argparse
import os
import runpy
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--target-dir", required=True)
    ap.add_argument("--outfile", required=True)
    ap.add_argument("--outtype", default="bf16")
    ap.add_argument("--pre", default=None, help="tokenizer.ggml.pre to write (the target GGUF's)")
    ap.add_argument("--mistake", choices=["none", "layer-ids-unshifted"], default="none")
    a = ap.parse_args()

    sys.path[:0] = [a.llama_cpp, os.path.join(a.llama_cpp, "gguf-py")]
    import gguf
    from conversion.base import TextModel

    def no_sentencepiece(self, *args, **kwargs):
        raise FileNotFoundError("no tokenizer.model")

    TextModel._create_vocab_sentencepiece = no_sentencepiece
    if a.pre:
        TextModel.get_vocab_base_pre = lambda self, tokenizer: a.pre
    if a.mistake == "layer-ids-unshifted":
        shifted = gguf.GGUFWriter.add_target_layers

        def unshifted(self, value):
            shifted(self, [i - 1 for i in value])

        gguf.GGUFWriter.add_target_layers = unshifted

    sys.argv = ["convert_hf_to_gguf.py", a.drafter, "--target-model-dir", a.target_dir,
                "--outtype", a.outtype, "--outfile", a.outfile]
    runpy.run_path(os.path.join(a.llama_cpp, "convert_hf_to_gguf.py"), run_name="__main__")


if __name__ == "__main__":
    main()
