"""Build a realistic random-weight target folder and matching DFlash drafter checkpoints on the GPU
machine, for the end-to-end benchmarks (docs/benchmarks-cuda.md). Nothing is downloaded: the model
is `from_config` on the GPU in bf16 and written with `save_pretrained` (sharded like the real
checkpoints); the tokenizer is the Qwen3 one from the prompt-set fixtures (data/tokenizer/qwen3-hf).

usage: python3 tools/bench/make_random_target.py --out /tmp/q8b [--arch qwen3-8b|qwen3-32b|qwen3.6-27b-16l|qwen3.6-27b|qwen3.5-demo-8l|qwen3-30b-a3b-8l|gpt-oss-20b-8l|gpt-oss-tiny|qwen3-tiny|qwen3.5-tiny|qwen3.5-moe-tiny|qwen3.5-35b-a3b|qwen3.5-122b-a10b|gpt-oss-120b]
           [--drafters 3] [--taps 1,9,17,25,33] [--device cuda|cpu] [--drafter-family dflash,eagle3,dflash2] [--mtp]
       python3 tools/bench/make_random_target.py --out /tmp/q35 --arch qwen3.5-35b-a3b --no-weights [--seed 0] [--init-range 0.02]

`--no-weights` writes the folder of a `random:` target (docs/loading.md §7): config.json (as
`save_pretrained` writes it), the tokenizer files and random.json ({"seed": --seed, and with
--init-range {"init": {"matrix_std": R, "norm_spread": 0.1}}}), no weights and no drafters;
`draftlens ... --target random:OUT` generates the weights at load. It needs neither a GPU nor
disk for the weights: the full-size archs below (70 GB, 227 GB and 65 GB of weights) are written
this way on the GPU machine, whose disk is 64 GiB. The weight knobs (--embed-scale,
--active-vocab, --gdn-out-scale, --router-scale, --mtp) shape torch's weights and are refused
with it (an arch's own knob defaults are ignored, and said so). gpt-oss-120b's experts are MXFP4
(its config gets quantization_config {quant_method: mxfp4}), so it is written only this way.

The full-size archs (`qwen3.5-35b-a3b`, `qwen3.5-122b-a10b`, `gpt-oss-120b`) are the published
configs (Qwen/Qwen3.5-35B-A3B's and Qwen/Qwen3.5-122B-A10B's text_config, openai/gpt-oss-120b's),
as crates/engine/tests/memory_estimate.rs quotes them; transformers 5.17's `Qwen3_5MoeTextConfig`
and `GptOssConfig` defaults are the 35B-A3B's and the 120b's shapes too. Written as the flat text
config (`qwen3_5_moe_text`), with the Qwen3 tokenizer's bos/eos ids like the other archs.

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

`--drafter-family` (a comma-separated list, default `dflash`) picks the drafter families written,
each in the layout draftlens loads, `--drafters` checkpoints of each:
  dflash   OUT-drafters/step-{k}  as above (unchanged: same bytes as before the option existed);
  eagle3   OUT-eagle3/step-{k}    SpecForge / vLLM `LlamaForCausalLMEagle3` (docs/eagle3.md §1): one
           midlayer reading [embedding | hidden] (2·D wide), fc over 3 taps (`--eagle-taps`, default
           [1, L/2 − 1, L − 4], else [0, L/2 − 1, L − 2] under 8 layers), own norm and lm_head over a
           draft vocabulary of `--draft-vocab` ids (d2t offsets, t2d mask; the target's active LM-head
           rows are in it), no embed_tokens (the target's is shared), K = 7;
  dflash2  OUT-dflash2/step-{k}   `DFlash2DraftModel` (docs/dflash2.md §1): the DFlash backbone above
           plus per layer attention_conv / mlp_conv (kernel 2, group 16) and the candidate selector
           (rank 256, top 16, codebooks without `.weight` as published), sliding layers of window
           2048 with is_causal false, output_multiplier 0.196 and soft cap 20 as the published one.
The random weights follow the goldens' scales (tools/golden/make_eagle3_golden.py,
make_dflash2_golden.py) that keep a chain from repeating one token.

`--mtp` (hybrid archs: Qwen3.5-style, dense or MoE) adds the native MTP head (docs/mtp.md §1):
`mtp.fc`, `mtp.pre_fc_norm_{embedding,hidden}`, `mtp.norm` and `mtp.layers.0.*` with the shapes
and stored layout of the target's own full-attention layer (per-expert MoE tensors included),
random, in OUT/model-mtp.safetensors listed in model.safetensors.index.json (written when the
target was one file), and `mtp_num_hidden_layers: 1` in config.json: `--drafter target:mtp` runs.

The tiny archs (`qwen3-tiny`, `qwen3.5-tiny`, `qwen3.5-moe-tiny`: 4 layers, hidden 256, the Qwen3
vocabulary, 128-wide heads) are for CPU checks and quick device calls; their default taps fit 4
layers.
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
# gpt-oss-20b's shapes (32 experts of 2880, top-4 with a router bias, 64 q / 8 kv heads of 64 with
# sinks, sliding 128 / full layers alternating, YaRN) at 8 of its 24 layers: 7.0 B parameters, 14 GB
# of bf16 (transformers' `from_config` writes the experts unquantised; the published checkpoint holds
# them as MXFP4, which draftlens dequantises to the same bf16 layout at load).
ARCHS["gpt-oss-20b-8l"] = dict(model_type="gpt_oss", vocab_size=201088, hidden_size=2880, intermediate_size=2880,
                               num_hidden_layers=8, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                               num_local_experts=32, num_experts_per_tok=4, sliding_window=128,
                               layer_types=["sliding_attention", "full_attention"] * 4, attention_bias=True,
                               rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=False,
                               rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                                "beta_slow": 1.0, "truncate": False,
                                                "original_max_position_embeddings": 4096, "rope_theta": 150000.0},
                               bos_token_id=151643, eos_token_id=151645, taps="1,3,5,6")
# Archs whose weights get the hybrid goldens' non-trivial init after `from_config`.
DYNAMIC_INIT = {"qwen3.5-demo-8l"}
# A 27B-class dense target: Qwen3-32B's shapes (64 layers, 32.8 B parameters, 65.5 GB of bf16;
# write it to /dev/shm on the GPU machine).
ARCHS["qwen3-32b"] = dict(ARCHS["qwen3-8b"], hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                          num_attention_heads=64, num_key_value_heads=8)
# The whole Qwen3.6-27B text model (64 layers, 53.8 GB of bf16): fits the GPU machine's disk with
# one drafter checkpoint and little else.
ARCHS["qwen3.6-27b"] = dict(ARCHS["qwen3.6-27b-16l"], num_hidden_layers=64)
# Tiny targets for checks on the CPU and quick device calls: 4 layers, hidden 256, the Qwen3
# vocabulary (the tokenizer's), 128-wide attention and GDN heads (what the CUDA kernels take), the
# hybrids 3 Gated DeltaNet : 1 gated attention with the demo's non-trivial init and knobs.
ARCHS["qwen3-tiny"] = dict(ARCHS["qwen3-8b"], hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=128, active_vocab=1024,
                           embed_scale=20.0, taps="0,1,2")
ARCHS["qwen3.5-tiny"] = dict(ARCHS["qwen3.5-demo-8l"], hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=2, linear_num_key_heads=2,
                             linear_num_value_heads=4, taps="0,1,2")
ARCHS["qwen3.5-moe-tiny"] = dict(ARCHS["qwen3.5-tiny"], model_type="qwen3_5_moe_text", num_experts=8,
                                 num_experts_per_tok=2, moe_intermediate_size=128,
                                 shared_expert_intermediate_size=256)
ARCHS["gpt-oss-tiny"] = dict(ARCHS["gpt-oss-20b-8l"], vocab_size=151936, hidden_size=256, intermediate_size=128,
                             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
                             sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2,
                             active_vocab=1024, embed_scale=20.0, taps="0,1,2")
DYNAMIC_INIT |= {"qwen3.5-tiny", "qwen3.5-moe-tiny"}
# The full-size MoE targets of issue 34 item 4 (see the module doc for the source of the numbers),
# for --no-weights. Qwen3.5-35B-A3B: 40 layers (3 Gated DeltaNet : 1 gated attention), hidden 2048,
# 16 q / 2 kv heads of 256 with a quarter rotary (θ 1e7), GDN 16 key / 32 value heads of 128, every
# layer 256 experts of 512 (top-8) plus a gated shared expert of 512; 34.7 B parameters, 69.3 GB of
# bf16 (64.56 GiB).
ARCHS["qwen3.5-35b-a3b"] = dict(model_type="qwen3_5_moe_text", vocab_size=248320, hidden_size=2048,
                                num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                                linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                                linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
                                moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts=256,
                                num_experts_per_tok=8,
                                rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
                                rms_norm_eps=1e-6, max_position_embeddings=262144, tie_word_embeddings=False,
                                bos_token_id=151643, eos_token_id=151645)
# Qwen3.5-122B-A10B: 48 layers, hidden 3072, 32 q / 2 kv heads of 256, GDN 64 value heads, experts and
# shared expert of 1024; 122 B parameters, 244 GB of bf16 (227.45 GiB): does not fit one GPU, for the
# refusal.
ARCHS["qwen3.5-122b-a10b"] = dict(ARCHS["qwen3.5-35b-a3b"], hidden_size=3072, num_hidden_layers=48,
                                  num_attention_heads=32, linear_num_value_heads=64, moe_intermediate_size=1024,
                                  shared_expert_intermediate_size=1024)
# gpt-oss-120b: gpt-oss-20b's layers (above) at 36 layers of 128 experts (top-4), the experts MXFP4
# as published; 116.8 B parameters, 65.3 GB as stored (60.77 GiB).
ARCHS["gpt-oss-120b"] = dict(ARCHS["gpt-oss-20b-8l"], num_hidden_layers=36, num_local_experts=128,
                             layer_types=["sliding_attention", "full_attention"] * 18, mxfp4_experts=True,
                             taps="1,9,17,25,33")
# Written only with --no-weights (their weights do not fit the GPU machine's disk, or are MXFP4).
NO_WEIGHTS_ONLY = {"gpt-oss-120b"}
# The published checkpoints' quantization_config of gpt-oss's MXFP4 experts.
MXFP4_CONFIG = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}
# The drafters' own attention shape where it differs from the target's (default: the target's).
DRAFTER_ATTN = {"qwen3.6-27b-16l": (32, 8, 128), "qwen3.6-27b": (32, 8, 128)}

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--arch", default="qwen3-8b", choices=sorted(ARCHS))
ap.add_argument("--drafters", type=int, default=None, help="drafter checkpoints per family (default 3; none with --no-weights)")
ap.add_argument("--drafter-layers", type=int, default=5)
ap.add_argument("--taps", default=None, help="DFlash / DFlash2 taps (default: the arch's, else 1,9,17,25,33)")
ap.add_argument("--tokenizer", default="data/tokenizer/qwen3-hf")
ap.add_argument("--device", default="cuda", help="cpu for a dry run of a small arch")
ap.add_argument("--init-range", type=float, default=None, help="initializer_range (default: the arch's, else transformers')")
ap.add_argument("--active-vocab", type=int, default=None, help="keep N random LM-head rows, zero the rest (default: the arch's, else all)")
ap.add_argument("--embed-scale", type=float, default=None, help="multiply the token embeddings (default: the arch's, else 1)")
ap.add_argument("--router-scale", type=float, default=1.0, help="multiply the MoE routers' weights: random routers give near-tied logits that bf16 rounding reorders (default 1)")
ap.add_argument("--gdn-out-scale", type=float, default=None, help="multiply the Gated DeltaNet layers' out_proj (default: the arch's, else 1)")
ap.add_argument("--drafter-family", default="dflash",
                help="comma-separated drafter families to write: dflash (OUT-drafters), eagle3 (OUT-eagle3), dflash2 (OUT-dflash2)")
ap.add_argument("--eagle-taps", default=None, help="EAGLE-3's 3 taps (default: [1, L/2-1, L-4], under 8 layers [0, L/2-1, L-2])")
ap.add_argument("--draft-vocab", type=int, default=32000, help="EAGLE-3 draft_vocab_size (capped at the target's vocabulary)")
ap.add_argument("--mtp", action="store_true", help="add the native MTP head (mtp.*) to a hybrid target")
ap.add_argument("--no-weights", action="store_true",
                help="write config.json, the tokenizer and random.json only: a folder for --target random:OUT")
ap.add_argument("--seed", type=int, default=0, help="--no-weights: random.json's seed (default 0)")
args = ap.parse_args()
dev = args.device
FAMILIES = ("dflash", "eagle3", "dflash2")
families = [f for f in args.drafter_family.split(",") if f]
for f in families:
    if f not in FAMILIES:
        ap.error(f"--drafter-family {f!r}: expected one of {', '.join(FAMILIES)}")

t0 = time.time()
spec = dict(ARCHS[args.arch])
mxfp4_experts = spec.pop("mxfp4_experts", False)
if args.no_weights:
    given = [f"--{k.replace('_', '-')}" for k in ("embed_scale", "active_vocab", "gdn_out_scale")
             if getattr(args, k) is not None]
    given += ["--router-scale"] * (args.router_scale != 1.0) + ["--mtp"] * args.mtp
    given += ["--drafters"] * bool(args.drafters)
    if given:
        ap.error(f"--no-weights: {', '.join(given)} shape torch's weights; a random: target's are generated at load")
    ignored = [k for k in ("active_vocab", "embed_scale", "gdn_out_scale") if k in spec]
    if ignored or args.arch in DYNAMIC_INIT:
        print(f"# --no-weights: {args.arch}'s weight knobs ignored ({', '.join(ignored + ['its non-trivial init'] * (args.arch in DYNAMIC_INIT))})")
elif args.arch in NO_WEIGHTS_ONLY:
    ap.error(f"--arch {args.arch}: only with --no-weights (its MXFP4 experts are generated at load by a random: target)")
if args.drafters is None:
    args.drafters = 0 if args.no_weights else 3
active_vocab = spec.pop("active_vocab", 0) if args.active_vocab is None else args.active_vocab
spec.pop("active_vocab", None)
embed_scale = spec.pop("embed_scale", 1.0) if args.embed_scale is None else args.embed_scale
spec.pop("embed_scale", None)
gdn_out_scale = spec.pop("gdn_out_scale", 1.0) if args.gdn_out_scale is None else args.gdn_out_scale
spec.pop("gdn_out_scale", None)
taps_text = spec.pop("taps", "1,9,17,25,33") if args.taps is None else args.taps
spec.pop("taps", None)
if args.mtp and not spec["model_type"].startswith("qwen3_5"):
    ap.error(f"--mtp: {args.arch} is not a Qwen3.5-style hybrid (only those carry a native MTP head)")
if args.init_range is not None:
    spec["initializer_range"] = args.init_range
if spec["model_type"] == "qwen3_5_text":
    from transformers import Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(**{k: v for k, v in spec.items() if k != "model_type"})
else:
    cfg = AutoConfig.for_model(**spec)
if args.no_weights:
    os.makedirs(args.out, exist_ok=True)
    cfg.save_pretrained(args.out)
    if mxfp4_experts:
        conf_path = os.path.join(args.out, "config.json")
        conf = json.load(open(conf_path))
        conf["quantization_config"] = MXFP4_CONFIG
        json.dump(conf, open(conf_path, "w"), indent=2)
    settings = {"seed": args.seed}
    if args.init_range is not None:
        settings["init"] = {"matrix_std": args.init_range, "norm_spread": 0.1}
    json.dump(settings, open(os.path.join(args.out, "random.json"), "w"))
    for f in os.listdir(args.tokenizer):
        shutil.copy(os.path.join(args.tokenizer, f), args.out)
    print(f"# {args.arch} random: target folder (no weights) in {args.out}: --target random:{args.out}", flush=True)
    raise SystemExit(0)
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
keep = None  # the target's active LM-head rows (EAGLE-3's draft vocabulary includes them)
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

if args.mtp:
    # The head's layer has the stored names, shapes and dtypes of the target's own full-attention
    # layer (vLLM builds it with the target's decoder class; the MLP rule of layer index 0 is every
    # layer's on these archs), read back from what save_pretrained wrote (per-expert MoE layout).
    from safetensors import safe_open

    full = cfg.layer_types.index("full_attention")
    index_path = os.path.join(args.out, "model.safetensors.index.json")
    if os.path.exists(index_path):
        index = json.load(open(index_path))
    else:
        with safe_open(os.path.join(args.out, "model.safetensors"), "pt") as f:
            index = {"metadata": {}, "weight_map": {n: "model.safetensors" for n in f.keys()}}
    layer_shapes = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(os.path.join(args.out, shard), "pt") as f:
            for n in f.keys():
                prefix = f"model.layers.{full}."
                if n.startswith(prefix):
                    sl = f.get_slice(n)
                    layer_shapes[n[len(prefix):]] = (sl.get_shape(), sl.get_dtype())
    g = torch.Generator(device=dev).manual_seed(4000)
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}

    def mtp_tensor(name, shape, dtype="BF16"):
        """Zero-centred norms 0.3·N(0, 1) (scale 1 + w; mtp.norm shifted by 3, so that the head's
        logits spread as the golden's do, tools/golden/make_mtp_golden.py), matrices
        U(±sqrt(3/fan_in)) (variance 1/fan_in, so the layer moves the residual stream)."""
        if name.endswith("norm.weight"):
            v = torch.randn(*shape, generator=g, device=dev) * 0.3 + (3.0 if name == "mtp.norm.weight" else 0.0)
        elif len(shape) >= 2:
            v = (torch.rand(*shape, generator=g, device=dev) * 2 - 1) * (3 / shape[-1]) ** 0.5
        else:
            v = torch.randn(*shape, generator=g, device=dev) * 0.02
        return v.to(dtypes[dtype]).cpu().contiguous()

    dm = spec["hidden_size"]
    head = {n: mtp_tensor(n, [dm]) for n in ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight")}
    head["mtp.fc.weight"] = mtp_tensor("mtp.fc.weight", [dm, 2 * dm])
    for rest, (shape, dtype) in sorted(layer_shapes.items()):
        head[f"mtp.layers.0.{rest}"] = mtp_tensor(rest, shape, dtype)
    save_file(head, os.path.join(args.out, "model-mtp.safetensors"), metadata={"format": "pt"})
    index["weight_map"].update({n: "model-mtp.safetensors" for n in head})
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    index["metadata"]["total_size"] = index["metadata"].get("total_size", sum(
        os.path.getsize(os.path.join(args.out, s)) for s in set(index["weight_map"].values()) if s != "model-mtp.safetensors"
    )) + sum(t.numel() * t.element_size() for t in head.values())
    json.dump(index, open(index_path, "w"), indent=2)
    conf_path = os.path.join(args.out, "config.json")
    conf = json.load(open(conf_path))
    conf.update(mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False)
    json.dump(conf, open(conf_path, "w"), indent=2)
    print(f"# MTP head: {len(head)} tensors (layer {full}'s shapes) in {args.out}/model-mtp.safetensors", flush=True)

d = spec["hidden_size"]
heads, kv, hd = DRAFTER_ATTN.get(args.arch, (spec["num_attention_heads"], spec["num_key_value_heads"], spec["head_dim"]))
taps = [int(x) for x in taps_text.split(",")]
inter = spec["intermediate_size"]
L, vocab = spec["num_hidden_layers"], spec["vocab_size"]


def uniform_maker(g):
    """u(shape, scale): U(±scale) in bf16; ones(n): 1 ± 0.2 (RMSNorm scales), both drawn from g."""

    def u(*shape, scale):
        return ((torch.rand(*shape, generator=g, device=dev) * 2 - 1) * scale).to(torch.bfloat16)

    def ones(n):
        return (1 + 0.2 * (torch.rand(n, generator=g, device=dev) * 2 - 1)).to(torch.bfloat16)

    return u, ones


def dflash_backbone(g):
    """The DFlash drafter's tensors (fc over the taps, hidden_norm, norm, `--drafter-layers`
    Qwen3 layers), drawn in the order the script always drew them."""
    u, ones = uniform_maker(g)
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
    return t


def dflash_config():
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
        "dflash_config": {"mask_token_id": 151669, "target_layer_ids": taps},
        "num_target_layers": spec["num_hidden_layers"], "num_hidden_layers": args.drafter_layers,
        "hidden_size": d, "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv,
        "head_dim": hd, "rope_theta": 1e6, "rms_norm_eps": 1e-6, "vocab_size": spec["vocab_size"],
        "layer_types": ["full_attention"] * args.drafter_layers, "sliding_window": None,
        "max_position_embeddings": spec["max_position_embeddings"], "tie_word_embeddings": False,
    }


# DFlash2's own settings: the published checkpoint's (docs/dflash2.md §1), rank and top-k included.
CONV_K, CONV_G, RANK, TOP_K = 2, 16, 256, 16


def dflash2_drafter(k):
    g = torch.Generator(device=dev).manual_seed(3000 + k)
    t = dflash_backbone(g)
    u, _ = uniform_maker(g)
    groups = d // CONV_G
    for i in range(args.drafter_layers):
        for conv in ("attention_conv", "mlp_conv"):
            # Static kernels of standard deviation 0.5 (both offsets matter), projections x0.5
            # (make_dflash2_golden.py's scales).
            t[f"layers.{i}.{conv}.base_kernel"] = u(2, CONV_K, d, scale=0.5 * 3 ** 0.5)
            t[f"layers.{i}.{conv}.kernel_projection.weight"] = u(2 * CONV_K * groups, d, scale=0.5 * (3 / d) ** 0.5)
    t["candidate_selector.hidden_projection.weight"] = u(RANK, d, scale=(3 / d) ** 0.5)
    # Codebooks of standard deviation 0.2: the pairwise term is about as large as the logit gaps
    # inside the top 16, so the selector changes some choices, not all.
    for book in ("predecessor", "successor"):
        t[f"candidate_selector.{book}_codebook"] = u(vocab, RANK, scale=0.2 * 3 ** 0.5)
    conf = dflash_config()
    conf.update(architectures=["DFlash2DraftModel"], layer_types=["sliding_attention"] * args.drafter_layers,
                sliding_window=2048, use_sliding_window=True, is_causal=False, hidden_act="silu")
    conf["dflash_config"].update(block_size=16, conv_kernel_size=CONV_K, conv_group_size=CONV_G, selector_rank=RANK,
                                 selector_top_k=TOP_K, output_multiplier=0.196, final_logit_softcapping=20.0)
    return t, conf


def eagle_taps():
    if args.eagle_taps:
        return [int(x) for x in args.eagle_taps.split(",")]
    return [1, L // 2 - 1, L - 4] if L >= 8 else [0, L // 2 - 1, L - 2]


def eagle3_drafter(k):
    """SpecForge / vLLM LlamaForCausalLMEagle3 with make_eagle3_golden.py's scales: q_proj x2
    (attention far from uniform), v_proj x2, o_proj x3, down_proj x2 (the token and the attention
    move the residual stream; with plain scales the fed-back hidden state dominates and every
    chain repeats one token), norm scales U(0.5, 1.5)."""
    g = torch.Generator(device=dev).manual_seed(2000 + k)
    u, _ = uniform_maker(g)

    def mat(out, inp, scale=1.0):
        return u(out, inp, scale=(3 / inp) ** 0.5 * scale)

    def norm(n):
        return (torch.rand(n, generator=g, device=dev) + 0.5).to(torch.bfloat16)

    qd, kvd = heads * hd, kv * hd
    draft_vocab = min(args.draft_vocab, vocab)
    m = "midlayer"
    t = {
        "fc.weight": mat(d, 3 * d),
        f"{m}.input_layernorm.weight": norm(d), f"{m}.hidden_norm.weight": norm(d),
        f"{m}.self_attn.q_proj.weight": mat(qd, 2 * d, 2.0), f"{m}.self_attn.k_proj.weight": mat(kvd, 2 * d),
        f"{m}.self_attn.v_proj.weight": mat(kvd, 2 * d, 2.0), f"{m}.self_attn.o_proj.weight": mat(d, qd, 3.0),
        f"{m}.post_attention_layernorm.weight": norm(d),
        f"{m}.mlp.gate_proj.weight": mat(inter, d), f"{m}.mlp.up_proj.weight": mat(inter, d),
        f"{m}.mlp.down_proj.weight": mat(d, inter, 2.0),
        "norm.weight": norm(d), "lm_head.weight": mat(draft_vocab, d),
    }
    # The draft vocabulary: the target's active LM-head rows (the tokens it writes) first, then
    # random ordinary tokens, stored sorted as SpecForge's vocabulary mapping writes it.
    ordinary = min(151643, vocab)
    order = torch.randperm(ordinary, generator=torch.Generator().manual_seed(2000 + k))
    chosen = torch.cat([keep, order]) if keep is not None else order
    used, seen = [], set()
    for x in chosen.tolist():
        if x not in seen:
            seen.add(x)
            used.append(x)
            if len(used) == draft_vocab:
                break
    used = torch.tensor(sorted(used), dtype=torch.int64)
    t["d2t"] = used - torch.arange(draft_vocab, dtype=torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    t["t2d"] = t2d
    conf = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": d,
        "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
        "num_hidden_layers": 1, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "rms_norm_eps": 1e-6, "rope_theta": 1e6, "rope_scaling": None,
        "max_position_embeddings": spec["max_position_embeddings"], "vocab_size": vocab,
        "draft_vocab_size": draft_vocab, "target_hidden_size": d, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "num_speculative_tokens": 7,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": eagle_taps(), "use_aux_hidden_state": True},
    }
    return t, conf


def dflash_drafter(k):
    return dflash_backbone(torch.Generator(device=dev).manual_seed(1000 + k)), dflash_config()


WRITERS = {"dflash": ("drafters", dflash_drafter), "eagle3": ("eagle3", eagle3_drafter), "dflash2": ("dflash2", dflash2_drafter)}
for family in families:
    suffix, make = WRITERS[family]
    for k in range(args.drafters):
        t, conf = make(k)
        out = f"{args.out}-{suffix}/step-{k}"
        os.makedirs(out, exist_ok=True)
        save_file({n: v.cpu() for n, v in t.items()}, f"{out}/model.safetensors")
        json.dump(conf, open(f"{out}/config.json", "w"), indent=1)
    label = "" if family == "dflash" else f" {family}"
    print(f"# {args.drafters}{label} drafters in {args.out}-{suffix} ({time.time() - t0:.1f} s total)", flush=True)
