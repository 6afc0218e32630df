"""Hugging Face transformers baseline for the extraction benchmark (docs/benchmarks-cuda.md).

Qwen3-8B shapes with random weights (bf16, attn_implementation="sdpa", built directly on the GPU),
the same workloads as `cuda_bench`:
  1. fixed length: 4 sequences x 4096 tokens per forward, hidden states kept on the GPU
     (output_hidden_states=True; the 5 DFlash taps hs[2,10,18,26,34] are what extraction keeps);
  2. the realistic mix (tools/bench/mix_lengths.txt): batches of 8 prompts in file order, right
     padded to the longest of the batch with an attention mask (what a transformers user does);
     also sorted by length (the best case for padding).
Prints one JSON line: {"fixed": {...}, "mix_in_order": {...}, "mix_sorted": {...}}.

usage: python3 tools/bench/hf_extract.py [--layers 36] [--mix tools/bench/mix_lengths.txt] [--reps 5]
"""
import argparse, json, statistics, time

import torch
from transformers import Qwen3Config, Qwen3Model

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=36)
ap.add_argument("--mix", default="tools/bench/mix_lengths.txt")
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--batch", type=int, default=8)
args = ap.parse_args()

cfg = Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=args.layers,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
                  max_position_embeddings=40960, tie_word_embeddings=False, attn_implementation="sdpa")
try:
    cfg._attn_implementation = "sdpa"
except Exception:  # read-only in some transformers versions; the constructor argument already set it
    pass
torch.manual_seed(0)
t0 = time.time()
prev = torch.get_default_dtype()
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = Qwen3Model(cfg)
torch.set_default_dtype(prev)
model.eval()
torch.cuda.synchronize()
print(f"# HF Qwen3Model ({args.layers} layers) built on the GPU in {time.time() - t0:.1f} s, "
      f"transformers attn={model.config._attn_implementation}", flush=True)
TAPS = [2, 10, 18, 26, 34]


def timed(fn, reps, warmup=1):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


res = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
with torch.inference_mode():
    ids = torch.randint(0, cfg.vocab_size, (4, 4096), device="cuda")

    def fixed():
        out = model(input_ids=ids, output_hidden_states=True)
        return [out.hidden_states[i] for i in TAPS if i < len(out.hidden_states)]

    s = timed(fixed, args.reps)
    n = ids.numel()
    res["fixed"] = {"tokens_per_forward": n, "s_per_forward": s, "tokens_per_s": n / s, "s_per_1m_tokens": 1e6 / (n / s)}
    print(f"# fixed 4x4096: {s:.3f} s/forward, {n / s:.0f} tok/s", flush=True)

    lens = [int(x) for x in open(args.mix) if x.strip()]

    def mix_run(order):
        def run():
            for b in range(0, len(order), args.batch):
                chunk = order[b:b + args.batch]
                m = max(chunk)
                x = torch.randint(0, cfg.vocab_size, (len(chunk), m), device="cuda")
                mask = torch.zeros((len(chunk), m), dtype=torch.long, device="cuda")
                for r, l in enumerate(chunk):
                    mask[r, :l] = 1
                out = model(input_ids=x, attention_mask=mask, output_hidden_states=True)
                _ = [out.hidden_states[i] for i in TAPS if i < len(out.hidden_states)]
        return run

    total = sum(lens)
    for name, order in (("mix_in_order", lens), ("mix_sorted", sorted(lens))):
        s = timed(mix_run(order), max(1, args.reps // 2))
        padded = sum(max(order[b:b + args.batch]) * len(order[b:b + args.batch]) for b in range(0, len(order), args.batch))
        res[name] = {"sequences": len(lens), "tokens": total, "padded_tokens": padded, "batch": args.batch, "s": s, "tokens_per_s": total / s}
        print(f"# {name}: {total} tokens ({padded} padded) in {s:.3f} s, {total / s:.0f} tok/s", flush=True)
print("JSON", json.dumps(res))
