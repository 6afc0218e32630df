#!/usr/bin/env python3
"""The cheap CPU test of the numeric-profile demo's target knobs (README.md, "Numeric-profile demo").

Before a GPU run of tools/bench/profile_demo.sh, check on the CPU that a knob setting gives text a
small drafter can learn. For each setting EMBED:GDN_OUT:ACTIVE_VOCAB it builds the demo target
(tools/bench/make_random_target.py --arch qwen3.5-demo-8l, on the CPU), decodes greedy continuations
one prompt at a time (transformers, fp32: the torch path) and prints

- `distinct`: distinct tokens per continuation (mean; the continuation length is --max-new);
- `bigram`: the share of positions whose next token is the most frequent successor of the current
  token, the successor table counted on the *other* half of the prompts (held out: a table that
  memorised its own positions would score 1);
- `loops`: continuations that end in a repeating cycle of at most 32 tokens.

With `--draftlens BIN` it also runs `BIN parity --backends cpu,cpu --gdn-profiles
reference,engine --json` on the same target and keeps its JSON next to the target
(`parity.json`): how far the two numeric profiles' hidden states sit apart, the other half of the
question (README: a drafter loses τ on the wrong profile through its inputs, not through the rare
greedy tokens that change).

    python3 tools/train-reference-drafter/demo_knobs.py --settings 50:20:1024,100:20:1024 \\
        --prompts 8 --max-new 96 --out /tmp/knobs [--draftlens target/release/draftlens]

Needs torch and transformers (a CPU venv is enough) and the Qwen3 tokenizer in
data/tokenizer/qwen3-hf; the prompts are data/prompts/gsm8k.jsonl when present, else synthetic.
"""
import argparse
import collections
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)


def bigram_predictability(train, test):
    """Share of (current, next) pairs in `test` whose next is the most frequent successor of
    current in `train` (positions whose current token `train` never saw count as misses)."""
    succ = collections.defaultdict(collections.Counter)
    for seq in train:
        for a, b in zip(seq, seq[1:]):
            succ[a][b] += 1
    hits = total = 0
    for seq in test:
        for a, b in zip(seq, seq[1:]):
            total += 1
            if succ[a] and succ[a].most_common(1)[0][0] == b:
                hits += 1
    return hits / max(total, 1)


def ends_in_loop(seq, max_period=32):
    """Whether `seq` ends in at least two repetitions of a cycle of at most `max_period` tokens."""
    for p in range(1, max_period + 1):
        if len(seq) >= 2 * p and seq[-p:] == seq[-2 * p:-p]:
            return True
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--settings", default="50:20:1024", help="EMBED:GDN_OUT:ACTIVE_VOCAB,...")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--out", default="/tmp/demo-knobs")
    ap.add_argument("--draftlens", default=None, help="a draftlens binary: also run parity")
    a = ap.parse_args()
    import torch
    import train as tr
    import train_hybrid as th
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = []
    for setting in a.settings.split(","):
        embed, gdn, vocab = setting.split(":")
        target = os.path.join(a.out, f"e{embed}-g{gdn}-v{vocab}")
        if not os.path.exists(os.path.join(target, "config.json")):
            subprocess.run([sys.executable, os.path.join(ROOT, "tools/bench/make_random_target.py"),
                            "--arch", "qwen3.5-demo-8l", "--out", target, "--drafters", "0", "--device", "cpu",
                            "--embed-scale", embed, "--gdn-out-scale", gdn, "--active-vocab", vocab],
                           check=True, cwd=ROOT)
        tok = AutoTokenizer.from_pretrained(target)
        model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
        eos = tok.convert_tokens_to_ids(tr.EOS_TOKEN)
        gsm = os.path.join(ROOT, "data/prompts/gsm8k.jsonl")
        prompts = ([tr.chat_ids(tok, r["messages"]) for r in tr.read_prompts(gsm, a.prompts)]
                   if os.path.exists(gsm) else [tr.chat_ids(tok, r["messages"])
                                                for r in th.synthetic_prompts(tok, a.prompts, 0)])
        conts = [tr.generate_greedy(model, [p], a.max_new, eos, 1, "cpu")[0][0] for p in prompts]
        half = len(conts) // 2
        row = {
            "setting": setting,
            "distinct": sum(len(set(c)) for c in conts) / len(conts),
            "bigram": (bigram_predictability(conts[:half], conts[half:])
                       + bigram_predictability(conts[half:], conts[:half])) / 2,
            "loops": sum(ends_in_loop(c) for c in conts),
            "continuations": len(conts),
        }
        if a.draftlens:
            with open(os.path.join(target, "parity.json"), "w") as f:
                subprocess.run([a.draftlens, "parity", "--backends", "cpu,cpu", "--gdn-profiles",
                                "reference,engine", "--target", target, "--prompts", "builtin:humaneval",
                                "--limit", "2", "--json"], stdout=f, check=True, cwd=ROOT)
            row["parity"] = os.path.join(target, "parity.json")
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(a.out, "knobs.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
