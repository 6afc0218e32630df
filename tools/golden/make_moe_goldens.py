#!/usr/bin/env python3
"""Golden reference outputs for draftlens' mixture-of-experts targets, computed with Hugging Face
transformers (5.17) in fp32: Qwen3-MoE, the Qwen3.5-MoE hybrid and a Qwen3-Next with MoE layers.

Small random-weight models (real head dims of 128, 16 experts, the real top-k of 8), saved
with save_pretrained in bf16 (the per-expert checkpoint layout `mlp.experts.{e}.{gate,up,down}_proj`
that transformers writes back and the published checkpoints use), then reloaded in fp32 with
`experts_implementation="eager"` (the literal per-expert loop of `Qwen3MoeExperts.forward`:
softmax over the router logits, top-k, optional renormalisation, each expert's output times its
weight added in ascending expert order) and eager attention; the hybrids run transformers' torch
fallback of the Gated DeltaNet (the script refuses to run when `fla` is importable).

Outputs (under --out, normally tests/fixtures/golden), per model:
  {config.json, model.safetensors, golden.safetensors, manifest.json}
  qwen3_moe/       `Qwen3MoeForCausalLM`: 3 layers, layer 1 dense (`mlp_only_layers` [1]),
                   `norm_topk_prob` true (as Qwen3-30B-A3B / Qwen3-Coder-30B-A3B)
  qwen3_5_moe/     `Qwen3_5MoeForConditionalGeneration` (tiny vision tower, so config.json nests
                   the text model under `text_config` and weights are `model.language_model.*`,
                   plus an `mtp.*` tensor to ignore): 3 layers linear, linear, full; every
                   layer sparse with the gated shared expert; renormalised top-k (no flag)
  qwen3_next_moe/  (--only qwen3_next_moe; not committed) `Qwen3NextForCausalLM` with `num_experts` 16, `decoder_sparse_step` 2 (layers
                   1 and 3 sparse, 0 and 2 dense), `norm_topk_prob` false, the gated shared expert,
                   fused `in_proj_qkvz` / `in_proj_ba`
Golden tensors per prompt i (the names of make_goldens.py / make_hybrid_goldens.py):
  p{i}.input_ids I64 [P], p{i}.greedy_ids I64 [64], p{i}.greedy_margin F32 [64],
  p{i}.hs{k} F16 [T, H] for every k in 0..L, p{i}.prenorm F16 [T, H],
  p{i}.logits_top8_ids I64 [8], p{i}.logits_top8_logprobs F32 [8].
Prompts (random ids) are redrawn while the greedy path has a near-tie (top-1/top-2 logit gap
< 0.01) or some token's routing has a near-tie (k-th minus (k+1)-th router probability < 1e-5 in some
sparse layer, over prompt + continuation): an f32 implementation summing in another order must
pick the same experts and tokens. Among such draws the first with at least 10 distinct greedy
tokens is taken (a continuation that settles into a short loop checks little), else after 150
draws the one with the most. The manifest records both minimum gaps and the distinct count.

Usage:
    python3 tools/golden/make_moe_goldens.py --out tests/fixtures/golden              # GPU machine
    python3 tools/golden/make_moe_goldens.py --out /tmp/moe --device cpu              # dry run
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import (  # noqa: E402
    capture,
    greedy_decode,
    set_reference_numerics,
    sha256_file,
    teacher_forced_agreement,
    versions,
)

NEW_TOKENS = 64
KINDS = ["qwen3_moe", "qwen3_5_moe", "qwen3_next_moe"]
# Committed: the first two. qwen3_next_moe (--only qwen3_next_moe) runs the same sparse block on
# the Qwen3-Next hybrid with decoder_sparse_step 2 and norm_topk_prob false; not committed, to keep
# the fixtures small.
DEFAULT_KINDS = KINDS[:2]
# The hybrids' second prompt spans two 64-token chunks of the chunked delta rule.
PROMPT_LENS = {"qwen3_moe": [12, 24], "qwen3_5_moe": [12, 70], "qwen3_next_moe": [12, 70]}
GREEDY_MIN_MARGIN = 0.01
# A continuation that settles into a short loop checks little after its first steps.
MIN_DISTINCT_TOKENS = 10
MAX_DRAWS = 150
ROUTER_MIN_GAP = 1e-5

# Small enough that the committed files of both default models stay under ~1.5 MB (the working
# tree travels to the GPU machine within 64 MiB), with the real head size of 128.
COMMON = dict(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=128,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    num_experts=16,
    num_experts_per_tok=8,
    moe_intermediate_size=8,
)
HYBRID = dict(
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    shared_expert_intermediate_size=16,
)
ROPE = {"rope_type": "default", "rope_theta": 1e6}


def randomize(model, seed, zero_centred):
    """Norm weights away from their init so that every layer's scale matters: plain RMSNorms
    (Qwen3-MoE) ~ U(0.5, 1.5); zero-centred ones (the hybrids: scale 1 + w) ~ U(-0.5, 0.5); the
    hybrids' gated GDN norm ~ U(0.5, 1.5), decay A = exp(A_log) ~ U(0.05, 2), dt_bias ~ U(-1, 1.5).
    Matrices (router, experts, shared expert and its gate included) keep transformers' init,
    normal with std initializer_range 0.1."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("linear_attn.norm.weight"):
            p.data = torch.rand(p.shape, generator=g) + 0.5
        elif name.endswith("norm.weight") or "layernorm" in name:
            p.data = torch.rand(p.shape, generator=g) + (-0.5 if zero_centred else 0.5)
        elif name.endswith("A_log"):
            p.data = (torch.rand(p.shape, generator=g) * 1.95 + 0.05).log()
        elif name.endswith("dt_bias"):
            p.data = torch.rand(p.shape, generator=g) * 2.5 - 1.0


def build(kind):
    torch.manual_seed(5000 + KINDS.index(kind))
    if kind == "qwen3_moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        cfg = Qwen3MoeConfig(
            **COMMON,
            intermediate_size=32,
            mlp_only_layers=[1],
            decoder_sparse_step=1,
            norm_topk_prob=True,
            rope_parameters=dict(ROPE),
            attention_bias=False,
        )
        model = Qwen3MoeForCausalLM(cfg)
    elif kind == "qwen3_5_moe":
        from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

        text = dict(
            COMMON,
            **HYBRID,
            layer_types=["linear_attention"] * 2 + ["full_attention"],
            rope_parameters=dict(ROPE, partial_rotary_factor=0.25, mrope_section=[4, 6, 6], mrope_interleaved=True),
        )
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=4, num_position_embeddings=16)
        cfg = Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
        model = Qwen3_5MoeForConditionalGeneration(cfg)
    else:
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        cfg = Qwen3NextConfig(
            **dict(COMMON, num_hidden_layers=4),
            **HYBRID,
            intermediate_size=32,
            layer_types=["linear_attention", "full_attention"] * 2,
            decoder_sparse_step=2,
            mlp_only_layers=[],
            norm_topk_prob=False,
            rope_parameters=dict(ROPE, partial_rotary_factor=0.25),
        )
        model = Qwen3NextForCausalLM(cfg)
    model.init_weights()  # experts and router: normal(0, initializer_range)
    randomize(model, 21 + KINDS.index(kind), zero_centred=kind != "qwen3_moe")
    return model


def save(kind, model, d):
    """save_pretrained in bf16 (A_log / dt_bias kept f32, as real hybrid checkpoints store them)."""
    from safetensors.torch import load_file, save_file

    model = model.to(torch.bfloat16)
    for name, p in model.named_parameters():
        if name.endswith("A_log") or name.endswith("dt_bias"):
            p.data = p.data.float()
    model.save_pretrained(d, safe_serialization=True)
    gc = os.path.join(d, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    path = os.path.join(d, "model.safetensors")
    sd = load_file(path)
    # The per-expert layout, which the published checkpoints use.
    assert any(".mlp.experts.0.gate_proj.weight" in n for n in sd), "expected per-expert tensors"
    assert not any(n.endswith("experts.gate_up_proj") for n in sd), "expected no fused expert tensors"
    if kind == "qwen3_5_moe":
        assert any(n.startswith("model.language_model.") for n in sd), "expected the VLM prefix"
        assert any(n.startswith("model.visual.") for n in sd), "expected vision tensors"
        sd["mtp.fc.weight"] = torch.randn(64, 128).to(torch.bfloat16)
        save_file(sd, path, metadata={"format": "pt"})
    if kind == "qwen3_next_moe":
        assert any(n.endswith("in_proj_qkvz.weight") for n in sd), "expected fused projections"


def load_reference(d, device, experts="eager"):
    from transformers import AutoModelForCausalLM

    m, info = AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", experts_implementation=experts, output_loading_info=True
    )
    missing = [k for k in info["missing_keys"]]
    assert not missing, f"{d}: transformers did not load {missing[:5]}"
    m = m.to(device).eval()
    for name, p in m.named_parameters():
        if name.endswith("A_log") or name.endswith("dt_bias"):
            p.data = p.data.float()
    return m


def routers(model):
    """(layer index, router module) of every sparse layer."""
    out = []
    for i, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "top_k"):
            out.append((i, gate))
    return out


@torch.no_grad()
def router_min_gap(model, ids, device):
    """Smallest k-th minus (k+1)-th router probability over all tokens and sparse layers."""
    gaps = []

    def hook(mod, _inp, out):
        probs = torch.softmax(out[0].float(), dim=-1)
        top = torch.topk(probs, mod.top_k + 1, dim=-1).values
        gaps.append((top[:, -2] - top[:, -1]).min().item())

    hs = [g.register_forward_hook(hook) for _, g in routers(model)]
    try:
        model(input_ids=torch.tensor([ids], device=device), use_cache=False)
    finally:
        for h in hs:
            h.remove()
    return min(gaps)


def make(kind, out_dir, device):
    from safetensors.torch import save_file

    set_reference_numerics()
    d = os.path.join(out_dir, kind)
    os.makedirs(d, exist_ok=True)
    save(kind, build(kind), d)
    ref = load_reference(d, device)
    L = ref.config.num_hidden_layers
    sparse = [i for i, _ in routers(ref)]
    gen = torch.Generator().manual_seed(6060 + KINDS.index(kind))
    tensors, meta = {}, []
    for i, plen in enumerate(PROMPT_LENS[kind]):
        # Without near-ties, and of the most distinct tokens seen if none reaches the minimum
        # (Qwen3-MoE's random continuations loop often).
        best = None
        for draw in range(1, MAX_DRAWS + 1):
            ids = torch.randint(0, COMMON["vocab_size"], (plen,), generator=gen).tolist()
            greedy, margins, _ = greedy_decode(ref, torch.tensor([ids], device=device), NEW_TOKENS, None)
            if min(margins) < GREEDY_MIN_MARGIN or (best and len(set(greedy)) <= len(set(best[1]))):
                continue
            gap = router_min_gap(ref, ids + greedy, device)
            if gap < ROUTER_MIN_GAP:
                continue
            best = (ids, greedy, margins, gap, draw)
            if len(set(greedy)) >= MIN_DISTINCT_TOKENS:
                break
        if best is None:
            raise SystemExit(f"{kind} p{i}: no prompt without near-ties in {MAX_DRAWS} draws")
        ids, greedy, margins, gap, draw = best
        stats = {}
        logits = capture(ref, torch.tensor([ids + greedy], device=device), list(range(L + 1)), f"p{i}", tensors, stats)
        tensors[f"p{i}.input_ids"] = torch.tensor(ids, dtype=torch.int64)
        tensors[f"p{i}.greedy_ids"] = torch.tensor(greedy, dtype=torch.int64)
        tensors[f"p{i}.greedy_margin"] = torch.tensor(margins, dtype=torch.float32)
        meta.append(
            {
                "index": i,
                "prompt_tokens": plen,
                "prompt_draws": draw,
                "new_tokens": len(greedy),
                "min_greedy_margin": min(margins),
                "min_router_gap": gap,
                "distinct_greedy_tokens": len(set(greedy)),
                "teacher_forced_argmax_agrees": teacher_forced_agreement(logits, plen, greedy),
                "maxabs": stats,
            }
        )
        print(f"{kind} p{i}: P={plen} draws={draw} greedy={greedy[:12]}... margin={min(margins):.4f} router gap={gap:.2e}")
    path = os.path.join(d, "golden.safetensors")
    save_file(tensors, path)
    # transformers' default experts implementation (grouped_mm where it can dispatch) against the
    # eager loop the goldens come from, on the last prompt: how far two correct orders differ.
    grouped = {}
    try:
        alt = load_reference(d, device, experts=None)
        grouped["experts_implementation"] = alt.config._experts_implementation
        full = torch.tensor([ids + greedy], device=device)
        with torch.no_grad():
            a = ref(input_ids=full, output_hidden_states=True).hidden_states[L]
            b = alt(input_ids=full, output_hidden_states=True).hidden_states[L]
        grouped["hs_last_rel_diff"] = ((a - b).norm() / a.norm()).item()
    except Exception as e:  # informational only
        grouped["error"] = repr(e)
    cfg_json = json.load(open(os.path.join(d, "config.json")))
    manifest = {
        "model": f"random-weight {kind} ({type(ref).__name__} reference), saved with save_pretrained in bf16"
        + (" (A_log, dt_bias f32)" if kind != "qwen3_moe" else ""),
        "config": cfg_json,
        "weights_sha256": sha256_file(os.path.join(d, "model.safetensors")),
        "init": "torch.manual_seed + HF init (initializer_range 0.1: attention, router, experts, shared expert and its gate "
        "~ N(0, 0.1)); plain norm weights ~ U(0.5,1.5), zero-centred ones ~ U(-0.5,0.5); GDN: gated-norm weights ~ U(0.5,1.5), "
        "A_log = log U(0.05,2), dt_bias ~ U(-1,1.5)",
        "reference": f"AutoModelForCausalLM.from_pretrained(dir, dtype=float32, attn_implementation='eager', "
        f"experts_implementation='eager') on {device}, TF32 off",
        "greedy": f"KV-cached argmax loop, {NEW_TOKENS} new tokens, no EOS stop",
        "redraw_rule": f"prompt redrawn while min greedy margin < {GREEDY_MIN_MARGIN} or min router k-th/(k+1)-th probability gap < {ROUTER_MIN_GAP}; "
        f"the first with >= {MIN_DISTINCT_TOKENS} distinct greedy tokens, else the one with the most in {MAX_DRAWS} draws",
        "sparse_layers": sparse,
        "hidden_state_indices": list(range(L + 1)),
        "prompts": meta,
        "default_experts_implementation_vs_eager": grouped,
        "versions": versions(),
        "golden_sha256": sha256_file(path),
        "script": "tools/golden/make_moe_goldens.py",
    }
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"wrote {d}: " + ", ".join(f"{n} {os.path.getsize(os.path.join(d, n))}" for n in sorted(os.listdir(d))))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/golden")
    ap.add_argument("--only", choices=KINDS)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    try:
        import fla  # noqa: F401

        raise SystemExit("fla is importable: transformers would use its GDN kernels; run without fla")
    except ImportError:
        pass
    for kind in [a.only] if a.only else DEFAULT_KINDS:
        make(kind, a.out, a.device)


if __name__ == "__main__":
    main()
