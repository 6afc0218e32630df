"""Sequence lengths of the 'realistic mix' benchmark: HumanEval (164) + MT-Bench (80) prompts from
data/prompts, each with a continuation. No Qwen tokenizer is available offline, so lengths are
estimated: prompt tokens = ceil(chars / 3.6) + 15 (chat template); continuation = HumanEval's
reference completion estimated the same way + 64 tokens of surrounding prose, MT-Bench 512 tokens
(greedy answers capped at 512 new tokens). Writes one length per line, in prompt-file order.

usage: python3 tools/bench/make_mix.py data/prompts > tools/bench/mix_lengths.txt
"""
import json, math, sys

root = sys.argv[1] if len(sys.argv) > 1 else "data/prompts"
est = lambda s: math.ceil(len(s) / 3.6)
for name in ["humaneval.jsonl", "mtbench.jsonl"]:
    for line in open(f"{root}/{name}"):
        row = json.loads(line)
        prompt = est("".join(m["content"] for m in row["messages"])) + 15
        cont = est(row["completion"]) + 64 if "completion" in row else 512
        print(prompt + cont)
