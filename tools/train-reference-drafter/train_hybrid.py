#!/usr/bin/env python3
"""train.py's pipeline on a hybrid (Qwen3.5/3.6-style) Hugging Face target, in one recorded numeric path.

The numeric-profile demo (tools/bench/profile_demo.sh, README.md beside this file "Numeric-profile
demo") trains a drafter on the hidden states of one Gated DeltaNet numeric path and evaluates it
with draftlens under both `--gdn-profile`s. This script is train.py with a different target:

- the target is an HF folder (config.json + safetensors, e.g. tools/bench/make_random_target.py
  --arch qwen3.5-demo-8l) loaded in **bf16** (`--target-dtype`), SDPA attention;
- the Gated DeltaNet runs on whichever path transformers picked when it imported
  `modeling_qwen3_5`: fla's Triton kernels (`fla.ops.gated_delta_rule.chunk_gated_delta_rule` /
  `fused_recurrent_gated_delta_rule`) when the `fla` package is importable, else its torch fallback
  (`torch_chunk_gated_delta_rule` / `torch_recurrent_gated_delta_rule`, f32 inside). transformers
  5.x resolves this once, at import, in `integrations/hub_kernels.py`
  (`use_kernel_func_from_hub_with_fallback`: hub kernels if asked for, else the package, else
  torch). `gdn_numerics()` reads the resolved functions back and the result goes into the results
  JSON as `target_numerics` (`path`: `fla` ~ draftlens' `engine` profile, `torch` ~ `reference`);
  `--expect-path` refuses to train on the wrong one;
- one series (`--series-name`, default `demo`) with the taps `--taps` (HF hidden_states[id+1]),
  strict mask, mask token `--mask-token-id`;
- training prompts: the given JSONL sets plus `--synthetic-prompts` N chat prompts of random
  vocabulary tokens (seeded): any prompt shows the drafter the random target's own dynamics,
  and the few hundred prompt-set prompts alone are little data.

Every other argument goes to train.py unchanged (--eval, --steps, --layers, --intermediate,
--time-budget, --deadline-epoch, --device, ...).

usage: python3 tools/train-reference-drafter/train_hybrid.py --target DIR --out DIR
           --train-sets data/prompts/gsm8k.jsonl,data/prompts/mtbench.jsonl [--synthetic-prompts 1500]
           [--taps 1,3,5,6] [--expect-path fla|torch|any] [train.py options]
"""

import argparse
import inspect
import json
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train as tr  # noqa: E402

GDN_FUNCS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn", "causal_conv1d_update")


def gdn_numerics():
    """Which implementation transformers bound to each Gated DeltaNet function of modeling_qwen3_5.

    The module-level functions are wrappers whose closure holds `implementation` (what runs) and
    `is_new_implementation` (False = the torch fallback). Returns a JSON-ready dict."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    funcs = {}
    for name in GDN_FUNCS:
        nl = inspect.getclosurevars(getattr(m, name)).nonlocals
        impl = nl.get("implementation")
        funcs[name] = f"{impl.__module__}.{impl.__qualname__}" if impl is not None else "unknown (transformers changed the wrapper)"
    chunk = funcs["torch_chunk_gated_delta_rule"]
    path = "fla" if chunk.startswith("fla.") else "torch" if chunk.startswith("transformers.") else "unknown"
    info = {
        "path": path,
        "draftlens_profile_closest": {"fla": "engine", "torch": "reference"}.get(path),
        "functions": funcs,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    }
    for pkg in ("fla", "triton"):
        try:
            info[pkg] = __import__(pkg).__version__
        except Exception:
            info[pkg] = None
    return info


def make_loader(dtype):
    def load_target(path, device):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        # transformers keeps A_log / dt_bias in the model's dtype; real checkpoints store them f32 and
        # the forward casts A_log itself (`self.A_log.float()`), so nothing to do here.
        model = model.to(device).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        if tok.convert_tokens_to_ids(tr.EOS_TOKEN) is None:
            raise SystemExit(f"train_hybrid.py: {path}: the tokenizer has no {tr.EOS_TOKEN}")
        return tok, model

    return load_target


def synthetic_prompts(tok, n, seed):
    """N user messages of 16..64 random ordinary vocabulary tokens (ids below the first special token)."""
    rng = random.Random(seed)
    specials = [i for i in tok.all_special_ids if i is not None]
    hi = min(specials) if specials else len(tok)
    rows = []
    for i in range(n):
        ids = [rng.randrange(hi) for _ in range(rng.randint(16, 64))]
        rows.append({"id": f"synthetic-{i}", "messages": [{"role": "user", "content": tok.decode(ids)}]})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, add_help=True)
    ap.add_argument("--target", required=True, help="HF folder of a hybrid target")
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-sets", required=True, help="comma-separated prompt JSONL files (messages or prompt rows)")
    ap.add_argument("--synthetic-prompts", type=int, default=0)
    ap.add_argument("--taps", default="1,3,5,6", help="target layer ids (0-based decoder layers)")
    ap.add_argument("--series-name", default="demo")
    ap.add_argument("--mask-token-id", type=int, default=151669, help="an id the text never contains (Qwen3: 151669, an unused embedding row)")
    ap.add_argument("--target-dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--expect-path", default="any", choices=["fla", "torch", "any"])
    ap.add_argument("--seed", type=int, default=0)
    args, rest = ap.parse_known_args()

    numerics = gdn_numerics()
    numerics["target_dtype"] = args.target_dtype
    print(f"train_hybrid: Gated DeltaNet path {json.dumps(numerics)}", flush=True)
    if numerics["path"] == "unknown" or (args.expect_path != "any" and numerics["path"] != args.expect_path):
        raise SystemExit(f"train_hybrid.py: expected the {args.expect_path} Gated DeltaNet path, transformers bound {numerics['functions']}")

    os.makedirs(args.out, exist_ok=True)
    dtype = torch.bfloat16 if args.target_dtype == "bf16" else torch.float32
    tr.load_target = make_loader(dtype)
    tr.SERIES = {args.series_name: {"target_layer_ids": [int(x) for x in args.taps.split(",")], "inclusive": False}}
    tr.MASK_TOKEN_ID = args.mask_token_id
    tr.CKPT_PREFIX = "hybrid"
    tr.TARGET_DESC = f"{args.target} ({args.target_dtype}, Gated DeltaNet path {numerics['path']})"

    # The training prompt file: the given sets, then the synthetic prompts.
    rows = []
    for path in args.train_sets.split(","):
        rows += tr.read_prompts(path)
    if args.synthetic_prompts:
        from transformers import AutoTokenizer

        rows += synthetic_prompts(AutoTokenizer.from_pretrained(args.target), args.synthetic_prompts, args.seed)
    prompts = os.path.join(args.out, "train_prompts.jsonl")
    with open(prompts, "w", encoding="utf-8") as f:
        for r in rows:
            msg = r["messages"] if r["messages"] is not None else [{"role": "user", "content": r["prompt"]}]
            f.write(json.dumps({"id": r["id"], "messages": msg}) + "\n")
    tr.write_json(os.path.join(args.out, "target_numerics.json"), numerics)

    results = "results.json"
    sys.argv = [tr.__file__, "--target", args.target, "--out", args.out, "--train-prompts", prompts, "--series", args.series_name, "--seed", str(args.seed)] + rest
    if "--results" in rest:
        results = rest[rest.index("--results") + 1]
    tr.main()
    # train.py wrote its results; add which numerics produced the labels and taps.
    path = os.path.join(args.out, results)
    r = json.load(open(path))
    r["target_numerics"] = numerics
    tr.write_json(path, r)


if __name__ == "__main__":
    main()
