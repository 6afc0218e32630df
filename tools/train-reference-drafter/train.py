#!/usr/bin/env python3
"""Train reference DFlash drafters for SmolLM2-135M-Instruct (SpecForge-style recipe) and evaluate them.

One command runs the whole pipeline on one GPU (see README.md beside this file):

  1. target: SmolLM2-135M-Instruct, fp32 (from the Q4_1 GGUF, or from a plain HF folder that
     tools/golden/make_goldens.py --export-hf wrote from it).
  2. data: every training prompt is chat-templated (the model's own template, generation prompt on)
     and the target's greedy continuation is regenerated (do_sample off, <= --max-new tokens,
     stops at <|im_end|>). Labels are therefore the target's own greedy tokens, never dataset text.
  3. one teacher-forced target pass over prompt+continuation gives the taps: HF hidden_states[id+1]
     for each target_layer_id (0-based decoder-layer outputs; for id 29, the last layer, that is
     hs[30] = final_norm(output of layer 29) under the HF convention).
  4. two series are trained from the same data, same seed, same number of steps:
       reference  taps [1, 8, 15, 22, 27], context strictly before the anchor (kv < a)   — correct
       leaky      taps [1, 8, 15, 22, 29], context up to and including the anchor (kv <= a),
                  i.e. the inclusive-mask bug plus a tap on the target's last layer
  5. every saved checkpoint is evaluated on held-out prompt sets (HumanEval, and GSM8K / MT-Bench
     when given), never used for training: target greedy continuation, one target pass, the
     drafter run per anchor exactly as in deployment (context < a, block [y_a, MASK x (B-1)]),
     and the online chain replayed (a0 = first completion position, a_{i+1} = a_i + A(a_i) + 1).
     For the leaky series the same data is also scored the way its training saw it (kv <= a).

Recipe (docs/dflash.md §2.1): anchors sampled uniformly without replacement from completion positions
(a in [P, T-2], so that y_{a+1} exists), block = [y_a, MASK x (B-1)] embedded with the target's frozen
embedding, row k (1..B-1) predicts y_{a+k}, hard cross-entropy with weights exp(-(k-1)/gamma) x
in-bounds, normalised by the weight sum; the drafter's own final norm, then the target's frozen
(tied) LM head. AdamW, linear warm-up then cosine decay, grad-clip 1.0, bf16 autocast.

Checkpoints are written in the z-lab DFlash format: config.json (model_type qwen3, architectures
[DFlashDraftModel], block_size, dflash_config {mask_token_id, target_layer_ids}, ...) and
model.safetensors in bf16 with fc / hidden_norm / norm / layers.{i}.* names and no embeddings or
LM head; plus train_metrics.json (training-style metrics at that step and the GPU-side evaluation).
"""

import argparse
import gzip
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

T0 = time.time()

SERIES = {
    "reference": {"target_layer_ids": [1, 8, 15, 22, 27], "inclusive": False},
    "leaky": {"target_layer_ids": [1, 8, 15, 22, 29], "inclusive": True},
}
MASK_TOKEN_ID = 16  # `<empty_output>`: a CONTROL token of SmolLM2's vocabulary that chat text never contains
EOS_TOKEN = "<|im_end|>"
# Checkpoint folder prefix (<prefix>-<series>/step-N) and the target named in each recipe;
# train_hybrid.py sets both for its hybrid target.
CKPT_PREFIX = "smollm2"
TARGET_DESC = "SmolLM2-135M-Instruct Q4_1 GGUF (dequantised, fp32)"


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


# ----------------------------------------------------------------------------------------------
# Target
# ----------------------------------------------------------------------------------------------


def load_target(path, device):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if path.endswith(".gguf"):
        d, name = os.path.split(os.path.abspath(path))
        tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32, attn_implementation="sdpa")
    else:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    fix_smollm_pre_tokenizer(tok)
    model = model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    assert tok.convert_ids_to_tokens(MASK_TOKEN_ID) == "<empty_output>", tok.convert_ids_to_tokens(MASK_TOKEN_ID)
    return tok, model


def fix_smollm_pre_tokenizer(tok):
    """SmolLM2's pre-tokenizer (`smollm` in its GGUF, and its own tokenizer.json) splits digits one by
    one before the GPT-2 byte-level regex; transformers 5.17 builds plain ByteLevel from the GGUF,
    which tokenises a whitespace run before a digit differently ("    3"). draftlens follows the
    GGUF, so the prompts here must too (tools/golden/make_goldens.py does the same)."""
    from tokenizers import pre_tokenizers

    pre = json.loads(tok.backend_tokenizer.to_str())["pre_tokenizer"]
    if pre.get("type") == "ByteLevel":
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
        )
    probe = tok("    3", add_special_tokens=False)["input_ids"]
    assert len(probe) == 2, f"pre-tokenizer is not smollm-like: '    3' -> {probe}"


def chat_ids(tok, messages):
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def read_prompts(path, limit=None):
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not JSON: {e}")
            if "messages" in r:
                msgs = r["messages"]
            elif "prompt" in r:
                msgs = None
            else:
                raise SystemExit(f"{path}:{n}: neither 'messages' nor 'prompt'")
            rows.append({"id": r.get("id", f"{os.path.basename(path)}:{n}"), "messages": msgs, "prompt": r.get("prompt")})
            if limit and len(rows) >= limit:
                break
    return rows


@torch.no_grad()
def generate_greedy(model, prompts, max_new, eos_id, batch_size, device):
    """Greedy continuations, batched with left padding. Returns a list of (ids, eos_hit).

    Prompts are sorted by length so a batch holds similar lengths (less padding); the result is
    returned in input order."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out = [None] * len(prompts)
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        L = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), L), eos_id, dtype=torch.long)
        att = torch.zeros((len(idx), L), dtype=torch.long)
        for r, i in enumerate(idx):
            p = prompts[i]
            ids[r, L - len(p) :] = torch.tensor(p)
            att[r, L - len(p) :] = 1
        gen = model.generate(
            input_ids=ids.to(device),
            attention_mask=att.to(device),
            max_new_tokens=max_new,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            eos_token_id=eos_id,
            pad_token_id=eos_id,
        )
        new = gen[:, L:].cpu().tolist()
        for r, i in enumerate(idx):
            seq = new[r]
            if eos_id in seq:
                seq = seq[: seq.index(eos_id) + 1]
                out[i] = (seq, True)
            else:
                out[i] = (seq, False)
    return out


@torch.no_grad()
def extract_taps(model, seqs, hs_indices, batch_size, device):
    """One teacher-forced target pass per batch (right padding, causal so padding never leaks).

    Returns taps [N, Smax, U, H] bf16 on the device (U = len(hs_indices), HF hidden-state indices)
    and the target's argmax [N, Smax] (its prediction of the NEXT token at every position)."""
    N = len(seqs)
    Smax = max(len(s) for s in seqs)
    H = model.config.hidden_size
    taps = torch.zeros((N, Smax, len(hs_indices), H), dtype=torch.bfloat16, device=device)
    argmax = torch.zeros((N, Smax), dtype=torch.long, device=device)
    order = sorted(range(N), key=lambda i: len(seqs[i]))
    for s in range(0, N, batch_size):
        idx = order[s : s + batch_size]
        L = max(len(seqs[i]) for i in idx)
        ids = torch.zeros((len(idx), L), dtype=torch.long)
        att = torch.zeros((len(idx), L), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, : len(seqs[i])] = torch.tensor(seqs[i])
            att[r, : len(seqs[i])] = 1
        o = model(input_ids=ids.to(device), attention_mask=att.to(device), output_hidden_states=True, use_cache=False)
        hs = torch.stack([o.hidden_states[k] for k in hs_indices], dim=2)  # [b, L, U, H]
        it = torch.tensor(idx, device=device)
        taps[it, :L] = hs.to(torch.bfloat16)
        argmax[it, :L] = o.logits.argmax(-1)
        del o, hs
    return taps, argmax


class SeqData:
    """Prompt+continuation sequences with their taps, all on the device."""

    def __init__(self, names, prompt_ids, conts, taps, tf_argmax, hs_indices, device):
        self.names = names
        self.seqs = [p + c for p, c in zip(prompt_ids, conts)]
        N, Smax = len(self.seqs), max(len(s) for s in self.seqs)
        self.tokens = torch.zeros((N, Smax), dtype=torch.long, device=device)
        for i, s in enumerate(self.seqs):
            self.tokens[i, : len(s)] = torch.tensor(s, device=device)
        self.P = torch.tensor([len(p) for p in prompt_ids], device=device)
        self.T = torch.tensor([len(s) for s in self.seqs], device=device)
        self.taps = taps
        self.tf_argmax = tf_argmax
        self.hs_indices = hs_indices
        self.N = N

    def tap_slots(self, target_layer_ids):
        return [self.hs_indices.index(i + 1) for i in target_layer_ids]

    def greedy_consistency(self):
        """Fraction of continuation tokens that the teacher-forced pass's argmax reproduces."""
        ok = tot = 0
        for i in range(self.N):
            P, T = int(self.P[i]), int(self.T[i])
            if T - P < 1:
                continue
            ok += int((self.tf_argmax[i, P - 1 : T - 1] == self.tokens[i, P:T]).sum())
            tot += T - P
        return ok / max(tot, 1)


def regenerate(model, tok, prompt_rows, max_prompt, max_new, gen_batch, device):
    """Chat-templated prompt ids and the target's greedy continuations (the training labels).

    Returns a plain dict of token ids that `--ids-out` stores and `--ids-in` reuses, so a later run
    (or the second series trained in parallel) skips the generation."""
    eos = tok.convert_tokens_to_ids(EOS_TOKEN)
    names, pids, dropped = [], [], 0
    for r in prompt_rows:
        ids = chat_ids(tok, r["messages"]) if r["messages"] is not None else tok(r["prompt"], add_special_tokens=False)["input_ids"]
        if len(ids) > max_prompt:
            dropped += 1
            continue
        names.append(r["id"])
        pids.append(ids)
    t = time.time()
    gens = generate_greedy(model, pids, max_new, eos, gen_batch, device)
    tg = time.time() - t
    conts = [g[0] for g in gens]
    keep = [i for i, c in enumerate(conts) if len(c) >= 2]  # need at least one anchor with a next token
    return {
        "names": [names[i] for i in keep],
        "prompt_ids": [pids[i] for i in keep],
        "continuations": [conts[i] for i in keep],
        "prompts_in": len(prompt_rows),
        "dropped_prompt_too_long": dropped,
        "dropped_short_continuation": len(gens) - len(keep),
        "eos_hit": sum(1 for i in keep if gens[i][1]),
        "generate_s": round(tg, 1),
        "max_new": max_new,
    }


def build_data(model, ids, tf_batch, hs_indices, device, label):
    """Teacher-forced taps for regenerated (or reloaded) sequences."""
    names, pids, conts = ids["names"], ids["prompt_ids"], ids["continuations"]
    t = time.time()
    taps, am = extract_taps(model, [p + c for p, c in zip(pids, conts)], hs_indices, tf_batch, device)
    tt = time.time() - t
    data = SeqData(names, pids, conts, taps, am, hs_indices, device)
    ntok = sum(len(c) for c in conts)
    info = {
        **{k: ids[k] for k in ("prompts_in", "dropped_prompt_too_long", "dropped_short_continuation", "eos_hit", "generate_s")},
        "sequences": data.N,
        "continuation_tokens": ntok,
        "mean_prompt_tokens": sum(len(p) for p in pids) / max(len(pids), 1),
        "mean_continuation_tokens": ntok / max(len(conts), 1),
        "taps_s": round(tt, 1),
        "teacher_forced_argmax_agreement": round(data.greedy_consistency(), 5),
    }
    log(f"{label}: {json.dumps(info)}")
    return data, info


# ----------------------------------------------------------------------------------------------
# Drafter (docs/dflash.md §1.1)
# ----------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope(x, cos, sin):
    """Rotate-half ("NeoX") RoPE, as Qwen3: x * cos + rotate_half(x) * sin."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def rope_table(pos, head_dim, theta):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim))
    f = pos.float()[..., None] * inv
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


class DraftLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, hq, hk, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.hq, self.hk, self.hd = hq, hk, hd
        self.input_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(H, hq * hd, bias=False)
        self.self_attn.k_proj = nn.Linear(H, hk * hd, bias=False)
        self.self_attn.v_proj = nn.Linear(H, hk * hd, bias=False)
        self.self_attn.o_proj = nn.Linear(hq * hd, H, bias=False)
        self.self_attn.q_norm = RMSNorm(hd, c["rms_norm_eps"])
        self.self_attn.k_norm = RMSNorm(hd, c["rms_norm_eps"])
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(H, c["intermediate_size"], bias=False)
        self.mlp.up_proj = nn.Linear(H, c["intermediate_size"], bias=False)
        self.mlp.down_proj = nn.Linear(c["intermediate_size"], H, bias=False)

    def forward(self, x, ctx, ctx_cs, blk_cs, ctx_allowed):
        """x [b,n,B,H] block rows; ctx [b,S,H] context features; ctx_allowed [b,n,S] bool."""
        a = self.self_attn
        b, n, B, _ = x.shape
        S = ctx.shape[1]
        hq, hk, hd = self.hq, self.hk, self.hd
        g = hq // hk
        h = self.input_layernorm(x)
        q = rope(a.q_norm(a.q_proj(h).view(b, n, B, hq, hd)), *blk_cs)
        kb = rope(a.k_norm(a.k_proj(h).view(b, n, B, hk, hd)), *blk_cs)
        vb = a.v_proj(h).view(b, n, B, hk, hd)
        kc = rope(a.k_norm(a.k_proj(ctx).view(b, S, hk, hd)), *ctx_cs)
        vc = a.v_proj(ctx).view(b, S, hk, hd)
        q = q.view(b, n, B, hk, g, hd)
        scale = hd**-0.5
        sc = torch.einsum("bnqkgd,bskd->bnkgqs", q, kc).float() * scale  # context keys
        sb = torch.einsum("bnqkgd,bnpkd->bnkgqp", q, kb).float() * scale  # same-block keys (bidirectional)
        sc = sc.masked_fill(~ctx_allowed[:, :, None, None, None, :], float("-inf"))
        p = torch.softmax(torch.cat([sc, sb], dim=-1), dim=-1)
        pc, pb = p[..., :S].to(vc.dtype), p[..., S:].to(vb.dtype)
        o = torch.einsum("bnkgqs,bskd->bnqkgd", pc, vc) + torch.einsum("bnkgqp,bnpkd->bnqkgd", pb, vb)
        x = x + a.o_proj(o.reshape(b, n, B, hq * hd))
        m = self.mlp
        h = self.post_attention_layernorm(x)
        return x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))


class Drafter(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        H = c["hidden_size"]
        n_taps = len(c["dflash_config"]["target_layer_ids"])
        self.fc = nn.Linear(n_taps * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, c["rms_norm_eps"])
        self.layers = nn.ModuleList([DraftLayer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(H, c["rms_norm_eps"])
        for mod in self.modules():
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, std=0.02)

    def forward(self, taps, block_emb, anchors, inclusive):
        """taps [b,S,n_taps*H] (this series' taps, in target_layer_ids order); block_emb [b,n,B,H];
        anchors [b,n]. Context row s is visible to the block at anchor a iff s < a (s <= a if
        inclusive, the leaky variant). Returns the normed hidden states of all B rows [b,n,B,H]."""
        b, S, _ = taps.shape
        n, B = anchors.shape[1], block_emb.shape[2]
        hd, theta = self.c["head_dim"], self.c["rope_theta"]
        ctx = self.hidden_norm(self.fc(taps))
        s_pos = torch.arange(S, device=taps.device)
        cc, cs = rope_table(s_pos, hd, theta)
        ctx_cs = (cc[None, :, None, :], cs[None, :, None, :])
        bpos = anchors[..., None] + torch.arange(B, device=taps.device)
        bc, bs = rope_table(bpos, hd, theta)
        blk_cs = (bc[..., None, :], bs[..., None, :])
        lim = anchors[..., None] + (1 if inclusive else 0)
        ctx_allowed = s_pos[None, None, :] < lim
        x = block_emb
        for layer in self.layers:
            x = layer(x, ctx, ctx_cs, blk_cs, ctx_allowed)
        return self.norm(x)


def drafter_config(target_cfg, series, block_size, layers, intermediate, rope_theta):
    H = target_cfg.hidden_size
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": block_size,
        "dflash_config": {"mask_token_id": MASK_TOKEN_ID, "target_layer_ids": list(SERIES[series]["target_layer_ids"])},
        "num_target_layers": target_cfg.num_hidden_layers,
        "num_hidden_layers": layers,
        "hidden_size": H,
        "intermediate_size": intermediate,
        "num_attention_heads": target_cfg.num_attention_heads,
        "num_key_value_heads": target_cfg.num_key_value_heads,
        "head_dim": H // target_cfg.num_attention_heads,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
        "vocab_size": target_cfg.vocab_size,
        "layer_types": ["full_attention"] * layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def save_checkpoint(drafter, cfg, path, metrics):
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in drafter.state_dict().items()}
    save_file(sd, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    write_json(os.path.join(path, "train_metrics.json"), metrics)


def load_checkpoint(path, device):
    from safetensors.torch import load_file

    cfg = json.load(open(os.path.join(path, "config.json")))
    d = Drafter(cfg)
    sd = load_file(os.path.join(path, "model.safetensors"))
    d.load_state_dict({k: v.float() for k, v in sd.items()})
    return d.to(device).eval(), cfg


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# Blocks, loss, metrics
# ----------------------------------------------------------------------------------------------


def block_inputs(data, seq_idx, anchors, B, E):
    """Block tokens [y_a, MASK x (B-1)] embedded by the target; labels y_{a+k}; in-bounds mask."""
    tok = data.tokens[seq_idx]  # [b, Smax]
    first = torch.gather(tok, 1, anchors)
    blk = torch.full(anchors.shape + (B,), MASK_TOKEN_ID, dtype=torch.long, device=tok.device)
    blk[..., 0] = first
    k = torch.arange(1, B, device=tok.device)
    pos = anchors[..., None] + k  # [b,n,B-1]
    T = data.T[seq_idx][:, None, None]
    inb = pos < T
    labels = torch.gather(tok, 1, pos.clamp(max=tok.shape[1] - 1).flatten(1)).view(pos.shape)
    return E[blk], labels, inb


def streaks(correct):
    """Accepted length A per block: leading positions that are correct (invalid counts as wrong)."""
    return torch.cumprod(correct.int(), dim=-1).sum(-1)


def train_series(series, data, E, lm_head, args, device, out_dir, target_cfg):
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    spec = SERIES[series]
    cfg = drafter_config(target_cfg, series, args.block_size, args.layers, args.intermediate, args.rope_theta)
    drafter = Drafter(cfg).to(device)
    nparams = sum(p.numel() for p in drafter.parameters())
    slots = data.tap_slots(spec["target_layer_ids"])
    B, nA, bs = args.block_size, args.anchors, args.batch_seqs
    wk = torch.exp(-torch.arange(B - 1, device=device, dtype=torch.float32) / args.gamma)  # k=1..B-1
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    steps = args.steps
    warm = max(1, int(args.warmup_ratio * steps))

    def lr_at(step):
        if step < warm:
            return args.lr * (step + 1) / warm
        pr = (step - warm) / max(1, steps - warm)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * pr)))

    save_at = sorted(set(int(round(f * steps)) for f in args.save_fracs))
    gen = torch.Generator(device=device).manual_seed(args.seed)
    cpu_gen = torch.Generator().manual_seed(args.seed)
    T_cpu = data.T.cpu()
    # batches are drawn on the CPU so that the loop never waits on the GPU to size a batch
    perm, pp = torch.randperm(data.N, generator=cpu_gen), 0
    window = []
    saved = []
    t_start = time.time()
    log(f"{series}: {nparams} params, taps {spec['target_layer_ids']} (hs {[data.hs_indices[s] for s in slots]}), inclusive={spec['inclusive']}, {steps} steps, saves at {save_at}")
    t_warm = None
    for step in range(1, steps + 1):
        if step == 11:  # steady-state timing starts after 10 warm-up steps (allocator, cuBLAS plans)
            sync(device)
            t_warm = time.time()
        if pp + bs > data.N:
            perm, pp = torch.randperm(data.N, generator=cpu_gen), 0
        idx_cpu = perm[pp : pp + bs]
        pp += bs
        S = int(T_cpu[idx_cpu].max())
        idx = idx_cpu.to(device, non_blocking=True)
        taps = data.taps[idx, :S][:, :, slots].flatten(2)  # [b,S,n_taps*H], target_layer_ids order
        # anchors: uniform without replacement over completion positions a in [P, T-2]
        pos = torch.arange(S, device=device)[None]
        valid = (pos >= data.P[idx][:, None]) & (pos <= data.T[idx][:, None] - 2)
        r = torch.rand((len(idx), S), device=device, generator=gen).masked_fill(~valid, -1.0)
        n_take = min(nA, S)
        vals, anchors = r.topk(n_take, dim=1)
        keep = vals >= 0
        anchors = torch.where(keep, anchors, data.P[idx][:, None].expand_as(anchors))
        emb, labels, inb = block_inputs(data, idx, anchors, B, E)
        valid_k = inb & keep[..., None]
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1)
        with torch.autocast(device, dtype=torch.bfloat16):
            h = drafter(taps, emb.to(torch.bfloat16), anchors, spec["inclusive"])[:, :, 1:]
            logits = F.linear(h, lm_head)
            ce = F.cross_entropy(logits.flatten(0, 2).float(), labels.flatten(), reduction="none").view(labels.shape)
        w = wk * valid_k
        loss = (ce * w).sum() / w.sum().clamp(min=1e-6)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            correct = (logits.argmax(-1) == labels) & valid_k
            A = streaks(correct)
            window.append(
                torch.stack(
                    [loss.detach(), correct.sum().float(), valid_k.sum().float(), (A * keep).sum().float(), keep.sum().float()]
                )
            )
            window = window[-args.metric_window :]
        if step % args.log_every == 0 or step in save_at or step == 1:
            m = torch.stack(window).sum(0).tolist()
            log(
                f"{series} step {step}/{steps} loss {m[0] / len(window):.4f} flat_acc {m[1] / max(m[2], 1):.4f} "
                f"streak {m[3] / max(m[4], 1):.3f} lr {lr_at(step - 1):.2e} gnorm {float(gn):.2f} ({time.time() - t_start:.0f}s)"
            )
        if step in save_at:
            m = torch.stack(window).sum(0).tolist()
            metrics = {
                "series": series,
                "step": step,
                "steps_total": steps,
                "train_style": {
                    "what": "averages over the last %d training batches, measured the way training sees blocks: "
                    "uniform anchors over completion positions, context %s, labels = target greedy tokens"
                    % (len(window), "kv <= a (inclusive, the leaky mask)" if spec["inclusive"] else "kv < a (strict)"),
                    "loss": m[0] / len(window),
                    "flat_accuracy": m[1] / max(m[2], 1),
                    "mean_streak": m[3] / max(m[4], 1),
                    "mean_streak_plus_bonus": 1 + m[3] / max(m[4], 1),
                },
                "blocks_seen": step * bs * nA,
                "sequences_seen": step * bs,
                "train_seconds": round(time.time() - t_start, 1),
                "recipe": recipe_dict(args, series),
            }
            path = os.path.join(out_dir, f"{CKPT_PREFIX}-{series}", f"step-{step}")
            save_checkpoint(drafter, cfg, path, metrics)
            saved.append(path)
            log(f"saved {path}")
    sync(device)
    steady = (time.time() - t_warm) / (steps - 10) if t_warm is not None and steps > 10 else None
    return saved, {"params": nparams, "train_seconds": round(time.time() - t_start, 1), "steps": steps, "steady_step_s": steady}


def rendezvous_step_time(spec, series_list, mine):
    """Series trained in parallel processes must run the same number of steps (the `leaky` series is
    the `reference` recipe with only the leak changed). Each process publishes its probe's step time
    in DIR and waits for the others; all then use the slowest."""
    folder, n = spec.rsplit(":", 1)
    os.makedirs(folder, exist_ok=True)
    me = os.path.join(folder, "+".join(series_list) + ".probe")
    with open(me + ".tmp", "w") as f:
        f.write(repr(mine))
    os.replace(me + ".tmp", me)
    t0 = time.time()
    while True:
        probes = [p for p in os.listdir(folder) if p.endswith(".probe")]
        if len(probes) >= int(n):
            break
        if time.time() - t0 > 300:
            raise SystemExit(f"rendezvous {folder}: only {len(probes)} of {n} probes after 300 s")
        time.sleep(0.5)
    times = [float(open(os.path.join(folder, p)).read()) for p in probes]
    log(f"rendezvous: step times {['%.1f ms' % (t * 1000) for t in times]} -> using the slowest")
    return max(times)


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def recipe_dict(args, series):
    return {
        "series": series,
        "target": TARGET_DESC,
        "target_layer_ids": SERIES[series]["target_layer_ids"],
        "tap_convention": "HF hidden_states[id+1]",
        "context_mask": "kv <= a (inclusive: the leaky bug)" if SERIES[series]["inclusive"] else "kv < a (strict)",
        "block_size": args.block_size,
        "gamma": args.gamma,
        "anchors_per_sequence": args.anchors,
        "sequences_per_step": args.batch_seqs,
        "lr": args.lr,
        "warmup_ratio": args.warmup_ratio,
        "schedule": "linear warm-up, cosine to 0.1 x lr",
        "weight_decay": args.weight_decay,
        "grad_clip": 1.0,
        "precision": "bf16 autocast, fp32 master weights, fp32 softmax/CE",
        "mask_token_id": MASK_TOKEN_ID,
        "seed": args.seed,
    }


# ----------------------------------------------------------------------------------------------
# Evaluation: per-anchor drafting exactly as deployed, replayed online chain
# ----------------------------------------------------------------------------------------------


@torch.no_grad()
def draft_all_anchors(drafter, cfg, data, E, lm_head, inclusive, device, max_blocks=4096):
    """For every sequence and every anchor a in [P, T-2]: matches [n_a, B-1] of the drafter's top-1
    against the target's greedy tokens, and the in-bounds mask. Each block sees only its own
    context (mask per block), so the batched result equals one block per forward."""
    slots = data.tap_slots(cfg["dflash_config"]["target_layer_ids"])
    B = cfg["block_size"]
    res = []
    order = list(range(data.N))
    i = 0
    while i < len(order):
        # group sequences so that (sequences x max anchors) stays under max_blocks
        grp, nmax = [], 0
        while i < len(order):
            j = order[i]
            na = int(data.T[j] - 1 - data.P[j])
            if grp and max(nmax, na) * (len(grp) + 1) > max_blocks:
                break
            grp.append(j)
            nmax = max(nmax, na)
            i += 1
        idx = torch.tensor(grp, device=device)
        S = int(data.T[idx].max())
        taps = data.taps[idx, :S][:, :, slots].flatten(2)
        ar = torch.arange(nmax, device=device)[None]
        anchors = data.P[idx][:, None] + ar
        keep = anchors <= data.T[idx][:, None] - 2
        anchors = torch.where(keep, anchors, data.P[idx][:, None].expand_as(anchors))
        emb, labels, inb = block_inputs(data, idx, anchors, B, E)
        with torch.autocast(device, dtype=torch.bfloat16):
            h = drafter(taps, emb.to(torch.bfloat16), anchors, inclusive)[:, :, 1:]
            top1 = F.linear(h, lm_head).argmax(-1)
        match = (top1 == labels) & inb
        for r, j in enumerate(grp):
            na = int(data.T[j] - 1 - data.P[j])
            res.append((j, match[r, :na].cpu(), inb[r, :na].cpu()))
    res.sort(key=lambda x: x[0])
    return [(m, v) for _, m, v in res]


def replay(match, inb, truncate=None):
    """Online greedy chain over the per-anchor results of one sequence.

    Anchor index 0 = position P (the first completion token, produced by prefill, not counted).
    Round at anchor a accepts A(a) drafts and produces A+1 tokens (bonus included); the last round
    is capped by what remains, so tokens = (continuation length - 1) exactly.
    Returns (tokens, rounds, list of A+1 per round)."""
    n = match.shape[0]  # anchors P..T-2, i.e. continuation length N = n + 1
    if truncate is not None:
        n = min(n, truncate - 1)
    A_all = streaks(match & inb)
    a, rounds, per = 0, 0, []
    while a < n:
        A = int(A_all[a])
        remaining = n - a
        prod = min(A + 1, remaining)
        per.append(prod)
        rounds += 1
        a += A + 1
    return n, rounds, per


def evaluate(per_seq, cfg, inclusive, truncate=None):
    """Summarise draft_all_anchors() output: replayed tau, uniform-anchor mean(A+1), accuracies."""
    B = cfg["block_size"]
    taus, tok_sum, round_sum = [], 0, 0
    uni_sum, uni_n = 0.0, 0
    pos_ok = torch.zeros(B - 1)
    pos_n = torch.zeros(B - 1)
    flat_ok = flat_n = 0
    hist = [0] * B
    for m, v in per_seq:
        if truncate is not None:
            lim = truncate - 1
            m, v = m[:lim].clone(), v[:lim].clone()
            # positions beyond the truncated continuation do not exist
            pos = torch.arange(m.shape[0])[:, None] + torch.arange(1, B)[None]
            v &= pos < truncate
            m &= v
        tokens, rounds, per = replay(m, v)
        if rounds == 0:
            continue
        taus.append(tokens / rounds)
        tok_sum += tokens
        round_sum += rounds
        for x in per:
            hist[x - 1] += 1
        A = streaks(m & v)
        uni_sum += float((A + 1).sum())
        uni_n += A.numel()
        pos_ok += (m & v).sum(0).float()
        pos_n += v.sum(0).float()
        flat_ok += int((m & v).sum())
        flat_n += int(v.sum())
    return {
        "prompts": len(taus),
        "replayed_tau_macro": sum(taus) / max(len(taus), 1),
        "replayed_tau_pooled": tok_sum / max(round_sum, 1),
        "rounds": round_sum,
        "tokens": tok_sum,
        "uniform_anchor_mean_A_plus_1": uni_sum / max(uni_n, 1),
        "flat_accuracy": flat_ok / max(flat_n, 1),
        "per_position_accuracy": [round(float(a / max(b, 1)), 4) for a, b in zip(pos_ok, pos_n)],
        "replay_histogram_A_plus_1": hist,
        "mask": "kv <= a (train-style, inclusive)" if inclusive else "kv < a (deployment)",
        "max_new_tokens": truncate,
    }


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf, or an HF folder exported from it")
    ap.add_argument("--train-prompts", required=True, help="JSONL from build_prompts.py")
    ap.add_argument("--eval", action="append", default=[], metavar="NAME=PATH", help="held-out prompt set (draftlens JSONL), repeatable")
    ap.add_argument("--out", required=True, help="output folder (checkpoints under smollm2-<series>/step-<N>/, results.json)")
    ap.add_argument("--eval-limit", type=int, default=None, help="first N prompts of each eval set (dry runs)")
    ap.add_argument("--heldout-frac", type=float, default=0.0, help="hold back this fraction of the training prompts (every k-th) as the eval set `heldout`: the training sets' own distribution, never trained on")
    ap.add_argument("--train-sample", type=int, default=0, help="also evaluate on the first N training sequences (eval set `train-sample`): far above `heldout`, the drafter memorised its training data")
    ap.add_argument("--series", default="reference,leaky")
    ap.add_argument("--max-train-prompts", type=int, default=None)
    ap.add_argument("--max-prompt-tokens", type=int, default=512)
    ap.add_argument("--max-new", type=int, default=256, help="max new tokens of the regenerated training responses")
    ap.add_argument("--eval-max-new", type=int, default=256)
    ap.add_argument("--eval-truncations", default="128", help="also report replayed tau on the first N continuation tokens")
    ap.add_argument("--gen-batch", type=int, default=256)
    ap.add_argument("--tf-batch", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--intermediate", type=int, default=512)
    ap.add_argument("--rope-theta", type=float, default=1e6)
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--anchors", type=int, default=64)
    ap.add_argument("--batch-seqs", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup-ratio", type=float, default=0.04)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=3000, help="training steps per series (upper bound when --time-budget is set)")
    ap.add_argument("--time-budget", type=float, default=None, help="seconds per series: the step count is lowered to fit, from the steady-state timing of a 30-step probe")
    ap.add_argument("--save-fracs", default="0.1,0.35,1.0", help="checkpoints at these fractions of the steps")
    ap.add_argument("--metric-window", type=int, default=50)
    ap.add_argument("--eval-blocks", type=int, default=4096, help="blocks per evaluation forward")
    ap.add_argument("--deadline-epoch", type=float, default=None, help="unix time by which everything must be written; the per-series time budget shrinks to fit (keeps --eval-reserve seconds)")
    ap.add_argument("--eval-reserve", type=float, default=60.0)
    ap.add_argument("--log-every", type=int, default=250)
    ap.add_argument("--ids-out", default=None, help="write the regenerated token ids (train + eval) as .json.gz")
    ap.add_argument("--ids-in", default=None, help="reuse token ids written by --ids-out instead of regenerating")
    ap.add_argument("--rendezvous", default=None, metavar="DIR:N", help="N processes training series in parallel agree on one step count through DIR")
    ap.add_argument("--results", default="results.json", help="name of the results file in --out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    args.save_fracs = [float(x) for x in args.save_fracs.split(",")]
    device = args.device
    if device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("train.py: no CUDA device")
        # The target stays in true fp32 (the labels are its greedy tokens; draftlens runs it in f32).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.out, exist_ok=True)
    results = {"args": vars(args), "stages": {}}
    res_path = os.path.join(args.out, args.results)

    tok, target = load_target(args.target, device)
    E32 = target.get_input_embeddings().weight.detach()
    E = E32.to(torch.bfloat16)  # frozen shared embedding, also the tied LM head
    lm_head = target.get_output_embeddings().weight.detach().to(torch.bfloat16)
    results["stages"]["load_s"] = round(time.time() - T0, 1)
    log(f"target loaded: {target.config.num_hidden_layers} layers, vocab {target.config.vocab_size}")

    series_list = [s for s in args.series.split(",") if s]
    hs_indices = sorted({i + 1 for s in series_list for i in SERIES[s]["target_layer_ids"]})
    # Token ids first (regenerated by the target, or reloaded from --ids-in), taps second.
    if args.ids_in:
        with gzip.open(args.ids_in, "rt") as f:
            all_ids = json.load(f)
        log(f"token ids reloaded from {args.ids_in} (no regeneration)")
    else:
        rows = read_prompts(args.train_prompts, args.max_train_prompts)
        held = []
        if args.heldout_frac > 0:
            k = max(2, round(1 / args.heldout_frac))
            held = rows[k - 1 :: k]
            rows = [r for i, r in enumerate(rows) if i % k != k - 1]
        all_ids = {"train": regenerate(target, tok, rows, args.max_prompt_tokens, args.max_new, args.gen_batch, device), "eval": {}}
        if held:
            all_ids["eval"]["heldout"] = regenerate(target, tok, held, args.max_prompt_tokens, args.eval_max_new, args.gen_batch, device)
        for spec in args.eval:
            name, path = spec.split("=", 1)
            erows = read_prompts(path, args.eval_limit)
            all_ids["eval"][name] = regenerate(target, tok, erows, 4096, args.eval_max_new, args.gen_batch, device)
    if args.ids_out:
        tmp = args.ids_out + ".tmp"
        with gzip.open(tmp, "wt") as f:
            json.dump(all_ids, f)
        os.replace(tmp, args.ids_out)
        log(f"token ids written to {args.ids_out}")
    if not series_list:
        log("no series asked: stopping after the data")
        return
    train_data, info = build_data(target, all_ids["train"], args.tf_batch, hs_indices, device, "train")
    results["train_data"] = info
    evals = {}
    # The named eval sets, then the memorisation check: held-out training prompts and a sample of
    # the training sequences themselves, scored the same way.
    eval_ids = {spec.split("=", 1)[0]: all_ids["eval"][spec.split("=", 1)[0]] for spec in args.eval}
    if "heldout" in all_ids["eval"]:
        eval_ids["heldout"] = all_ids["eval"]["heldout"]
    if args.train_sample:
        n = min(args.train_sample, len(all_ids["train"]["names"]))
        eval_ids["train-sample"] = {k: (v[:n] if isinstance(v, list) else v) for k, v in all_ids["train"].items()}
    for name, ids in eval_ids.items():
        d, einfo = build_data(target, ids, 16, hs_indices, device, f"eval:{name}")
        evals[name] = d
        results.setdefault("eval_data", {})[name] = einfo
        results.setdefault("eval_continuations", {})[name] = {n: s[len(s) - (int(d.T[i]) - int(d.P[i])) :] for i, (n, s) in enumerate(zip(d.names, d.seqs))}
    write_json(res_path, results)

    if args.deadline_epoch:
        left = (args.deadline_epoch - time.time() - args.eval_reserve) / len(series_list)
        if args.time_budget is None or left < args.time_budget:
            log(f"deadline: {left:.0f} s per series left for training (asked {args.time_budget})")
            args.time_budget = max(10.0, left)
        results["time_budget_per_series"] = args.time_budget
    if args.time_budget:
        # Probe: time a few steps of the real loop, then fix the step count (recorded in results).
        probe = argparse.Namespace(**vars(args))
        probe.steps, probe.save_fracs, probe.log_every = 30, [], 10**9
        _, pinfo = train_series(series_list[0], train_data, E, lm_head, probe, device, os.path.join(args.out, "probe"), target.config)
        per_step = pinfo["steady_step_s"]
        if args.rendezvous:
            per_step = rendezvous_step_time(args.rendezvous, series_list, per_step)
        args.steps = max(50, min(args.steps, int(args.time_budget / per_step)))
        results["step_seconds_probe"] = per_step
        log(f"probe: {per_step * 1000:.1f} ms/step -> {args.steps} steps per series")
    results["steps"] = args.steps

    results["series"] = {}
    for s in series_list:
        saved, tinfo = train_series(s, train_data, E, lm_head, args, device, args.out, target.config)
        results["series"][s] = {"train": tinfo, "checkpoints": {}}
        for path in saved:
            drafter, cfg = load_checkpoint(path, device)
            ev = {}
            for name, d in evals.items():
                per_seq = draft_all_anchors(drafter, cfg, d, E, lm_head, False, device, args.eval_blocks)
                ev[name] = evaluate(per_seq, cfg, False)
                for tr in [int(x) for x in args.eval_truncations.split(",") if x]:
                    ev[f"{name}@{tr}"] = evaluate(per_seq, cfg, False, truncate=tr)
                if SERIES[s]["inclusive"]:
                    per_seq = draft_all_anchors(drafter, cfg, d, E, lm_head, True, device, args.eval_blocks)
                    ev[f"{name}:train_style"] = evaluate(per_seq, cfg, True)
            mpath = os.path.join(path, "train_metrics.json")
            m = json.load(open(mpath))
            m["gpu_eval"] = {
                "what": "tools/train-reference-drafter/train.py evaluate(): held-out prompts, target greedy continuation "
                "(%s, max %d new tokens), drafter top-1 per anchor with context kv < a (deployment) unless the key says "
                "train_style (kv <= a); replayed tau = tokens/rounds of the online chain a0 = P, a_{i+1} = a_i + A + 1 "
                "(macro = mean of per-prompt values, pooled = sum tokens / sum rounds, bonus included)" % (TARGET_DESC, args.eval_max_new),
                **ev,
            }
            write_json(mpath, m)
            results["series"][s]["checkpoints"][os.path.basename(path)] = {"train_style": m["train_style"], "gpu_eval": ev}
            summary = ", ".join(f"{k}: tau {v['replayed_tau_macro']:.3f} flat {v['flat_accuracy']:.3f}" for k, v in ev.items())
            log(f"eval {path}: {summary}")
        write_json(res_path, results)
    results["total_s"] = round(time.time() - T0, 1)
    write_json(res_path, results)
    log("done")


if __name__ == "__main__":
    main()
