"""Build a realistic random-weight target folder and matching DFlash drafter checkpoints on the GPU
machine, for the end-to-end benchmarks (docs/benchmarks-cuda.md). Nothing is downloaded: the model
is `from_config` on the GPU in bf16 and written with `save_pretrained` (sharded like the real
checkpoints); the tokenizer is the Qwen3 one from the prompt-set fixtures (data/tokenizer/qwen3-hf).

usage: python3 tools/bench/make_random_target.py --out /tmp/q8b [--arch qwen3-8b|qwen3-32b|qwen3.6-27b-16l|qwen3.6-27b|qwen3.5-demo-8l|qwen3-30b-a3b-8l]
           [--drafters 3] [--taps 1,9,17,25,33] [--device cuda|cpu]

`--arch qwen3.5-demo-8l` is the small hybrid target of the numeric-profile demo
(tools/bench/profile_demo.sh): 8 layers (3 Gated DeltaNet : 1 gated attention), hidden 1024,
128-wide GDN heads (the width draftlens' CUDA GDN kernels take), the Qwen3 vocabulary, and the
non-trivial init of the hybrid goldens (tools/golden/make_hybrid_goldens.py randomize_hybrid:
random norm weights, decay rates and dt_bias), then knobs that trade learnable greedy text
against a Gated DeltaNet that matters (defaults embed_scale 50, gdn_out_scale 20, active_vocab
1024; tools/train-reference-drafter/README.md, "Numeric-profile demo", has the CPU measurements):
`--embed-scale` (token embeddings times this: with the init's small embeddings the layers'
outputs swamp the current token and the greedy text looks random; larger embeddings make it
repeat), `--gdn-out-scale` (the GDN layers' out_proj times this: their share of the residual
stream, and with it how far the two numeric profiles separate), `--active-vocab N` (only N random
LM-head rows kept, the others zeroed: greedy decoding walks N tokens; 0 = all), and
`--init-range` (the weights' std). Use `--drafters 0` for the target alone.

Drafters are written to OUT-drafters/step-{k} in the z-lab DFlash format draftlens reads
(config.json + model.safetensors, bf16), 5 layers, block 16, taps 1,9,17,25,33 (the layout of the
published Qwen3-8B DFlash drafter), different seeds per checkpoint.
"""
import argparse, json, os, shutil, time

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

ARCHS = {
    "qwen3-8b": dict(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960,
                     tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645),
    # Qwen3.6-27B's text model at a quarter of its depth (16 of 64 layers, the same 3 Gated DeltaNet :
    # 1 gated-attention pattern): every layer has the 27B's shapes, so per-layer and per-token
    # figures carry over (x4 for the layers); the whole 54 GB model does not fit the device's disk.
    "qwen3.6-27b-16l": dict(model_type="qwen3_5_text", vocab_size=248320, hidden_size=5120, intermediate_size=17408,
                            num_hidden_layers=16, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
                            linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
                            linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
                            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
                            rms_norm_eps=1e-6, max_position_embeddings=262144, tie_word_embeddings=False,
                            bos_token_id=151643, eos_token_id=151645),
}
# The numeric-profile demo's target (see the module doc): small enough to train a drafter on in
# minutes, hybrid like Qwen3.5/3.6, with weights that make the GDN layers matter.
ARCHS["qwen3.5-demo-8l"] = dict(ARCHS["qwen3.6-27b-16l"], vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                                linear_num_key_heads=8, linear_num_value_heads=16, max_position_embeddings=32768,
                                initializer_range=0.02, embed_scale=50.0, gdn_out_scale=20.0, active_vocab=1024)
# Qwen3-30B-A3B's shapes (128 experts, top-8, 768-wide experts, 32 q / 4 kv heads of 128) at 8 of its
# 48 layers: every layer is the real one, so per-layer and per-token figures carry over (x6 for the
# layers); 4.9 B parameters, 9.8 GB of bf16.
ARCHS["qwen3-30b-a3b-8l"] = dict(ARCHS["qwen3-8b"], model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144,
                                 moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                                 decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=8,
                                 num_attention_heads=32, num_key_value_heads=4)
# Archs whose weights get the hybrid goldens' non-trivial init after `from_config`.
DYNAMIC_INIT = {"qwen3.5-demo-8l"}
# A 27B-class dense target: Qwen3-32B's shapes (64 layers, 32.8 B parameters, 65.5 GB of bf16;
# write it to /dev/shm on the GPU machine).
ARCHS["qwen3-32b"] = dict(ARCHS["qwen3-8b"], hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                          num_attention_heads=64, num_key_value_heads=8)
# The whole Qwen3.6-27B text model (64 layers, 53.8 GB of bf16): fits the GPU machine's disk with
# one drafter checkpoint and little else.
ARCHS["qwen3.6-27b"] = dict(ARCHS["qwen3.6-27b-16l"], num_hidden_layers=64)
# The drafters' own attention shape where it differs from the target's (default: the target's).
DRAFTER_ATTN = {"qwen3.6-27b-16l": (32, 8, 128), "qwen3.6-27b": (32, 8, 128)}

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--arch", default="qwen3-8b", choices=sorted(ARCHS))
ap.add_argument("--drafters", type=int, default=3)
ap.add_argument("--drafter-layers", type=int, default=5)
ap.add_argument("--taps", default="1,9,17,25,33")
ap.add_argument("--tokenizer", default="data/tokenizer/qwen3-hf")
ap.add_argument("--device", default="cuda", help="cpu for a dry run of a small arch")
ap.add_argument("--init-range", type=float, default=None, help="initializer_range (default: the arch's, else transformers')")
ap.add_argument("--active-vocab", type=int, default=None, help="keep N random LM-head rows, zero the rest (default: the arch's, else all)")
ap.add_argument("--embed-scale", type=float, default=None, help="multiply the token embeddings (default: the arch's, else 1)")
ap.add_argument("--router-scale", type=float, default=1.0, help="multiply the MoE routers' weights: random routers give near-tied logits that bf16 rounding reorders (default 1)")
ap.add_argument("--gdn-out-scale", type=float, default=None, help="multiply the Gated DeltaNet layers' out_proj (default: the arch's, else 1)")
args = ap.parse_args()
dev = args.device

t0 = time.time()
spec = dict(ARCHS[args.arch])
active_vocab = spec.pop("active_vocab", 0) if args.active_vocab is None else args.active_vocab
spec.pop("active_vocab", None)
embed_scale = spec.pop("embed_scale", 1.0) if args.embed_scale is None else args.embed_scale
spec.pop("embed_scale", None)
gdn_out_scale = spec.pop("gdn_out_scale", 1.0) if args.gdn_out_scale is None else args.gdn_out_scale
spec.pop("gdn_out_scale", None)
if args.init_range is not None:
    spec["initializer_range"] = args.init_range
if spec["model_type"] == "qwen3_5_text":
    from transformers import Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(**{k: v for k, v in spec.items() if k != "model_type"})
else:
    cfg = AutoConfig.for_model(**spec)
torch.manual_seed(0)
with torch.device(dev):
    try:
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    except ValueError:  # a config class the auto mapping does not list
        from transformers import Qwen3_5ForCausalLM

        model = Qwen3_5ForCausalLM(cfg).to(torch.bfloat16)
if args.arch in DYNAMIC_INIT:
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden"))
    from make_hybrid_goldens import randomize_hybrid

    randomize_hybrid(model, seed=11)  # replaces the drawn parameters by CPU f32 tensors: back to bf16 on dev
    for p in model.parameters():
        p.data = p.data.to(dev, torch.bfloat16)
if embed_scale != 1.0:
    model.get_input_embeddings().weight.data.mul_(embed_scale)
if gdn_out_scale != 1.0:
    for name, p in model.named_parameters():
        if name.endswith("linear_attn.out_proj.weight"):
            p.data.mul_(gdn_out_scale)
if args.router_scale != 1.0:
    for name, p in model.named_parameters():
        if name.endswith("mlp.gate.weight"):
            p.data.mul_(args.router_scale)
if active_vocab:
    # A fixed random subset of ordinary tokens (ids below Qwen3's first special token, 151643).
    head = model.get_output_embeddings().weight
    keep = torch.randperm(min(151643, head.shape[0]), generator=torch.Generator().manual_seed(5))[:active_vocab]
    rows = torch.zeros(head.shape[0], dtype=torch.bool)
    rows[keep] = True
    head.data[~rows.to(head.device)] = 0
for name, p in model.named_parameters():
    if name.endswith("A_log") or name.endswith("dt_bias"):
        p.data = p.data.float()  # stored f32 in the real Qwen3.5/3.6 checkpoints
model.save_pretrained(args.out, max_shard_size="4GB")
for f in os.listdir(args.tokenizer):
    shutil.copy(os.path.join(args.tokenizer, f), args.out)
print(f"# {args.arch} random target in {args.out} ({time.time() - t0:.1f} s)", flush=True)

d = spec["hidden_size"]
heads, kv, hd = DRAFTER_ATTN.get(args.arch, (spec["num_attention_heads"], spec["num_key_value_heads"], spec["head_dim"]))
taps = [int(x) for x in args.taps.split(",")]
inter = spec["intermediate_size"]
for k in range(args.drafters):
    g = torch.Generator(device=dev).manual_seed(1000 + k)

    def u(*shape, scale):
        return ((torch.rand(*shape, generator=g, device=dev) * 2 - 1) * scale).to(torch.bfloat16)

    def ones(n):
        return (1 + 0.2 * (torch.rand(n, generator=g, device=dev) * 2 - 1)).to(torch.bfloat16)

    t = {"fc.weight": u(d, len(taps) * d, scale=(3 / (len(taps) * d)) ** 0.5),
         "hidden_norm.weight": ones(d), "norm.weight": ones(d)}
    s = (3 / d) ** 0.5
    for i in range(args.drafter_layers):
        p = f"layers.{i}"
        t.update({
            f"{p}.input_layernorm.weight": ones(d), f"{p}.post_attention_layernorm.weight": ones(d),
            f"{p}.self_attn.q_proj.weight": u(heads * hd, d, scale=s), f"{p}.self_attn.k_proj.weight": u(kv * hd, d, scale=s),
            f"{p}.self_attn.v_proj.weight": u(kv * hd, d, scale=s),
            f"{p}.self_attn.o_proj.weight": u(d, heads * hd, scale=(3 / (heads * hd)) ** 0.5),
            f"{p}.self_attn.q_norm.weight": ones(hd), f"{p}.self_attn.k_norm.weight": ones(hd),
            f"{p}.mlp.gate_proj.weight": u(inter, d, scale=s), f"{p}.mlp.up_proj.weight": u(inter, d, scale=s),
            f"{p}.mlp.down_proj.weight": u(d, inter, scale=(3 / inter) ** 0.5),
        })
    out = f"{args.out}-drafters/step-{k}"
    os.makedirs(out, exist_ok=True)
    save_file({n: v.cpu() for n, v in t.items()}, f"{out}/model.safetensors")
    conf = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
        "dflash_config": {"mask_token_id": 151669, "target_layer_ids": taps},
        "num_target_layers": spec["num_hidden_layers"], "num_hidden_layers": args.drafter_layers,
        "hidden_size": d, "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv,
        "head_dim": hd, "rope_theta": 1e6, "rms_norm_eps": 1e-6, "vocab_size": spec["vocab_size"],
        "layer_types": ["full_attention"] * args.drafter_layers, "sliding_window": None,
        "max_position_embeddings": spec["max_position_embeddings"], "tie_word_embeddings": False,
    }
    json.dump(conf, open(f"{out}/config.json", "w"), indent=1)
print(f"# {args.drafters} drafters in {args.out}-drafters ({time.time() - t0:.1f} s total)", flush=True)
