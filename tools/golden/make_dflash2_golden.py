#!/usr/bin/env python3
"""Golden outputs of a DFlash2 drafter from the authors' own code, for draftlens' DFlash2
implementation (crates/engine/src/drafter/dflash2/).

The reference is the PyPI package dflash==0.1.0 (`dflash.model.DFlash2DraftModel`, its
`CandidateSelector` and its greedy generate loop `dflash_generate`), installed without its
dependencies next to torch + transformers 5.17 (CPU, float32):

    /root/.pyenv/versions/3.12.1/bin/python3.12 -m pip install --no-deps --target /tmp/dflsite dflash==0.1.0
    PYTHONPATH=/tmp/dflsite /root/.pyenv/versions/3.12.1/bin/python3.12 tools/golden/make_dflash2_golden.py

The target is the random Qwen3 golden (tests/fixtures/golden/qwen3: hidden 128, 4 layers,
vocabulary 512), loaded by transformers in float32. The drafter is a random-weight
`DFlash2DraftModel` built here (seed below, bf16 weights, computed in float32 from the stored
values): hidden 128 (the target's: DFlash shares its embedding and LM head), 2 layers (layer 0
sliding with a window of 16, causal in the block; layer 1 full), taps [0, 1, 2], block 8,
grouped dynamic causal convolutions (kernel 2, group 16), a candidate selector of rank 32 over
the top 16, output_multiplier 0.7, final_logit_softcapping 4, input_embedding_scale 1.25.

For the two golden prompts, the authors' loop (`dflash_generate(..., return_stats=True)`, whose
CUDA timer is replaced by `time.perf_counter` so that it runs on a CPU) decodes 40 tokens
greedily; its output must equal the target's plain greedy decode. On prompt ++ that output, one
float32 target forward gives the taps, and at a set of anchors a (the loop's own round anchors
among them) the drafter runs as the loop runs it: context = taps of positions < a, block
[y_a, MASK x 7] at positions a..a+7 embedded by the target's embedding times
input_embedding_scale, then `model.propose` (T = 0) gives the path. The selector's scores are not
returned at T = 0; they are read from the authors' own code by calling `select` at T = 1 with
`_sample_probs` replaced by an argmax, which returns the same path and q = softmax(scores) over
the candidates.

Written to tests/fixtures/golden/dflash2/ (the folder is the checkpoint and its golden):

  config.json, model.safetensors   the checkpoint; the codebooks under the names the published
                                   checkpoints use (`candidate_selector.predecessor_codebook`,
                                   no `.weight`: DFlash2DraftModel.from_pretrained's key_mapping)
  golden.safetensors               per prompt p:
    p{p}.ids                I64 [T]        prompt ++ the loop's output
    p{p}.taps               F32 [T, 3*128] the target's hidden_states[1..3] concatenated
    p{p}.acceptance_lengths I64 [R]        tokens committed per round by the authors' loop
  and per anchor a:
    p{p}.a{a}.path          I64 [7]        the selector's greedy path (the proposal)
    p{p}.a{a}.cand_ids      I64 [7, 16]    the candidates (top-16 of the scaled, capped logits)
    p{p}.a{a}.cand_logits   F32 [7, 16]    compute_logits at the candidates (the selector's unary)
    p{p}.a{a}.cand_logq     F32 [7, 16]    log softmax of the selector's scores over the candidates
    p{p}.a{a}.argmax        I64 [7]        the plain argmax of the logits (what DFlash would propose)
  manifest.json                    settings, anchors, sha256s, tolerances, versions
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time

import torch

TARGET = "tests/fixtures/golden/qwen3"
TAPS = [0, 1, 2]
BLOCK, MASK_ID = 8, 500
D, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER = 128, 2, 4, 2, 32, 160
RANK, TOP_K, CONV_K, CONV_G = 32, 16, 2, 16
OUTPUT_MULTIPLIER, SOFTCAP, EMBED_SCALE = 0.7, 12.0, 16.0
WINDOW, ROPE_THETA, EPS = 16, 1000000.0, 1e-6
SEED = 20261207
TILT = 1.5  # how far the final norm leans towards the target's tokens (tilted_norm)


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def config():
    return {
        "architectures": ["DFlash2DraftModel"],
        "model_type": "qwen3",
        "hidden_size": D,
        "intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rms_norm_eps": EPS,
        "rope_parameters": {"rope_theta": ROPE_THETA, "rope_type": "default"},
        "max_position_embeddings": 1024,
        "vocab_size": 512,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": WINDOW,
        "use_sliding_window": True,
        "num_target_layers": 4,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "dflash_config": {
            "block_size": BLOCK,
            "mask_token_id": MASK_ID,
            "target_layer_ids": TAPS,
            "conv_kernel_size": CONV_K,
            "conv_group_size": CONV_G,
            "selector_rank": RANK,
            "selector_top_k": TOP_K,
            "output_multiplier": OUTPUT_MULTIPLIER,
            "final_logit_softcapping": SOFTCAP,
            "input_embedding_scale": EMBED_SCALE,
        },
    }


MASK64 = (1 << 64) - 1


def fnv1a64(name):
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def splitmix64(x):
    z = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def uniform(name, n):
    """n values in [0, 1): element i is splitmix64((fnv1a64(name) ^ SEED) + i) >> 11, over 2^53.
    The Rust test computes the same values (crates/engine/tests/dflash2/main.rs), so the weights
    need not be committed: the tracked tree is near its size budget."""
    base = fnv1a64(name) ^ SEED
    return [(splitmix64((base + i) & MASK64) >> 11) / float(1 << 53) for i in range(n)]


def formula(name, shape, kind, scale):
    """One tensor from its rule, in float64 then rounded once to float32 (both sides alike):
    `mat`: U(+-sqrt(3/fan_in)) x scale; `norm`: 0.5 + U(0, 1); `sym`: U(+-sqrt(3)) x scale
    (standard deviation `scale`)."""
    n = math.prod(shape)
    u = uniform(name, n)
    if kind == "mat":
        b = math.sqrt(3.0 / shape[-1]) * scale
        v = [(2.0 * x - 1.0) * b for x in u]
    elif kind == "norm":
        v = [0.5 + x for x in u]
    elif kind == "sym":
        b = math.sqrt(3.0) * scale
        v = [(2.0 * x - 1.0) * b for x in u]
    else:
        raise ValueError(kind)
    return torch.tensor(v, dtype=torch.float64).to(torch.float32).reshape(shape)


def weight_rules():
    """(name, shape, kind, scale) of every tensor but `norm.weight` (stored in the golden, see
    `tilted_norm`). Scales: fc x0.15 (the taps are O(10)); q_proj x2 (attention far from
    uniform); o_proj / down_proj x0.6 so that attention and MLP move the residual stream
    without drowning the block's (scaled) token embedding; conv base kernels of standard
    deviation 0.5 (both offsets matter); kernel projections x0.5; codebooks of standard
    deviation 0.2, so that the selector's pairwise term is about as large as the logit gaps
    inside the top 16 (it changes some choices, not all)."""
    qd, kvd, groups = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, D // CONV_G
    rules = [
        ("fc.weight", [D, len(TAPS) * D], "mat", 0.15),
        ("hidden_norm.weight", [D], "norm", 1.0),
        ("candidate_selector.hidden_projection.weight", [RANK, D], "mat", 1.0),
        ("candidate_selector.predecessor_codebook", [512, RANK], "sym", 0.2),
        ("candidate_selector.successor_codebook", [512, RANK], "sym", 0.2),
    ]
    for i in range(LAYERS):
        p = f"layers.{i}"
        rules += [
            (f"{p}.input_layernorm.weight", [D], "norm", 1.0),
            (f"{p}.post_attention_layernorm.weight", [D], "norm", 1.0),
            (f"{p}.self_attn.q_proj.weight", [qd, D], "mat", 2.0),
            (f"{p}.self_attn.k_proj.weight", [kvd, D], "mat", 1.0),
            (f"{p}.self_attn.v_proj.weight", [kvd, D], "mat", 1.0),
            (f"{p}.self_attn.o_proj.weight", [D, qd], "mat", 0.6),
            (f"{p}.self_attn.q_norm.weight", [HEAD_DIM], "norm", 1.0),
            (f"{p}.self_attn.k_norm.weight", [HEAD_DIM], "norm", 1.0),
            (f"{p}.mlp.gate_proj.weight", [INTER, D], "mat", 1.0),
            (f"{p}.mlp.up_proj.weight", [INTER, D], "mat", 1.0),
            (f"{p}.mlp.down_proj.weight", [D, INTER], "mat", 0.6),
        ]
        for conv in ("attention_conv", "mlp_conv"):
            rules += [
                (f"{p}.{conv}.base_kernel", [2, CONV_K, D], "sym", 0.5),
                (f"{p}.{conv}.kernel_projection.weight", [2 * CONV_K * groups, D], "mat", 0.5),
            ]
    return rules


def tilted_norm(favoured_head, mask_embedding):
    """The final norm's scale. A drafter of random weights never agrees with the target (every
    round would commit one token and the loop's tau would say little), so the scale is tilted
    towards the tokens the target writes: `favoured_head` = the target's LM-head rows of its
    continuations' tokens weighted by count, times the normed MASK embedding the drafted rows
    start from (input_embedding_scale makes it a large part of their residual stream)."""
    base = formula("norm.weight", [D], "norm", 1.0)
    tilt = favoured_head * mask_embedding
    return (base + TILT * tilt / tilt.abs().max()).float()


def main():
    sys.path.insert(0, "/tmp/dflsite")
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    import dflash.model as dm

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/golden/dflash2")
    ap.add_argument("--checkpoint", default="/tmp/dflash2-golden-checkpoint", help="where the (uncommitted) checkpoint is written")
    a = ap.parse_args()
    torch.manual_seed(0)
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.checkpoint, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(), f, indent=2)
        f.write("\n")
    with open(os.path.join(a.checkpoint, "config.json"), "w") as f:
        json.dump(config(), f, indent=2)
        f.write("\n")

    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    g = load_file(os.path.join(TARGET, "golden.safetensors"))
    sequences = {p: torch.cat([g[f"p{p}.input_ids"], g[f"p{p}.greedy_ids"]]) for p in (0, 1)}
    # What the target writes, for the tilt of the final norm (tilted_norm).
    counts = torch.zeros(512)
    for p in (0, 1):
        counts += torch.bincount(g[f"p{p}.greedy_ids"], minlength=512).float()
    with torch.inference_mode():
        favoured = counts @ target.lm_head.weight.float()
        e = target.model.embed_tokens.weight[MASK_ID].float()
        mask_embedding = e / e.pow(2).mean().sqrt()
    rules = weight_rules()
    weights = {name: formula(name, shape, kind, scale) for name, shape, kind, scale in rules}
    weights["norm.weight"] = tilted_norm(favoured, mask_embedding)
    model_path = os.path.join(a.checkpoint, "model.safetensors")
    save_file({k: v.contiguous() for k, v in weights.items()}, model_path)

    # The authors' loader: DFlash2DraftModel.from_pretrained maps the codebook names.
    model = dm.DFlash2DraftModel.from_pretrained(a.checkpoint, dtype=torch.float32, attn_implementation="sdpa").eval()
    got = dict(model.named_parameters())
    for name, t in weights.items():
        key = name + ".weight" if name.endswith("codebook") else name
        assert torch.equal(got[key].detach(), t), f"{name} was not loaded as stored"
    assert len(got) == len(weights), (sorted(got), sorted(weights))

    # The loop times itself with torch.cuda.synchronize(); on a CPU a plain clock does.
    dm._cuda_time = time.perf_counter
    head = dm._output_head(target)
    tensors = {"weights.norm.weight": weights["norm.weight"]}
    prompts_meta = {}
    changed, positions, min_margin = 0, 0, float("inf")
    for p in (0, 1):
        prompt = g[f"p{p}.input_ids"][None]
        plen = prompt.shape[1]
        new = len(g[f"p{p}.greedy_ids"])
        with torch.inference_mode():
            stats = dm.dflash_generate(model, target, prompt, new, None, temperature=0.0, return_stats=True)
        ids = stats.output_ids[0]
        # Lossless: the loop's output is the target's greedy continuation of the Qwen3 golden.
        assert torch.equal(ids, sequences[p]), f"p{p}: the loop's output is not the golden greedy continuation"
        lengths = list(stats.acceptance_lengths)
        assert sum(lengths) == len(ids) - plen - 1, (lengths, len(ids), plen)
        tensors[f"p{p}.acceptance_lengths"] = torch.tensor(lengths, dtype=torch.int64)
        # The taps the Rust side reads: the golden's f16 hidden states, upcast.
        taps = torch.cat([g[f"p{p}.hs{t + 1}"].float() for t in TAPS], -1)  # [T, 3*D]
        round_anchors, start = [], plen
        for n in lengths:
            round_anchors.append(start)
            start += n
        # The loop's first rounds, a context shorter than the sliding window, a context longer
        # than it, and the last completion anchor.
        anchors = sorted(set(round_anchors[:5]) | {3, plen + 9, len(ids) - 2})
        for anc in anchors:
            block = torch.full((1, BLOCK), MASK_ID, dtype=torch.long)
            block[0, 0] = ids[anc]
            with torch.inference_mode():
                noise = dm._raw_input_embeddings(target, block, EMBED_SCALE)
                hidden = model(
                    target_hidden=taps[None, :anc],
                    noise_embedding=noise,
                    position_ids=torch.arange(anc + BLOCK)[None],
                    past_key_values=None,
                    use_cache=False,
                )[:, 1 - BLOCK:, :]
                path, cands, _ = model.propose(hidden, block[:, 0], head, 0.0)
                logits = model.compute_logits(hidden, head)
                # Scores from the authors' select: at T = 1 it returns q = softmax(scores); with
                # the sampler replaced by an argmax it walks the same greedy path.
                sample = dm._sample_probs
                dm._sample_probs = lambda q: q.argmax(-1)
                try:
                    path1, cands1, q = model.candidate_selector.select(hidden, logits, block[:, 0], 1.0)
                finally:
                    dm._sample_probs = sample
            assert torch.equal(path, path1) and torch.equal(cands, cands1)
            argmax = logits[0].argmax(-1)
            label = f"p{p}.a{anc}"
            tensors[f"{label}.path"] = path[0].to(torch.int64).contiguous()
            tensors[f"{label}.cand_ids"] = cands[0].to(torch.int64).contiguous()
            tensors[f"{label}.cand_logits"] = logits[0].gather(-1, cands[0]).float().contiguous()
            tensors[f"{label}.cand_logq"] = q[0].log().float().contiguous()
            tensors[f"{label}.argmax"] = argmax.to(torch.int64).contiguous()
            top2 = q[0].log().topk(2, dim=-1).values
            min_margin = min(min_margin, float((top2[:, 0] - top2[:, 1]).min()))
            changed += int((path[0] != argmax).sum())
            positions += BLOCK - 1
            print(f"p{p} a{anc}: path {path[0].tolist()} argmax {argmax.tolist()}")
        prompts_meta[f"p{p}"] = {
            "prompt_length": plen,
            "sequence_length": len(ids),
            "anchors": anchors,
            "round_anchors": round_anchors,
            "acceptance_lengths": lengths,
            "tau": sum(lengths) / len(lengths),
        }
        print(f"p{p}: acceptance lengths {lengths} tau {sum(lengths) / len(lengths):.4f}")
    assert changed > 0, "the selector never changed a choice: the golden would not test it"
    golden_path = os.path.join(a.out, "golden.safetensors")
    save_file(tensors, golden_path)
    import transformers

    manifest = {
        "what": "DFlash2 drafts from the authors' dflash==0.1.0 (DFlash2DraftModel, CandidateSelector, dflash_generate) on CPU, float32 (tools/golden/make_dflash2_golden.py)",
        "target": f"{TARGET} (random Qwen3, hidden 128, 4 layers, vocabulary 512), float32 in transformers; the per-anchor taps are its golden's f16 hidden states p{{i}}.hs{{t+1}} for t in {TAPS}, upcast",
        "drafter": f"config.json in this folder: {LAYERS} layers (sliding window {WINDOW}, then full), block {BLOCK}, mask {MASK_ID}, conv kernel {CONV_K} group {CONV_G}, selector rank {RANK} top {TOP_K}, output_multiplier {OUTPUT_MULTIPLIER}, softcap {SOFTCAP}, input_embedding_scale {EMBED_SCALE}",
        "weights": {
            "rule": "F32 tensors; element i of tensor NAME from u = (splitmix64((fnv1a64(NAME) ^ seed) + i) >> 11) / 2^53, in float64, rounded once to float32: mat = (2u-1)*sqrt(3/fan_in)*scale, norm = 0.5+u, sym = (2u-1)*sqrt(3)*scale; norm.weight is stored in golden.safetensors as weights.norm.weight",
            "seed": SEED,
            "tensors": [{"name": n, "shape": s, "kind": k, "scale": c} for n, s, k, c in rules],
            "model_safetensors_sha256": sha256(model_path),
        },
        "draft": "context = taps of positions < a; block [y_a, MASK x 7] at positions a..a+7, embedded by the target's embedding x input_embedding_scale; path = the selector's greedy choice left to right from the anchor token; cand_logq = log softmax of its scores over the 16 candidates",
        "loop": "dflash_generate(temperature=0, max_new_tokens=32, stop_token_ids=None): acceptance_lengths = tokens committed per round (bonus included, the prefill's token not counted); its output equals the Qwen3 golden's greedy continuation",
        "prompts": prompts_meta,
        "block_size": BLOCK,
        "selector_changed_choices": f"{changed} of {positions} drafted positions differ from the plain argmax",
        "min_top1_logq_margin": min_margin,
        "golden_safetensors_sha256": sha256(golden_path),
        "target_golden_sha256": sha256(os.path.join(TARGET, "golden.safetensors")),
        "tolerance_note": "float32 on the same f32 weights and taps: an f32 implementation should reproduce every path id and candidate set, the candidates' logits and log q to ~1e-5 absolute (summation order only)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0], "dflash": "0.1.0"},
    }
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(a.out, n)) for n in os.listdir(a.out))
    print(f"{changed} of {positions} positions changed by the selector; min top-1 log q margin {min_margin:.4f}")
    print(f"wrote {a.out}: {total} bytes (checkpoint, not committed: {a.checkpoint})")


if __name__ == "__main__":
    main()
