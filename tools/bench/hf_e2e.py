"""The plain transformers script a user would write instead of `draftlens extract` / `draftlens run`
(docs/benchmarks-cuda.md, "End to end"): load the target, greedy-decode every prompt's continuation
in batches, then one forward per batch over prompt + continuation with `output_hidden_states`,
keeping the DFlash taps and the target's top-K, and write them to disk.

Same work as draftlens: chat template with the generation prompt, greedy `max_new_tokens`, stop at
EOS, the taps of prompt + continuation (HF `hidden_states[i + 1]` for tap layer i), top-8
log-probs at every position, results saved (safetensors, one file per batch).

With `--drafters DIR` (a folder of DFlash checkpoints) it also does what `draftlens run` does, the
way a training team's own evaluation would: every checkpoint drafts a block at every completion
anchor from the taps kept on the GPU (the PyTorch drafter of tools/train-reference-drafter/train.py,
bf16 autocast, context strictly before the anchor), and replayed τ is computed from the target's
greedy tokens (train.py's `evaluate`).

usage: python3 tools/bench/hf_e2e.py --model DIR --prompts data/prompts/humaneval.jsonl
           [--limit N] [--max-new 128] [--batch 32] [--layers 1,9,17,25,33] [--out /tmp/hf_out]
           [--drafters DIR]
Prints one JSON line with the phase times (load, generate, extract, save, drafters, total).
"""
import argparse, json, os, time

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--prompts", required=True)
ap.add_argument("--limit", type=int, default=0)
ap.add_argument("--max-new", type=int, default=128)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--layers", default="1,9,17,25,33")
ap.add_argument("--topk", type=int, default=8)
ap.add_argument("--out", default="/tmp/hf_out")
ap.add_argument("--attn", default="sdpa")
ap.add_argument("--drafters", default=None)
args = ap.parse_args()
taps = [int(x) for x in args.layers.split(",")]

t0 = time.perf_counter()
tok = AutoTokenizer.from_pretrained(args.model)
tok.padding_side = "left"
if tok.pad_token is None:
    tok.pad_token = tok.eos_token
model = AutoModelForCausalLM.from_pretrained(
    args.model, dtype=torch.bfloat16, device_map="cuda", attn_implementation=args.attn
)
model.eval()
torch.cuda.synchronize()
t_load = time.perf_counter() - t0

rows = [json.loads(l) for l in open(args.prompts) if l.strip()]
if args.limit:
    rows = rows[: args.limit]
texts = []
for r in rows:
    if "messages" in r:
        texts.append(tok.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True))
    else:
        texts.append(r["prompt"])

os.makedirs(args.out, exist_ok=True)
t_gen = t_ext = t_save = 0.0
keep_seqs, keep_prompt_len, keep_taps = [], [], []
n_tokens = 0
with torch.inference_mode():
    for b in range(0, len(texts), args.batch):
        enc = tok(texts[b : b + args.batch], return_tensors="pt", padding=True, add_special_tokens=False).to("cuda")
        t = time.perf_counter()
        gen = model.generate(**enc, max_new_tokens=args.max_new, do_sample=False, pad_token_id=tok.pad_token_id)
        torch.cuda.synchronize()
        t_gen += time.perf_counter() - t
        t = time.perf_counter()
        mask = (gen != tok.pad_token_id).long()
        mask[:, : enc["attention_mask"].shape[1]] = enc["attention_mask"]
        out = model(input_ids=gen, attention_mask=mask, output_hidden_states=True)
        logp = torch.log_softmax(out.logits.float(), dim=-1)
        top = torch.topk(logp, args.topk, dim=-1)
        kept = {f"hs{i}": out.hidden_states[i + 1].contiguous() for i in taps}
        kept["topk_ids"] = top.indices.to(torch.int32).contiguous()
        kept["topk_logprobs"] = top.values.contiguous()
        kept["mask"] = mask.to(torch.int32)
        torch.cuda.synchronize()
        t_ext += time.perf_counter() - t
        t = time.perf_counter()
        save_file({k: v.cpu() for k, v in kept.items()}, f"{args.out}/batch{b // args.batch}.safetensors")
        t_save += time.perf_counter() - t
        n_tokens += int(mask.sum())
        if args.drafters:
            for r in range(gen.shape[0]):
                real = mask[r].bool()
                keep_seqs.append(gen[r][real].tolist())
                keep_prompt_len.append(int(enc["attention_mask"][r].sum()))
                keep_taps.append(torch.stack([out.hidden_states[i + 1][r][real] for i in taps], dim=1))
        del out, logp, top, kept
drafter_results = {}
t_draft = 0.0
if args.drafters:
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "train-reference-drafter"))
    import train as tr

    t = time.perf_counter()
    N, Smax = len(keep_seqs), max(len(x) for x in keep_seqs)
    H = model.config.hidden_size
    tap_tensor = torch.zeros((N, Smax, len(taps), H), dtype=torch.bfloat16, device="cuda")
    for i, x in enumerate(keep_taps):
        tap_tensor[i, : x.shape[0]] = x
    conts = [s[p:] for s, p in zip(keep_seqs, keep_prompt_len)]
    data = tr.SeqData([str(i) for i in range(N)], [s[:p] for s, p in zip(keep_seqs, keep_prompt_len)], conts,
                      tap_tensor, None, [i + 1 for i in taps], "cuda")
    E = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    for ck in sorted(os.listdir(args.drafters)):
        path = os.path.join(args.drafters, ck)
        drafter, cfg = tr.load_checkpoint(path, "cuda")
        tr.MASK_TOKEN_ID = cfg["dflash_config"]["mask_token_id"]
        with torch.inference_mode():
            per_seq = tr.draft_all_anchors(drafter, cfg, data, E, head, False, "cuda")
        ev = tr.evaluate(per_seq, cfg, False)
        drafter_results[ck] = round(ev["replayed_tau_pooled"], 4)
        del drafter
    torch.cuda.synchronize()
    t_draft = time.perf_counter() - t
total = time.perf_counter() - t0
print(json.dumps({
    "tool": "transformers", "torch": torch.__version__, "prompts": len(texts), "tokens": n_tokens,
    "batch": args.batch, "max_new": args.max_new, "load_s": round(t_load, 2), "generate_s": round(t_gen, 2),
    "extract_s": round(t_ext, 2), "save_s": round(t_save, 2), "drafters_s": round(t_draft, 2), "tau_pooled": drafter_results,
    "total_s": round(total, 2),
    "peak_gpu_gb": round(torch.cuda.max_memory_allocated() / 1e9, 1),
}), flush=True)
