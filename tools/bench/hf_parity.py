"""Parity with Hugging Face transformers, Python half (docs/cuda.md).

Reads the checkpoint and draftlens' hidden states written by `cuda_hf_parity DIR`, runs
transformers on the same inputs twice — bf16 with attn_implementation="sdpa" (what production
PyTorch stacks run) and fp32 "eager" with TF32 off (the gold reference) — and compares, for every
hidden-state index: draftlens CUDA, draftlens CPU and HF bf16 against the fp32 gold, and draftlens
CUDA against HF bf16 directly. Also greedy-token agreement. Prints a table and one JSON line.

usage: python3 tools/bench/hf_parity.py DIR
"""
import json, sys

import torch
from safetensors.torch import load_file
from transformers import Qwen3ForCausalLM

d = sys.argv[1]
ours = load_file(f"{d}/draftlens_hidden.safetensors")
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False


def load(dtype, attn):
    try:
        m = Qwen3ForCausalLM.from_pretrained(d, dtype=dtype, attn_implementation=attn)
    except TypeError:
        m = Qwen3ForCausalLM.from_pretrained(d, torch_dtype=dtype, attn_implementation=attn)
    return m.cuda().eval()


m16, m32 = load(torch.bfloat16, "sdpa"), load(torch.float32, "eager")


def metrics(ref, x):
    ref, x = ref.double().flatten(), x.double().flatten()
    e = x - ref
    return {"rel_l2": (e.norm() / ref.norm()).item(), "max_abs": e.abs().max().item(),
            "cos": torch.nn.functional.cosine_similarity(ref, x, dim=0).item()}


n_prompts = sum(1 for k in ours if k.startswith("ids.p"))
rows, greedy = {}, {"hf_bf16_vs_gold": [0, 0], "cuda_vs_gold": [0, 0], "cuda_vs_hf_bf16": [0, 0], "cpu_vs_gold": [0, 0]}
with torch.inference_mode():
    for j in range(n_prompts):
        ids = ours[f"ids.p{j}"].long()[None].cuda()
        o16 = m16(input_ids=ids, output_hidden_states=True)
        o32 = m32(input_ids=ids, output_hidden_states=True)
        L = len(o32.hidden_states)
        for i in range(L):
            gold = o32.hidden_states[i][0].float().cpu()
            hf16 = o16.hidden_states[i][0].float().cpu()
            cu = ours[f"cuda.hs.{i}.p{j}"]
            cp = ours[f"cpu.hs.{i}.p{j}"]
            acc = rows.setdefault(i, {"gold": [], "hf16": [], "cuda": [], "cpu": []})
            acc["gold"].append(gold); acc["hf16"].append(hf16); acc["cuda"].append(cu); acc["cpu"].append(cp)
        g32 = o32.logits[0].argmax(-1).cpu()
        g16 = o16.logits[0].argmax(-1).cpu()
        gcu = ours[f"cuda.greedy.p{j}"].long()
        gcp = ours[f"cpu.greedy.p{j}"].long()
        for k, (a, b) in {"hf_bf16_vs_gold": (g16, g32), "cuda_vs_gold": (gcu, g32), "cuda_vs_hf_bf16": (gcu, g16), "cpu_vs_gold": (gcp, g32)}.items():
            greedy[k][0] += (a == b).sum().item(); greedy[k][1] += a.numel()

out = {"layers": []}
print(f"{'index':>5} | {'HF bf16 vs gold':>24} | {'draftlens CUDA vs gold':>24} | {'draftlens CPU vs gold':>24} | {'CUDA vs HF bf16':>24}")
print(f"{'':>5} | {'rel_l2':>11} {'cos':>12} | {'rel_l2':>11} {'cos':>12} | {'rel_l2':>11} {'cos':>12} | {'rel_l2':>11} {'cos':>12}")
for i in sorted(rows):
    cat = {k: torch.cat(v) for k, v in rows[i].items()}
    r = {"index": i, "hf_bf16_vs_gold": metrics(cat["gold"], cat["hf16"]), "cuda_vs_gold": metrics(cat["gold"], cat["cuda"]),
         "cpu_vs_gold": metrics(cat["gold"], cat["cpu"]), "cuda_vs_hf_bf16": metrics(cat["hf16"], cat["cuda"])}
    out["layers"].append(r)
    f = lambda m: f"{m['rel_l2']:>11.3e} {m['cos']:>12.8f}"
    print(f"{i:>5} | {f(r['hf_bf16_vs_gold'])} | {f(r['cuda_vs_gold'])} | {f(r['cpu_vs_gold'])} | {f(r['cuda_vs_hf_bf16'])}")
out["greedy_agreement"] = {k: v[0] / max(1, v[1]) for k, v in greedy.items()}
out["greedy_positions"] = greedy["cuda_vs_gold"][1]
print("greedy agreement:", {k: f"{v[0]}/{v[1]}" for k, v in greedy.items()})
print("JSON", json.dumps(out))
