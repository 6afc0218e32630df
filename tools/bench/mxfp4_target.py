#!/usr/bin/env python3
"""Turn a gpt-oss folder with fused bf16 experts (what `make_random_target.py --arch gpt-oss-*`
writes: `mlp.experts.gate_up_proj` [E, D, 2I], `mlp.experts.down_proj` [E, I, D]) into an MXFP4
checkpoint in place, as the published gpt-oss checkpoints store their experts
(docs/moe-models.md, "gpt-oss"): `{proj}_blocks` U8 [E, R, C/32, 16] and `{proj}_scales` U8
[E, R, C/32] with R the output rows (gate_up's alternating gate/up rows as they are) and C the
inputs, plus `quantization_config` {quant_method: mxfp4} in config.json.

Each group of 32 weights is quantised to the e2m1 value nearest to w / 2^s, with s the smallest
power of two that brings the group's largest magnitude to at most 6 (no 255 scale, no clipping).
The model is then the fused one up to that rounding; what matters for the benchmark
(tools/bench/mxfp4_packed_device.sh) is that both DRAFTLENS_MXFP4 modes read the same folder.

usage: python3 tools/bench/mxfp4_target.py DIR [--device cuda]
"""
import argparse
import json
import os

import torch
from safetensors.torch import load_file, save_file

# transformers' FP4_VALUES magnitudes (codes 0..7; code | 8 is the negative).
MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
MXFP4_CONFIG = {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4",
}


def quantise(w, device):
    """w [R, C] (the weight as [out, in]) -> blocks U8 [R, C/32, 16], scales U8 [R, C/32]."""
    r, c = w.shape
    g = w.to(device, torch.float32).reshape(r, c // 32, 32)
    amax = g.abs().amax(-1).clamp_min(2.0 ** -126)
    s = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    scaled = g / torch.pow(2.0, s)[..., None]
    mags = torch.tensor(MAGNITUDES, device=device)
    mids = (mags[1:] + mags[:-1]) / 2
    code = torch.bucketize(scaled.abs().contiguous(), mids) | ((scaled < 0).to(torch.int64) << 3)
    code = code.reshape(r, c)
    blocks = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8).reshape(r, c // 32, 16)
    return blocks.cpu(), (s + 127).to(torch.uint8).cpu()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    index_path = os.path.join(args.dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        index = json.load(open(index_path))
        shards = sorted(set(index["weight_map"].values()))
    else:
        index, shards = None, ["model.safetensors"]
    converted = 0
    for shard in shards:
        path = os.path.join(args.dir, shard)
        tensors = load_file(path)
        out = {}
        for name, t in tensors.items():
            if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
                # Stored as x @ W: [E, in, out]; MXFP4 rows are outputs.
                per_expert = [quantise(t[e].transpose(0, 1), args.device) for e in range(t.shape[0])]
                out[f"{name}_blocks"] = torch.stack([b for b, _ in per_expert]).contiguous()
                out[f"{name}_scales"] = torch.stack([s for _, s in per_expert]).contiguous()
                if index is not None:
                    del index["weight_map"][name]
                    index["weight_map"][f"{name}_blocks"] = shard
                    index["weight_map"][f"{name}_scales"] = shard
                converted += 1
            else:
                out[name] = t
        save_file(out, path, metadata={"format": "pt"})
        del tensors, out
    if index is not None:
        json.dump(index, open(index_path, "w"), indent=2)
    cfg_path = os.path.join(args.dir, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["quantization_config"] = MXFP4_CONFIG
    json.dump(cfg, open(cfg_path, "w"), indent=2)
    print(f"# {args.dir}: {converted} expert tensors as MXFP4 blocks and scales", flush=True)


if __name__ == "__main__":
    main()
