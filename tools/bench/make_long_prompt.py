"""One chat prompt of about 32k tokens for the long-prompt benchmarks (issue 11's memory goal):
HumanEval prompts concatenated until the model folder's tokenizer counts TOKENS tokens of them.

usage: python3 tools/bench/make_long_prompt.py MODEL_DIR [OUT.jsonl] [TOKENS]
"""
import json, sys

from transformers import AutoTokenizer

model = sys.argv[1]
out = sys.argv[2] if len(sys.argv) > 2 else "/tmp/long32k.jsonl"
want = int(sys.argv[3]) if len(sys.argv) > 3 else 31500
tok = AutoTokenizer.from_pretrained(model)
# The built-in HumanEval set (moved from data/prompts/ when prompt sets became built in).
rows = [json.loads(l) for l in open("crates/engine/builtin-prompts/humaneval.jsonl")]
parts, n, i = [], 0, 0
while n < want:
    t = rows[i % len(rows)]["messages"][0]["content"]
    parts.append(t)
    n += len(tok(t)["input_ids"])
    i += 1
text = "Summarise each of the following functions.\n\n" + "\n\n".join(parts)
with open(out, "w") as f:
    f.write(json.dumps({"id": "long/32k", "messages": [{"role": "user", "content": text}]}) + "\n")
print("long prompt:", n, "tokens of parts")
