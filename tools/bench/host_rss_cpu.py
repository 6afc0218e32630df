"""Host memory of loading a target, measured on the CPU (docs/loading.md, "Host memory").

Builds a random-weight Qwen3-MoE folder with transformers on the CPU (bf16, `save_pretrained`,
per-expert tensors as the published checkpoints: 2 layers, hidden 1024, 64 experts of width 512,
top-8, Qwen3's 151,936-token vocabulary, untied: 0.52 B parameters, 1.0 GB), then runs
`draftlens bench-load --backend cpu --json` on it and on the repository's SmolLM2 GGUF, and prints
the peak resident set (VmHWM) next to the f32 weights the CPU backend holds by design (4 bytes a
parameter, `inspect --json`'s `parameters`) and the file size. What loading adds on top of the
f32 weights is the file's pages still resident and the host copies in flight.

usage: python3 tools/bench/host_rss_cpu.py [--draftlens target/debug/draftlens] [--out /tmp/rss_moe]
"""

import argparse
import json
import os
import subprocess


def build_moe(out):
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    if os.path.exists(os.path.join(out, "config.json")):
        return
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, moe_intermediate_size=512,
        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
        num_experts=64, num_experts_per_tok=8, norm_topk_prob=True, tie_word_embeddings=False,
        max_position_embeddings=4096,
    )
    model = Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)


def measure(draftlens, model):
    def run(*args):
        return json.loads(subprocess.check_output([draftlens, *args, "--json"], text=True))

    info = run("inspect", model)
    load = run("bench-load", model, "--backend", "cpu")
    f32 = 4 * info["parameters"] / 2**20
    peak = load["peak_rss_mib"]
    print(
        f"{model}: files {load['bytes'] / 2**20:.0f} MiB, f32 weights {f32:.0f} MiB, "
        f"peak RSS {peak:.0f} MiB, beyond the f32 weights {peak - f32:.0f} MiB "
        f"(load {load['upload_s']:.1f} s)"
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--draftlens", default="target/debug/draftlens")
    ap.add_argument("--out", default="/tmp/rss_moe")
    a = ap.parse_args()
    build_moe(a.out)
    for model in [a.out, "models/SmolLM2-135M-Instruct.Q4_1.gguf"]:
        measure(a.draftlens, model)


if __name__ == "__main__":
    main()
