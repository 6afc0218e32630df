"""Hidden states of a transformers model as a `draftlens parity --features` file
(docs/parity-features.md).

For each prompt of a draftlens prompt set (JSONL: `messages` go through the tokenizer's chat
template with the generation prompt, `prompt` is encoded as is), the target's greedy continuation,
then one forward with `output_hidden_states=True` over prompt + continuation, saved as

    PROMPT.layerL   [T, H] f32   decoder layer id L's output = hidden_states[L + 1]
    PROMPT.input_ids [T] int64   the tokens those rows are for

Usage (any transformers checkpoint; a GGUF file through `--gguf-file`, which needs the `gguf`
package):

    python tools/parity_features/transformers_features.py --model HuggingFaceTB/SmolLM2-135M-Instruct \
        --prompts prompts.jsonl --layers 1,8,15,22,27 --out features.safetensors
    draftlens parity --features features.safetensors --target TARGET --prompts prompts.jsonl \
        --drafter DRAFTER

Checked with transformers 5.17 / torch 2.11 on the CPU against the fixture target (docs/parity-features.md
§5 has the numbers).
"""

import argparse
import json

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a transformers model id or folder")
    ap.add_argument("--gguf-file", help="a GGUF file inside --model's folder")
    ap.add_argument("--prompts", required=True, help="the JSONL prompt set draftlens is given")
    ap.add_argument("--layers", required=True, help="decoder layer ids, e.g. the drafter's target_layer_ids")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, help="only the first N prompts")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    extra = {"gguf_file": a.gguf_file} if a.gguf_file else {}
    tok = AutoTokenizer.from_pretrained(a.model, **extra)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, **extra).eval()
    layers = [int(x) for x in a.layers.split(",")]
    n_layers = model.config.num_hidden_layers
    assert all(0 <= l < n_layers for l in layers), f"layer ids are 0..{n_layers - 1}"

    out = {}
    with open(a.prompts) as f:
        prompts = [json.loads(line) for line in f if line.strip()]
    for p in prompts[: a.limit]:
        if p.get("messages"):
            ids = tok.apply_chat_template(
                p["messages"], add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
            )["input_ids"]
        else:
            ids = tok(p["prompt"], return_tensors="pt").input_ids
        with torch.no_grad():
            seq = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.max_new_tokens, do_sample=False
            )
            hidden = model(seq, output_hidden_states=True).hidden_states
        for l in layers:
            # hidden_states[0] is the embedding: decoder layer id l's output is index l + 1.
            out[f"{p['id']}.layer{l}"] = hidden[l + 1][0].float().contiguous()
        out[f"{p['id']}.input_ids"] = seq[0].to(torch.int64).contiguous()
        print(f"{p['id']}: {ids.shape[1]} prompt tokens, {seq.shape[1]} in all")
    save_file(out, a.out)


if __name__ == "__main__":
    main()
