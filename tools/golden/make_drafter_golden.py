#!/usr/bin/env python3
"""Golden outputs of the shipped reference DFlash drafters, for draftlens' drafter implementation.

CPU only, float32 (no GPU needed). Inputs are all committed or installable:
  - the drafter checkpoints under drafters/ (bf16 weights, upcast to f32),
  - the SmolLM2 golden hidden states (tests/fixtures/golden/smollm2/golden.safetensors; f16, upcast),
    used as the drafter's taps: tap id t reads `p1.hs{t+1}` (HF convention),
  - the target embedding / tied LM head, dequantised from the GGUF's Q8_0 `token_embd.weight`
    with the `gguf` package (the same dequantisation transformers uses).

For prompt p1 (code) of the SmolLM2 golden, at a few anchors a, the drafter runs exactly as in
deployment: context = taps of positions < a, block = [token_a, MASK x 15] at positions a..a+15.
Written to tests/fixtures/golden/drafter/golden.safetensors:

  {series}.a{a}.hidden      F16 [15, 576]  drafter output rows 1..15 after the drafter's own final norm
  {series}.a{a}.top8_ids    I64 [15, 8]    top-8 of the logits (hidden @ embedding^T) per row
  {series}.a{a}.top8_logits F32 [15, 8]    their logit values (raw, not log-softmax)

and manifest.json (checkpoints with their sha256, anchors, tokens, settings).

    python3 tools/golden/make_drafter_golden.py --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse
import hashlib
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "train-reference-drafter"))
import train  # noqa: E402  (the drafter definition the checkpoints were trained with)

ANCHORS = [51, 60, 80, 100]  # p1: prompt 51 tokens, continuation 64 -> positions 0..114
CHECKPOINTS = {"reference": "drafters/smollm2-reference/step-2581", "leaky": "drafters/smollm2-leaky/step-2581"}


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def load_embedding(gguf_path):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(gguf_path)
    t = next(t for t in r.tensors if t.name == "token_embd.weight")
    w = dequantize(t.data, t.tensor_type)
    return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))


def main():
    from safetensors.torch import load_file, save_file

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--golden", default="tests/fixtures/golden/smollm2/golden.safetensors")
    ap.add_argument("--out", default="tests/fixtures/golden/drafter")
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    E = load_embedding(a.gguf)
    assert E.shape == (49152, 576), E.shape
    g = load_file(a.golden)
    ids = torch.cat([g["p1.input_ids"], g["p1.greedy_ids"]])
    tensors, meta = {}, {}
    for series, path in CHECKPOINTS.items():
        drafter, cfg = train.load_checkpoint(path, "cpu")
        tap_ids = cfg["dflash_config"]["target_layer_ids"]
        taps = torch.cat([g[f"p1.hs{t + 1}"].float() for t in tap_ids], dim=-1)[None]  # [1, T, n*H]
        B = cfg["block_size"]
        for anc in ANCHORS:
            block = torch.full((1, 1, B), cfg["dflash_config"]["mask_token_id"], dtype=torch.long)
            block[0, 0, 0] = ids[anc]
            with torch.no_grad():
                h = drafter(taps, E[block], torch.tensor([[anc]]), inclusive=False)[0, 0, 1:]  # [B-1, H]
                logits = h @ E.T
            top = torch.topk(logits, 8, dim=-1)
            tensors[f"{series}.a{anc}.hidden"] = h.to(torch.float16).contiguous()
            tensors[f"{series}.a{anc}.top8_ids"] = top.indices.to(torch.int64).contiguous()
            tensors[f"{series}.a{anc}.top8_logits"] = top.values.float().contiguous()
        meta[series] = {
            "checkpoint": path,
            "model_safetensors_sha256": sha256(os.path.join(path, "model.safetensors")),
            "target_layer_ids": tap_ids,
            "taps_from": [f"p1.hs{t + 1}" for t in tap_ids],
        }
        print(f"{series}: top-1 per row at anchor {ANCHORS[0]}: {tensors[f'{series}.a{ANCHORS[0]}.top8_ids'][:, 0].tolist()}")
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "golden.safetensors")
    save_file(tensors, path)
    manifest = {
        "what": "drafter forward golden (tools/golden/make_drafter_golden.py), float32 on CPU",
        "prompt": "p1 (code) of tests/fixtures/golden/smollm2: taps = its f16 hidden states upcast to f32; block token 0 = token at the anchor, rows 1..15 = mask token",
        "anchors": ANCHORS,
        "anchor_tokens": {str(x): int(ids[x]) for x in ANCHORS},
        "context": "taps of positions < anchor (deployment mask); block positions anchor..anchor+15; bidirectional inside the block",
        "embedding": "GGUF token_embd.weight (Q8_0) dequantised by gguf 0.19.0; also the tied LM head",
        "checkpoints": meta,
        "golden_safetensors_sha256": sha256(path),
        "tolerance_note": "weights are bf16 values held exactly in f32; an f32 implementation should match hidden to ~1e-5 relative (f16 storage adds <= 4.9e-4) and reproduce every top-8 id whose logit gap exceeds ~1e-3",
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
    }
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
