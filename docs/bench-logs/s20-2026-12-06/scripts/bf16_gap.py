"""How far transformers' own bf16 forward is from its f32 forward, per layer, on a random target: the
floor that any bf16 implementation (draftlens's CUDA backend included) is measured against in `parity`.
Relative L2 of hidden_states[i] (bf16 vs f32) over the first N HumanEval prompts, tokenized raw.
usage: python3 bf16_gap.py MODEL_DIR [N]"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer

path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4
tok = AutoTokenizer.from_pretrained(path)
prompts = [json.loads(l)["messages"][0]["content"] for l in open("crates/engine/builtin-prompts/humaneval.jsonl")][:n]
outs = {}
for dt in (torch.float32, torch.bfloat16):
    m = AutoModelForCausalLM.from_pretrained(path, dtype=dt, device_map="cuda")
    m.eval()
    hs = []
    with torch.no_grad():
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids.cuda()
            hs.append([h[0].float() for h in m(ids, output_hidden_states=True).hidden_states])
    outs[dt] = hs
    del m
    torch.cuda.empty_cache()
layers = len(outs[torch.float32][0])
print(f"{path}: transformers bf16 vs f32, {n} prompts")
for i in range(layers):
    num = sum(((b[i] - a[i]) ** 2).sum().item() for a, b in zip(outs[torch.float32], outs[torch.bfloat16]))
    den = sum((a[i] ** 2).sum().item() for a in outs[torch.float32])
    print(f"hidden_states[{i}]  rel_l2 {(num / den) ** 0.5:.3e}")
