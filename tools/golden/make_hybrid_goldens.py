#!/usr/bin/env python3
"""Golden reference outputs for draftlens' hybrid targets (Qwen3.5 / Qwen3-Next: Gated DeltaNet +
gated attention), computed with Hugging Face transformers.

Default (CPU is enough, the models are tiny): the torch fallback of transformers
(`torch_chunk_gated_delta_rule` for prefill, `torch_recurrent_gated_delta_rule` for cached
decode) in float32: the "Reference" numeric profile of docs/hybrid-models.md. The script refuses
to run this mode when `fla` is importable (transformers would then swap in fla's Triton kernels).

Outputs (under --out, normally tests/fixtures/golden):
  qwen3_5/{config.json, model.safetensors, golden.safetensors, manifest.json}
      A random-weight Qwen3.5 saved as the vision-language class
      (`Qwen3_5ForConditionalGeneration`, tiny vision tower) so that config.json nests the text
      model under `text_config` and the weights are named `model.language_model.*`, plus
      `model.visual.*` and an `mtp.*` tensor the loader must ignore.
  qwen3_next/{...same files}
      A random-weight dense Qwen3-Next (num_experts 0), fused grouped `in_proj_qkvz` / `in_proj_ba`;
      config.json rewritten to carry `full_attention_interval` instead of `layer_types` and
      `partial_rotary_factor` at the top level instead of inside `rope_parameters`.
  Both: bf16 weights except `A_log` / `dt_bias` in f32 (as real checkpoints store them); layers of
  both kinds, GQA attention, fewer key heads than value heads in the GDN, partial rotary (a
  quarter of head_dim); non-trivial init (initializer_range 0.1, random norm weights, A_log,
  dt_bias). Goldens per prompt i (same names as make_goldens.py):
        p{i}.input_ids  I64 [P]   random prompt ids (P = 12 and 70: the second spans two chunks)
        p{i}.greedy_ids I64 [64]  greedy continuation (cached argmax loop, no EOS stop)
        p{i}.greedy_margin F32 [64]
        p{i}.hs{k}      F16 [T,H] every hidden state k in 0..L over prompt + continuation
        p{i}.prenorm    F16 [T,H] last layer's output before the final norm
        p{i}.logits_top8_ids / p{i}.logits_top8_logprobs  last position's top-8 log-probs

--fla (GPU machine, fla-core 0.6.0 installed): the "Engine" profile. Loads the saved checkpoints
in bf16 on CUDA with fla's Triton kernels in place of the torch fallback, and writes
golden-fla.safetensors + manifest-fla.json next to the Reference files (the models are not
regenerated), and makes a third model, qwen3_5_d128 (128-wide GDN heads: the shape draftlens' CUDA
GDN kernels take), with its fla golden only. tools/golden/fla_device.sh runs this on the GPU
machine and then crates/engine/tests/cuda_fla_golden.rs against the result. Usage:
    python3 tools/golden/make_hybrid_goldens.py --out tests/fixtures/golden            # CPU, reference
    python3 tools/golden/make_hybrid_goldens.py --out tests/fixtures/golden --fla      # GPU + fla-core
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
PROMPT_LENS = [12, 70]

# Shared text-model sizes: 6 layers (full attention at 2 and 5), 4 query / 2 KV heads of 32 with 8
# rotary dims, GDN 2 key heads / 4 value heads of 16 (grouped value heads, r = 2), conv kernel 4.
TEXT = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
LAYER_TYPES = ["linear_attention", "linear_attention", "full_attention"] * 2
# A third model, made only on the GPU machine (--fla, written under --out, not committed): a
# qwen3_5 with 128-wide GDN heads, the only head size draftlens' CUDA GDN kernels take (other sizes
# run their host fallback), so the engine-profile kernels themselves meet fla's. Its attention heads
# are 64 wide: the smallest width the CUDA attention kernels take (the committed models' 32-wide
# heads run on the CPU only).
D128 = dict(
    hidden_size=128,
    intermediate_size=256,
    head_dim=64,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
)
KINDS = ["qwen3_5", "qwen3_next", "qwen3_5_d128"]


def text_for(kind):
    return dict(TEXT, **D128) if kind == "qwen3_5_d128" else TEXT
ROPE = {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25}


def randomize_hybrid(model, seed):
    """Weights that exercise real dynamics: zero-centred norm weights ~ U(-0.5, 0.5) (scale 1 + w in
    0.5..1.5), gated-norm weights ~ U(0.5, 1.5), decay rates A = exp(A_log) ~ U(0.05, 2) (some heads
    remember for many tokens, some forget fast), dt_bias ~ U(-1, 1.5)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("linear_attn.norm.weight"):
            p.data = torch.rand(p.shape, generator=g) + 0.5
        elif name.endswith("norm.weight") or "layernorm" in name:
            p.data = torch.rand(p.shape, generator=g) - 0.5
        elif name.endswith("A_log"):
            p.data = (torch.rand(p.shape, generator=g) * 1.95 + 0.05).log()
        elif name.endswith("dt_bias"):
            p.data = torch.rand(p.shape, generator=g) * 2.5 - 1.0


def fla_available():
    try:
        import fla  # noqa: F401

        return True
    except ImportError:
        return False


def build(kind):
    """The model to save (in f32, before the bf16 cast) and the class name it is saved as."""
    torch.manual_seed(3000 + KINDS.index(kind))
    if kind.startswith("qwen3_5"):
        from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

        t = text_for(kind)
        text = dict(t, layer_types=LAYER_TYPES, rope_parameters=dict(ROPE, mrope_section=[1, 1, 2], mrope_interleaved=True))
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=t["hidden_size"], patch_size=4, num_position_embeddings=16)
        cfg = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=False)
        model = Qwen3_5ForConditionalGeneration(cfg)
    else:
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        cfg = Qwen3NextConfig(**TEXT, layer_types=LAYER_TYPES, rope_parameters=dict(ROPE), num_experts=0)
        model = Qwen3NextForCausalLM(cfg)
    randomize_hybrid(model, 11 + KINDS.index(kind))
    return model


def save(kind, model, d):
    """save_pretrained in bf16 with A_log / dt_bias kept f32, then the config/file rewrites."""
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
    for n, t in sd.items():
        want = torch.float32 if (n.endswith("A_log") or n.endswith("dt_bias")) else torch.bfloat16
        assert t.dtype == want, f"{n}: saved as {t.dtype}"
    cpath = os.path.join(d, "config.json")
    c = json.load(open(cpath))
    if kind.startswith("qwen3_5"):
        # Real Qwen3.5 checkpoints carry multi-token-prediction weights that transformers ignores.
        assert any(n.startswith("model.language_model.") for n in sd), "expected the VLM prefix"
        assert any(n.startswith("model.visual.") for n in sd), "expected vision tensors"
        sd["mtp.fc.weight"] = torch.randn(64, 128).to(torch.bfloat16)
        save_file(sd, path, metadata={"format": "pt"})
    else:
        # The older spellings a loader must also accept.
        assert c.pop("layer_types") == LAYER_TYPES
        c["full_attention_interval"] = 3
        rp = c["rope_parameters"]
        c["partial_rotary_factor"] = rp.pop("partial_rotary_factor")
        assert any(n.endswith("in_proj_qkvz.weight") for n in sd), "expected fused projections"
    with open(cpath, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


def load_reference(d, dtype, device):
    """The text model from the saved folder (AutoModelForCausalLM picks the text-only class and
    drops the vision / MTP tensors), eager attention."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(d, dtype=dtype, attn_implementation="eager").to(device).eval()
    for name, p in m.named_parameters():
        if name.endswith("A_log") or name.endswith("dt_bias"):
            p.data = p.data.float()  # as transformers keeps them for fp16/bf16 models
    return m


def make(kind, out_dir, use_fla, device):
    from safetensors.torch import save_file

    set_reference_numerics()
    d = os.path.join(out_dir, kind)
    if not use_fla or not os.path.exists(os.path.join(d, "model.safetensors")):
        os.makedirs(d, exist_ok=True)
        save(kind, build(kind), d)
    dtype = torch.bfloat16 if use_fla else torch.float32
    ref = load_reference(d, dtype, device)
    L = ref.config.num_hidden_layers
    types = ref.config.layer_types
    assert types == LAYER_TYPES, types
    gen = torch.Generator().manual_seed(4242 + KINDS.index(kind))
    tensors, meta = {}, []
    for i, plen in enumerate(PROMPT_LENS):
        # Redraw while the greedy path has a near-tie (top-1/top-2 logit gap < 0.01).
        for draw in range(1, 51):
            ids = torch.randint(0, TEXT["vocab_size"], (plen,), generator=gen).tolist()
            greedy, margins, _ = greedy_decode(ref, torch.tensor([ids], device=device), NEW_TOKENS, None)
            if min(margins) >= 0.01:
                break
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
                "teacher_forced_argmax_agrees": teacher_forced_agreement(logits, plen, greedy),
                "maxabs": stats,
            }
        )
        print(f"{kind} p{i}: P={plen} greedy={greedy[:16]}... min_margin={min(margins):.4f}")
    suffix = "-fla" if use_fla else ""
    path = os.path.join(d, f"golden{suffix}.safetensors")
    save_file(tensors, path)
    manifest = {
        "model": f"random-weight {kind} saved with save_pretrained in bf16 (A_log, dt_bias f32)",
        "profile": "engine (fla Triton kernels, bf16 model)" if use_fla else "reference (torch fallback, fp32)",
        "config": json.load(open(os.path.join(d, "config.json"))),
        "weights_sha256": sha256_file(os.path.join(d, "model.safetensors")),
        "init": "torch.manual_seed + HF init, initializer_range 0.1; zero-centred norm weights ~ U(-0.5,0.5); "
        "gated norm weights ~ U(0.5,1.5); A_log = log U(0.05,2); dt_bias ~ U(-1,1.5)",
        "reference": f"AutoModelForCausalLM.from_pretrained(dir, dtype={dtype}, attn_implementation='eager') on {device}",
        "greedy": f"cached argmax loop (prefill: chunked delta rule; decode: recurrent), {NEW_TOKENS} new tokens, no EOS stop",
        "hidden_state_indices": list(range(L + 1)),
        "layer_types": types,
        "prompts": meta,
        "versions": versions() | {"fla": _fla_version()},
        "golden_sha256": sha256_file(path),
        "script": "tools/golden/make_hybrid_goldens.py" + (" --fla" if use_fla else ""),
    }
    with open(os.path.join(d, f"manifest{suffix}.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"wrote {d}: " + ", ".join(f"{n} {os.path.getsize(os.path.join(d, n))}" for n in sorted(os.listdir(d))))


def _fla_version():
    try:
        from importlib.metadata import version

        return version("fla-core")
    except Exception:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/golden")
    ap.add_argument("--only", choices=KINDS)
    ap.add_argument("--fla", action="store_true", help="engine profile: bf16 on CUDA with fla's kernels (needs fla-core)")
    a = ap.parse_args()
    if a.fla:
        if not (fla_available() and torch.cuda.is_available()):
            raise SystemExit("--fla needs a CUDA device and fla-core installed (pip install fla-core==0.6.0)")
        device = "cuda"
    else:
        if fla_available():
            raise SystemExit("fla is importable: transformers would use its kernels; run the reference without fla")
        device = "cpu"
    # The 128-wide model is for the GPU run only (see D128).
    for kind in KINDS if a.fla else KINDS[:2]:
        if a.only in (None, kind):
            make(kind, a.out, a.fla, device)


if __name__ == "__main__":
    main()
