"""A mixed-length prompt set for the end-to-end benchmark (docs/benchmarks-cuda.md, "End to end"):
64 chat prompts from about 25 to about 2 700 tokens (28k prompt tokens in all), made deterministically from the installed
HumanEval, GSM8K and MT-Bench sets (scripts/setup-fixtures.sh), so batched generation meets the
padding and packing problems a real evaluation set has.

Prompt i concatenates k_i consecutive source prompts (cycling through the three sets) under one
instruction; k follows a fixed schedule: 32 prompts of k = 1, 16 of k = 4, 12 of k = 12, 4 of k = 28,
shuffled with a fixed seed so long and short prompts share batches.

usage: python3 tools/bench/make_mixed_prompts.py [--data data/prompts] [--out data/prompts/mixed.jsonl]
"""
import argparse, json, random

ap = argparse.ArgumentParser()
ap.add_argument("--data", default="data/prompts")
ap.add_argument("--out", default="data/prompts/mixed.jsonl")
args = ap.parse_args()


def user_text(row):
    return next(m["content"] for m in row["messages"] if m["role"] == "user")


sources = []
for name in ("humaneval", "gsm8k", "mtbench"):
    with open(f"{args.data}/{name}.jsonl") as f:
        sources.append([user_text(json.loads(l)) for l in f if l.strip()])
pool = [s for group in zip(*sources) for s in group]  # interleaved: code, maths, writing, ...

schedule = [1] * 32 + [4] * 16 + [12] * 12 + [28] * 4
random.Random(20261201).shuffle(schedule)
rows, at = [], 0
for i, k in enumerate(schedule):
    parts = [pool[(at + j) % len(pool)] for j in range(k)]
    at += k
    text = parts[0] if k == 1 else (
        "Answer each of the following tasks in order.\n\n"
        + "\n\n".join(f"Task {j + 1}:\n{p}" for j, p in enumerate(parts))
    )
    rows.append({"id": f"mixed/{i}", "category": f"k{k}", "messages": [{"role": "user", "content": text}]})
with open(args.out, "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
print(f"{args.out}: {len(rows)} prompts, {sum(schedule)} source prompts")
