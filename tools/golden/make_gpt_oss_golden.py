#!/usr/bin/env python3
"""Golden reference outputs for draftlens' gpt-oss target (`model_type` gpt_oss), computed with
Hugging Face transformers (5.17) in fp32 on a small random-weight model; the sibling of
make_moe_goldens.py (same golden tensor names, same redraw rule).

The model (GptOssForCausalLM): 4 layers sliding_attention / full_attention / sliding / full with a
window of 8 (the prompts are longer), hidden 32, 2 query heads and 1 KV head of the real head
size 64, biases on q/k/v/o, non-zero attention sinks, YaRN with gpt-oss's own parameters (factor 32,
beta_fast 32, beta_slow 1, original 4096, truncate false, theta 150000), 8 experts of width 32 with
the real top-k of 4, router bias, expert biases; a few percent of the gate/up pre-activations pass
the clamped SwiGLU's limit of 7. The expert weights are drawn as MXFP4 values (e2m1 codes times a
power of two per 32 values), so bf16 holds them exactly and one model has two exact checkpoints:

  gpt_oss/        save_pretrained in bf16: fused experts.gate_up_proj [E, D, 2I] (gate and up in
                  interleaved columns), experts.down_proj [E, I, D] and their biases; config.json
                  as transformers 5.17 writes it (rope_parameters)
  gpt_oss_mxfp4/  the same tensors with the experts as *_blocks (U8 [E, R, C/32, 16]) and *_scales
                  (U8 [E, R, C/32]) written by this script (transformers cannot quantise on this
                  CPU); config.json in the published gpt-oss spelling (rope_scaling + rope_theta,
                  quantization_config {quant_method: mxfp4}). Checked here: transformers' own
                  dequantisation (integrations/mxfp4.py convert_moe_packed_tensors) gives the bf16
                  weights bit for bit, and transformers loading this folder (Mxfp4Config(dequantize=
                  True)) gives the same parameters and logits as the bf16 folder.

Also gpt_oss/mxfp4_layout.safetensors: random blocks [2, 4, 3, 16] and scales [2, 4, 3] with
transformers' dequantisation ([2, 96, 4] f32): several groups per row, every code.

Golden tensors per prompt i (the names of make_goldens.py / make_moe_goldens.py), in
gpt_oss/golden.safetensors: p{i}.input_ids, p{i}.greedy_ids (64), p{i}.greedy_margin,
p{i}.hs{k} F16 [T, H] for k in 0..L, p{i}.prenorm, p{i}.logits_top8_ids / _logprobs; plus
rope.inv_freq F32 [32] (transformers' YaRN frequencies; attention_scaling in the manifest).
Prompts are random ids redrawn while the greedy path has a near-tie (top-1/top-2 logit gap <
0.01) or a token's routing has one (k-th minus (k+1)-th router logit < 1e-5 in some layer).

Usage:
    python3 tools/golden/make_gpt_oss_golden.py --out tests/fixtures/golden
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
PROMPT_LENS = [20, 27]
GREEDY_MIN_MARGIN = 0.01
MIN_DISTINCT_TOKENS = 10
MAX_DRAWS = 150
ROUTER_MIN_GAP = 1e-5
WINDOW = 8
ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
    "rope_theta": 150000.0,
}
CONFIG = dict(
    vocab_size=256,
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    num_local_experts=8,
    num_experts_per_tok=4,
    sliding_window=WINDOW,
    layer_types=["sliding_attention", "full_attention"] * 2,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    attention_bias=True,
    tie_word_embeddings=False,
    initializer_range=0.2,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
MXFP4_CONFIG = {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4",
}


def fp4_values():
    from transformers.integrations.mxfp4 import FP4_VALUES

    return torch.tensor(FP4_VALUES, dtype=torch.float32)


def mxfp4_exact(shape, g, scale_range):
    """Weights [E, R, C] that MXFP4 holds exactly: e2m1 codes times 2^(s - 127) per 32 values.
    Returns (weights f32, blocks U8 [E, R, C/32, 16], scales U8 [E, R, C/32])."""
    e, r, c = shape
    codes = torch.randint(0, 16, (e, r, c), generator=g)
    scales = torch.randint(scale_range[0], scale_range[1], (e, r, c // 32), generator=g)
    w = fp4_values()[codes] * torch.pow(2.0, scales.float() - 127).repeat_interleave(32, dim=-1)
    low, high = codes[..., 0::2], codes[..., 1::2]
    blocks = (low | (high << 4)).to(torch.uint8).reshape(e, r, c // 32, 16)
    return w, blocks, scales.to(torch.uint8)


def build():
    """The model, and per layer the MXFP4 blocks/scales of its experts."""
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(7100)
    cfg = GptOssConfig(**CONFIG, rope_parameters=dict(ROPE))
    model = GptOssForCausalLM(cfg)
    model.init_weights()  # attention, router weight and bias, embeddings: normal(0, 0.2)
    g = torch.Generator().manual_seed(7101)
    u = lambda shape, lo, hi: torch.rand(shape, generator=g) * (hi - lo) + lo  # noqa: E731
    n = lambda shape, std: torch.randn(shape, generator=g) * std  # noqa: E731
    packed = {}
    for i, layer in enumerate(model.model.layers):
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.data = u(norm.weight.shape, 0.5, 1.5)
        a = layer.self_attn
        a.sinks.data = u(a.sinks.shape, -1.0, 2.0)
        for proj in (a.q_proj, a.k_proj, a.v_proj, a.o_proj):
            proj.bias.data = n(proj.bias.shape, 0.2)
        mlp = layer.mlp
        mlp.router.bias.data = n(mlp.router.bias.shape, 0.5)
        ex = mlp.experts
        E, D, I2 = ex.gate_up_proj.shape
        # Stored MXFP4 rows are outputs: gate_up [E, 2I, D] (interleaved gate/up rows), down [E, D, I].
        w_gu, b_gu, s_gu = mxfp4_exact((E, I2, D), g, (124, 126))
        w_d, b_d, s_d = mxfp4_exact((E, D, I2 // 2), g, (120, 123))
        ex.gate_up_proj.data = w_gu.transpose(1, 2).contiguous()
        ex.down_proj.data = w_d.transpose(1, 2).contiguous()
        # gate/up weights of scale 2^-3..2^-2: a few percent of the pre-activations pass the
        # SwiGLU limit of 7, while the outputs still depend on the input (large biases instead
        # made every continuation loop on a few tokens).
        ex.gate_up_proj_bias.data = n(ex.gate_up_proj_bias.shape, 0.5)
        ex.down_proj_bias.data = n(ex.down_proj_bias.shape, 0.1)
        packed[i] = {"gate_up_proj": (b_gu, s_gu), "down_proj": (b_d, s_d)}
    model.model.norm.weight.data = u(model.model.norm.weight.shape, 0.5, 1.5)
    # Logits spread enough that few greedy steps are near-ties (top-1/top-2 gap < 0.01).
    model.lm_head.weight.data = n(model.lm_head.weight.shape, 0.8)
    return model, packed


def save_bf16(model, d):
    from safetensors.torch import load_file

    model = model.to(torch.bfloat16)
    model.save_pretrained(d, safe_serialization=True)
    gc = os.path.join(d, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    sd = load_file(os.path.join(d, "model.safetensors"))
    assert "model.layers.0.mlp.experts.gate_up_proj" in sd, "expected fused experts"
    assert sd["model.layers.0.mlp.experts.gate_up_proj"].shape == (8, 32, 64), "expected [E, D, 2I]"
    assert "model.layers.0.mlp.router.bias" in sd and "model.layers.0.self_attn.sinks" in sd
    return sd


def save_mxfp4(sd, packed, d_bf16, d):
    """The bf16 checkpoint with its experts as MXFP4 blocks and scales, checked against
    transformers' dequantisation; config.json in the published spelling."""
    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    os.makedirs(d, exist_ok=True)
    out = {}
    for name, t in sd.items():
        layer = int(name.split(".")[2]) if name.startswith("model.layers.") else None
        if layer is not None and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            proj = name.rsplit(".", 1)[1]
            blocks, scales = packed[layer][proj]
            deq = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)
            assert torch.equal(deq, t), f"{name}: transformers' dequantisation differs from the weights"
            out[f"{name}_blocks"] = blocks.contiguous()
            out[f"{name}_scales"] = scales.contiguous()
        else:
            out[name] = t
    save_file(out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(d_bf16, "config.json")))
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope
    cfg["quantization_config"] = MXFP4_CONFIG
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def load_reference(d, device, mxfp4=False):
    from transformers import AutoModelForCausalLM

    kw = {}
    if mxfp4:
        from transformers import Mxfp4Config

        kw["quantization_config"] = Mxfp4Config(dequantize=True)
    m, info = AutoModelForCausalLM.from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager", output_loading_info=True, **kw
    )
    assert not info["missing_keys"], f"{d}: transformers did not load {list(info['missing_keys'])[:5]}"
    # The MXFP4 loader dequantises the experts to bf16 whatever dtype is asked for (exact here:
    # every value is a bf16); the forward needs one dtype.
    return m.float().to(device).eval()


@torch.no_grad()
def routing_and_clamp_stats(model, ids, device):
    """Smallest k-th minus (k+1)-th router logit over all tokens and layers, and the fraction of
    gate / up pre-activations beyond the SwiGLU limit."""
    gaps, clamped = [], [0, 0]

    def router_hook(mod, _inp, out):
        top = torch.topk(out[0].float(), mod.top_k + 1, dim=-1).values
        gaps.append((top[:, -2] - top[:, -1]).min().item())

    hooks = [layer.mlp.router.register_forward_hook(router_hook) for layer in model.model.layers]
    originals = []
    for layer in model.model.layers:
        ex = layer.mlp.experts
        orig = ex._apply_gate

        def counting(gate_up, orig=orig, limit=ex.limit):
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            clamped[0] += int((gate > limit).sum() + (up.abs() > limit).sum())
            clamped[1] += gate.numel() + up.numel()
            return orig(gate_up)

        ex._apply_gate = counting
        originals.append((ex, orig))
    try:
        model(input_ids=torch.tensor([ids], device=device), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
        for ex, orig in originals:
            ex._apply_gate = orig
    return min(gaps), clamped[0] / max(clamped[1], 1)


def layout_fixture(d):
    """Random blocks and scales with several groups per row and transformers' dequantisation."""
    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(7102)
    blocks = torch.randint(0, 256, (2, 4, 3, 16), generator=g).to(torch.uint8)
    scales = torch.randint(110, 140, (2, 4, 3), generator=g).to(torch.uint8)
    deq = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert deq.shape == (2, 96, 4)
    path = os.path.join(d, "mxfp4_layout.safetensors")
    save_file({"blocks": blocks, "scales": scales, "dequantized": deq.contiguous()}, path)
    return path


def main():
    from safetensors.torch import save_file

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/golden")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    set_reference_numerics()
    d = os.path.join(a.out, "gpt_oss")
    d_mx = os.path.join(a.out, "gpt_oss_mxfp4")
    os.makedirs(d, exist_ok=True)
    model, packed = build()
    sd = save_bf16(model, d)
    save_mxfp4(sd, packed, d, d_mx)
    ref = load_reference(d, a.device)
    L = ref.config.num_hidden_layers
    gen = torch.Generator().manual_seed(7103)
    tensors, meta = {}, []
    for i, plen in enumerate(PROMPT_LENS):
        best = None
        for draw in range(1, MAX_DRAWS + 1):
            ids = torch.randint(0, CONFIG["vocab_size"], (plen,), generator=gen).tolist()
            greedy, margins, _ = greedy_decode(ref, torch.tensor([ids], device=a.device), NEW_TOKENS, None)
            if min(margins) < GREEDY_MIN_MARGIN or (best and len(set(greedy)) <= len(set(best[1]))):
                continue
            gap, clamp = routing_and_clamp_stats(ref, ids + greedy, a.device)
            if gap < ROUTER_MIN_GAP:
                continue
            best = (ids, greedy, margins, gap, clamp, draw)
            if len(set(greedy)) >= MIN_DISTINCT_TOKENS:
                break
        if best is None:
            raise SystemExit(f"p{i}: no prompt without near-ties in {MAX_DRAWS} draws")
        ids, greedy, margins, gap, clamp, draw = best
        stats = {}
        logits = capture(ref, torch.tensor([ids + greedy], device=a.device), list(range(L + 1)), f"p{i}", tensors, stats)
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
                "min_router_logit_gap": gap,
                "swiglu_clamped_fraction": clamp,
                "distinct_greedy_tokens": len(set(greedy)),
                "teacher_forced_argmax_agrees": teacher_forced_agreement(logits, plen, greedy),
                "maxabs": stats,
            }
        )
        print(f"p{i}: P={plen} draws={draw} greedy={greedy[:12]}... margin={min(margins):.4f} router gap={gap:.2e} clamped={clamp:.3f}")
    rot = ref.model.rotary_emb
    tensors["rope.inv_freq"] = rot.inv_freq.detach().float().cpu().contiguous()
    path = os.path.join(d, "golden.safetensors")
    save_file(tensors, path)

    # The MXFP4 folder through transformers' own loader: the same parameters and logits.
    mx = load_reference(d_mx, a.device, mxfp4=True)
    ref_params = dict(ref.named_parameters())
    differing = [n for n, p in mx.named_parameters() if not torch.equal(p, ref_params[n])]
    full = torch.tensor([ids + greedy], device=a.device)
    with torch.no_grad():
        same_logits = torch.equal(ref(input_ids=full).logits, mx(input_ids=full).logits)
    assert not differing and same_logits, f"the MXFP4 folder loads differently: {differing[:5]}"
    layout = layout_fixture(d)

    manifest = {
        "model": "random-weight gpt_oss (GptOssForCausalLM reference): gpt_oss/ saved with save_pretrained in bf16 "
        "(fused experts); gpt_oss_mxfp4/ the same weights with MXFP4 expert blocks written by this script",
        "config": json.load(open(os.path.join(d, "config.json"))),
        "weights_sha256": sha256_file(os.path.join(d, "model.safetensors")),
        "mxfp4_weights_sha256": sha256_file(os.path.join(d_mx, "model.safetensors")),
        "mxfp4_check": "transformers' convert_moe_packed_tensors(blocks, scales) equals the bf16 expert weights bit for bit; "
        "from_pretrained(gpt_oss_mxfp4, quantization_config=Mxfp4Config(dequantize=True)) gives every parameter and "
        "the logits of the last prompt equal (torch.equal) to the bf16 folder's",
        "init": "torch.manual_seed + HF init (initializer_range 0.2: attention, router weight, embeddings ~ N(0, 0.2)); "
        "norm weights ~ U(0.5,1.5); sinks ~ U(-1,2); q/k/v/o biases ~ N(0,0.2); router bias ~ N(0,0.5); lm_head ~ N(0,0.8); "
        "experts: e2m1 codes uniform over the 16 values times 2^(s-127) per 32 values, s ~ U{124,125} (gate_up: a few "
        "percent of the pre-activations pass the SwiGLU limit of 7) and U{120..122} (down); gate_up bias ~ N(0,0.5), "
        "down bias ~ N(0,0.1)",
        "reference": f"AutoModelForCausalLM.from_pretrained(gpt_oss, dtype=float32, attn_implementation='eager', "
        f"experts_implementation='eager') on {a.device}, TF32 off",
        "greedy": f"KV-cached argmax loop (DynamicCache: sliding layers keep their window), {NEW_TOKENS} new tokens, no EOS stop",
        "redraw_rule": f"prompt redrawn while min greedy margin < {GREEDY_MIN_MARGIN} or min router k-th/(k+1)-th logit gap < "
        f"{ROUTER_MIN_GAP}; the first with >= {MIN_DISTINCT_TOKENS} distinct greedy tokens, else the one with the most in {MAX_DRAWS} draws",
        "sliding_window": WINDOW,
        "rope": {"inv_freq": "golden.safetensors rope.inv_freq", "attention_scaling": rot.attention_scaling},
        "hidden_state_indices": list(range(L + 1)),
        "prompts": meta,
        "mxfp4_layout": {"file": "mxfp4_layout.safetensors", "sha256": sha256_file(layout)},
        "versions": versions(),
        "golden_sha256": sha256_file(path),
        "script": "tools/golden/make_gpt_oss_golden.py",
    }
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    for dd in (d, d_mx):
        print(f"wrote {dd}: " + ", ".join(f"{n} {os.path.getsize(os.path.join(dd, n))}" for n in sorted(os.listdir(dd))))


if __name__ == "__main__":
    main()
