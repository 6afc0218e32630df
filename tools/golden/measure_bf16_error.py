#!/usr/bin/env python3
"""transformers' own bf16 error on a committed golden: the yardstick of the CUDA golden checks.

    python3 tools/golden/measure_bf16_error.py tests/fixtures/golden/NAME [...]

For each golden folder (config.json, model.safetensors, golden.safetensors with p{i}.input_ids and
p{i}.greedy_ids, manifest.json), runs the model with transformers on the CPU in float32 and in
bfloat16 (eager attention) over each golden prompt followed by its greedy continuation, and writes
NAME/bf16_error.json: per prompt, the relative L2 distance of every hidden state (HF index 0 =
embeddings … L = final-norm output) between the two runs. The CUDA backend computes in bf16; where
its distance from the golden stays within a small multiple of what bf16 costs transformers itself
on the same model, it is as close as bf16 allows (crates/engine/tests/cuda_moe.rs, docs/cuda.md
"Tolerances and why"). A tiny model with a wide initialisation (the gpt-oss golden: hidden 32,
initializer_range 0.2) loses far more to bf16 than a realistic one, which is why a fixed bound does
not fit every golden. transformers 5.17, torch 2.11 (CPU).
"""
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def hidden_states(folder, golden, prompts, dtype):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager").eval()
    out = []
    for p in range(prompts):
        ids = torch.cat([golden[f"p{p}.input_ids"].long().flatten(),
                         golden[f"p{p}.greedy_ids"].long().flatten()])[None]
        with torch.no_grad():
            hs = model(ids, output_hidden_states=True).hidden_states
        out.append([h[0].float() for h in hs])
    return out


for folder in sys.argv[1:]:
    golden = load_file(f"{folder}/golden.safetensors")
    prompts = len(json.load(open(f"{folder}/manifest.json"))["prompts"])
    f32 = hidden_states(folder, golden, prompts, torch.float32)
    b16 = hidden_states(folder, golden, prompts, torch.bfloat16)
    rel = [[round(((b - a).norm() / a.norm()).item(), 6) for a, b in zip(f32[p], b16[p])]
           for p in range(prompts)]
    doc = {
        "what": "transformers' own bf16 vs float32 relative L2 distance of every hidden state, per prompt "
                "(tools/golden/measure_bf16_error.py; transformers 5.17, torch 2.11, CPU, eager attention)",
        "rel_l2": rel,
    }
    with open(f"{folder}/bf16_error.json", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(folder, rel)
