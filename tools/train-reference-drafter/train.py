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
     With --extra-prompts, the target also answers a second prompt set, in file order, for as long
     as --extra-gen-seconds allows (run v2); its sequences join the training set.
  4. two series are trained from the same data, same seed, same number of steps, together in one
     loop (identical batches, anchors and initial weights):
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
(tied) LM head. AdamW, linear warm-up then cosine decay, grad-clip 1.0, bf16 autocast. With
--kd-weight w (run v2) the label is soft: q = w * softmax(target logits at a+k-1) + (1 - w) *
onehot(y_{a+k}), the target's logits coming from its final-normed last hidden state (kept with the
taps) through its LM head; the loss is computed a chunk of rows at a time (BlockLoss).

This file is long (~1,200 lines) because it is one self-contained pipeline that runs on a bare GPU
machine as a single script; its sections (target, drafter, loss, evaluation, main) are marked.

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
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
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
def generate_greedy(model, prompts, max_new, eos_id, batch_size, device, tokens_per_batch=None):
    """Greedy continuations, batched with left padding. Returns a list of (ids, eos_hit).

    Prompts are sorted by length so a batch holds similar lengths (less padding); the result is
    returned in input order. A batch holds at most `batch_size` prompts and, with
    `tokens_per_batch`, at most that many KV-cache rows (prompts x (longest prompt + max_new)),
    so long prompts come in smaller batches. A batch that runs out of GPU memory is split in two
    and retried (recorded in the log)."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out = [None] * len(prompts)
    batches, s = [], 0
    while s < len(order):
        n = batch_size
        if tokens_per_batch:
            L = len(prompts[order[min(s + n, len(order)) - 1]])
            n = max(1, min(n, tokens_per_batch // (L + max_new)))
        batches.append(order[s : s + n])
        s += n
    while batches:
        idx = batches.pop(0)
        try:
            new = _generate_batch(model, [prompts[i] for i in idx], max_new, eos_id, device)
        except torch.OutOfMemoryError:
            if len(idx) == 1:
                raise
            torch.cuda.empty_cache()
            log(f"generate: out of GPU memory at batch {len(idx)}: splitting it in two")
            batches[:0] = [idx[: len(idx) // 2], idx[len(idx) // 2 :]]
            continue
        for i, seq in zip(idx, new):
            if eos_id in seq:
                out[i] = (seq[: seq.index(eos_id) + 1], True)
            else:
                out[i] = (seq, False)
    return out


def _generate_batch(model, prompts, max_new, eos_id, device):
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), eos_id, dtype=torch.long)
    att = torch.zeros((len(prompts), L), dtype=torch.long)
    for r, p in enumerate(prompts):
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
    return gen[:, L:].cpu().tolist()


@torch.no_grad()
def extract_taps(model, seqs, hs_indices, batch_size, device):
    """One teacher-forced target pass per batch (right padding, causal so padding never leaks).

    Returns the taps packed sequence after sequence, without padding: [sum of lengths, U, H] bf16
    on the device (U = len(hs_indices), HF hidden-state indices; sequence i starts at row
    offsets[i]), the target's argmax packed the same way [sum of lengths] (its prediction of the
    NEXT token at every position), and the offsets."""
    lens = torch.tensor([len(s) for s in seqs])
    offsets = torch.cumsum(lens, 0) - lens
    H = model.config.hidden_size
    taps = torch.empty((int(lens.sum()), len(hs_indices), H), dtype=torch.bfloat16, device=device)
    argmax = torch.empty((int(lens.sum()),), dtype=torch.long, device=device)
    head = model.get_output_embeddings().weight
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    for s in range(0, len(seqs), batch_size):
        idx = order[s : s + batch_size]
        L = max(len(seqs[i]) for i in idx)
        ids = torch.zeros((len(idx), L), dtype=torch.long)
        att = torch.zeros((len(idx), L), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, : len(seqs[i])] = torch.tensor(seqs[i])
            att[r, : len(seqs[i])] = 1
        # The base model only: the full-vocabulary logits of every position are never materialised
        # (the argmax comes from the last hidden state, chunked).
        o = model.model(input_ids=ids.to(device), attention_mask=att.to(device), output_hidden_states=True, use_cache=False)
        att = att.to(device).bool()
        rows = (offsets[idx].to(device)[:, None] + torch.arange(L, device=device)[None])[att]
        taps[rows] = torch.stack([o.hidden_states[k][att] for k in hs_indices], dim=1).to(torch.bfloat16)
        argmax[rows] = chunked_argmax(o.last_hidden_state[att], head)
        del o
    return taps, argmax, offsets.to(device)


def chunked_argmax(h, head, chunk=8192):
    """argmax over the vocabulary of h @ head.T, a chunk of rows at a time."""
    out = torch.empty(h.shape[:-1], dtype=torch.long, device=h.device)
    hf, of = h.reshape(-1, h.shape[-1]), out.view(-1)
    for c in range(0, hf.shape[0], chunk):
        of[c : c + chunk] = (hf[c : c + chunk].to(head.dtype) @ head.T).argmax(-1)
    return out


class SeqData:
    """Prompt+continuation sequences with their taps, all on the device.

    `taps` is either packed [sum of lengths, U, H] with `offsets` (what build_data makes) or
    padded [N, Smax, U, H] with offsets None (tools/bench/hf_e2e.py builds it that way);
    `tf_argmax` follows the same layout (or is None)."""

    def __init__(self, names, prompt_ids, conts, taps, tf_argmax, hs_indices, device, offsets=None):
        self.names = names
        self.seqs = [p + c for p, c in zip(prompt_ids, conts)]
        N, Smax = len(self.seqs), max(len(s) for s in self.seqs)
        tokens = torch.zeros((N, Smax), dtype=torch.long)
        for i, s in enumerate(self.seqs):
            tokens[i, : len(s)] = torch.tensor(s)
        self.tokens = tokens.to(device)
        self.P = torch.tensor([len(p) for p in prompt_ids], device=device)
        self.T = torch.tensor([len(s) for s in self.seqs], device=device)
        self.taps = taps
        self.offsets = offsets
        self.tf_argmax = tf_argmax
        self.hs_indices = hs_indices
        self.N = N

    def tap_slots(self, target_layer_ids):
        return [self.hs_indices.index(i + 1) for i in target_layer_ids]

    def rows(self, idx, pos):
        """Packed-row index of positions pos [b, ...] of sequences idx [b] (clamped into each
        sequence: positions past its end read its last row, which callers mask out)."""
        shape = (-1,) + (1,) * (pos.dim() - 1)
        last = (self.T[idx] - 1).view(shape)
        return self.offsets[idx].view(shape) + torch.minimum(pos, last)

    def gather_taps(self, idx, S, slots):
        """Taps of sequences idx for positions 0..S-1: [b, S, len(slots) * H], slots in order."""
        if self.offsets is None:
            return self.taps[idx, :S][:, :, slots].flatten(2)
        pos = torch.arange(S, device=idx.device)[None].expand(len(idx), S)
        return self.taps[self.rows(idx, pos)][:, :, slots].flatten(2)

    def tap_at(self, idx, pos, slot):
        """One tap (slot) at positions pos [b, ...] of sequences idx [b] (clamped as in rows())."""
        if self.offsets is None:
            shape = (-1,) + (1,) * (pos.dim() - 1)
            p = torch.minimum(pos, (self.T[idx] - 1).view(shape))
            return self.taps[idx.view(shape).expand_as(p), p, slot]
        return self.taps[self.rows(idx, pos), slot]

    def greedy_consistency(self):
        """Fraction of continuation tokens that the teacher-forced pass's argmax reproduces."""
        Smax = self.tokens.shape[1]
        pos = torch.arange(Smax, device=self.tokens.device)[None].expand(self.N, Smax)
        if self.offsets is None:
            am = self.tf_argmax[:, :Smax]
        else:
            am = self.tf_argmax[self.rows(torch.arange(self.N, device=pos.device), pos)]
        # the argmax at p predicts the token at p + 1; continuation tokens are P..T-1
        want = (pos >= self.P[:, None] - 1) & (pos <= self.T[:, None] - 2)
        ok = ((am[:, :-1] == self.tokens[:, 1:]) & want[:, :-1]).sum()
        return int(ok) / max(int(want.sum()), 1)


def regenerate(model, tok, prompt_rows, max_prompt, max_new, gen_batch, device, tokens_per_batch=None, deadline=None, round_prompts=None):
    """Chat-templated prompt ids and the target's greedy continuations (the training labels).

    Returns a plain dict of token ids that `--ids-out` stores and `--ids-in` reuses, so a later run
    (or the second series trained in parallel) skips the generation. With `deadline` (unix time),
    the prompts are taken in file order, `round_prompts` at a time, and no round starts after the
    deadline: the prompts done are a prefix of the file (`prompts_in` counts only those)."""
    eos = tok.convert_tokens_to_ids(EOS_TOKEN)
    step = round_prompts if deadline is not None and round_prompts else max(len(prompt_rows), 1)
    names, pids, gens, dropped, taken = [], [], [], 0, 0
    t = time.time()
    while taken < len(prompt_rows) and (deadline is None or time.time() < deadline):
        rn, rp = [], []
        for r in prompt_rows[taken : taken + step]:
            ids = chat_ids(tok, r["messages"]) if r["messages"] is not None else tok(r["prompt"], add_special_tokens=False)["input_ids"]
            if len(ids) > max_prompt:
                dropped += 1
                continue
            rn.append(r["id"])
            rp.append(ids)
        taken += len(prompt_rows[taken : taken + step])
        gens += generate_greedy(model, rp, max_new, eos, gen_batch, device, tokens_per_batch)
        names += rn
        pids += rp
        if deadline is not None:
            log(f"generated {len(pids)} of {len(prompt_rows)} prompts ({time.time() - t:.0f} s)")
    tg = time.time() - t
    conts = [g[0] for g in gens]
    keep = [i for i, c in enumerate(conts) if len(c) >= 2]  # need at least one anchor with a next token
    return {
        "names": [names[i] for i in keep],
        "prompt_ids": [pids[i] for i in keep],
        "continuations": [conts[i] for i in keep],
        "prompts_in": taken,
        "prompts_offered": len(prompt_rows),
        "dropped_prompt_too_long": dropped,
        "dropped_short_continuation": len(gens) - len(keep),
        "eos_hit": sum(1 for i in keep if gens[i][1]),
        "generate_s": round(tg, 1),
        "max_new": max_new,
    }


def build_data(model, ids, tf_batch, hs_indices, device, label, max_rows=None):
    """Teacher-forced taps for regenerated (or reloaded) sequences. With `max_rows`, only the
    leading sequences whose prompt+continuation rows fit in it are kept (the taps live on the GPU:
    ~6.9 KB per row for 6 taps), and the rest are counted as `dropped_for_memory`."""
    names, pids, conts = ids["names"], ids["prompt_ids"], ids["continuations"]
    n = len(names)
    if max_rows is not None:
        rows, n = 0, 0
        while n < len(names) and rows + len(pids[n]) + len(conts[n]) <= max_rows:
            rows += len(pids[n]) + len(conts[n])
            n += 1
        names, pids, conts = names[:n], pids[:n], conts[:n]
    t = time.time()
    taps, am, offsets = extract_taps(model, [p + c for p, c in zip(pids, conts)], hs_indices, tf_batch, device)
    tt = time.time() - t
    data = SeqData(names, pids, conts, taps, am, hs_indices, device, offsets=offsets)
    ntok = sum(len(c) for c in conts)
    info = {
        **{k: ids[k] for k in ("prompts_in", "dropped_prompt_too_long", "dropped_short_continuation", "eos_hit", "generate_s") if k in ids},
        "dropped_for_memory": len(ids["names"]) - n,
        "sequences": data.N,
        "continuation_tokens": ntok,
        "mean_prompt_tokens": sum(len(p) for p in pids) / max(len(pids), 1),
        "mean_continuation_tokens": ntok / max(len(conts), 1),
        "tap_rows": int(taps.shape[0]),
        "taps_s": round(tt, 1),
        "teacher_forced_argmax_agreement": round(data.greedy_consistency(), 5),
    }
    log(f"{label}: {json.dumps(info)}")
    return data, info


def merge_ids(parts):
    """One training set from several regenerated sets (e.g. the reused ids of an earlier run and
    the continuations generated in this one), in order; the counters are summed."""
    out = {"names": [], "prompt_ids": [], "continuations": []}
    for p in parts:
        for k, v in p.items():
            if isinstance(v, list):
                out[k] = out.get(k, []) + v
            elif isinstance(v, (int, float)) and k != "max_new":
                out[k] = round(out.get(k, 0) + v, 1)
    out["parts"] = [len(p["names"]) for p in parts]
    return out


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
    """Block tokens [y_a, MASK x (B-1)] embedded by the target; labels y_{a+k}; in-bounds mask;
    and the label positions a+k [b,n,B-1]."""
    tok = data.tokens[seq_idx]  # [b, Smax]
    first = torch.gather(tok, 1, anchors)
    blk = torch.full(anchors.shape + (B,), MASK_TOKEN_ID, dtype=torch.long, device=tok.device)
    blk[..., 0] = first
    k = torch.arange(1, B, device=tok.device)
    pos = anchors[..., None] + k  # [b,n,B-1]
    T = data.T[seq_idx][:, None, None]
    inb = pos < T
    labels = torch.gather(tok, 1, pos.clamp(max=tok.shape[1] - 1).flatten(1)).view(pos.shape)
    return E[blk], labels, inb, pos


def streaks(correct):
    """Accepted length A per block: leading positions that are correct (invalid counts as wrong)."""
    return torch.cumprod(correct.int(), dim=-1).sum(-1)


class BlockLoss(torch.autograd.Function):
    """The drafted rows' loss through the frozen LM head, a chunk of rows at a time, for one or
    more drafters trained on the same rows (the series trained together).

    Per row: cross-entropy against q = kd * softmax(teacher logits) + (1 - kd) * onehot(label),
    weighted by `weights` (normalised by the caller: the loss is sum(w * ce)). kd = 0 is the
    hard-label loss of the earlier runs. Since q's argmax is the label whenever kd <= 0.5, the
    soft part never asks for another top-1 than the target's greedy token. The full
    [rows, vocab] logits never exist at once: each chunk's gradient w.r.t. h is computed in the
    forward pass (softmax(z) - q) and kept for backward.

    forward(head [V,D], labels [R], weights [R], teacher [R,D] or None, kd, chunk, *hs [R,D])
    returns, per drafter: the loss, the hard-label CE (weighted sum, not differentiable) and the
    top-1 == label mask [R] (not differentiable)."""

    @staticmethod
    def forward(ctx, head, labels, weights, teacher, kd, chunk, *hs):
        R = labels.shape[0]
        n = len(hs)
        grads = [torch.empty_like(h) for h in hs]
        loss = [torch.zeros((), dtype=torch.float32, device=head.device) for _ in hs]
        hard = [torch.zeros((), dtype=torch.float32, device=head.device) for _ in hs]
        correct = [torch.empty(R, dtype=torch.bool, device=head.device) for _ in hs]
        for c in range(0, R, chunk):
            y = labels[c : c + chunk, None]
            w = weights[c : c + chunk, None].float()
            pt = None
            if kd > 0:
                pt = torch.softmax((teacher[c : c + chunk].to(head.dtype) @ head.T).float(), dim=-1)
            for j in range(n):
                z = (hs[j][c : c + chunk].to(head.dtype) @ head.T).float()  # [c, V]
                correct[j][c : c + chunk] = z.argmax(-1) == y[:, 0]
                lse = torch.logsumexp(z, dim=-1, keepdim=True)
                zy = z.gather(1, y)
                hard[j] += (w * (lse - zy)).sum()
                ce = lse - (1 - kd) * zy
                if pt is not None:
                    ce = ce - kd * (pt * z).sum(-1, keepdim=True)
                loss[j] += (w * ce).sum()
                g = z.sub_(lse).exp_()  # softmax, in place of z
                if pt is not None:
                    g.sub_(kd * pt)
                g.scatter_add_(1, y, torch.full_like(zy, -(1 - kd)))
                g.mul_(w)
                grads[j][c : c + chunk] = (g.to(head.dtype) @ head).to(grads[j].dtype)
                del z, g
        ctx.save_for_backward(*grads)
        ctx.mark_non_differentiable(*hard, *correct)
        return (*loss, *hard, *correct)

    @staticmethod
    def backward(ctx, *grad_out):
        n = len(ctx.saved_tensors)
        return (None, None, None, None, None, None) + tuple(g * go for g, go in zip(ctx.saved_tensors, grad_out[:n]))


def block_loss(hs, head, labels, weights, teacher=None, kd=0.0, chunk=8192):
    """BlockLoss.apply with lists: returns (losses, hard_ces, corrects), one entry per drafter."""
    out = BlockLoss.apply(head, labels, weights, teacher, float(kd), int(chunk), *hs)
    n = len(hs)
    return list(out[:n]), list(out[n : 2 * n]), list(out[2 * n :])


def train_series(series_list, data, E, lm_head, args, device, out_dir, target_cfg):
    """Train one drafter per series in `series_list` (a name or a list) in ONE loop: every series
    sees exactly the same batches and anchors (and the same initial weights: each drafter is built
    after re-seeding), and the shared work (batch, anchors, labels, the KD teacher's softmax) is
    done once per step. Returns ({series: [checkpoint paths]}, info)."""
    if isinstance(series_list, str):
        series_list = [series_list]
    drafters, cfgs, opts, slots = {}, {}, {}, {}
    # A run split over several processes (device calls of at most 10 minutes): --resume restores
    # everything the loop's next step depends on, so the steps after it are the ones one process
    # would have taken (same batches, anchors, schedule; cuBLAS reductions aside).
    state = torch.load(args.resume, map_location=device, weights_only=False) if getattr(args, "resume", None) else None
    for s in series_list:
        torch.manual_seed(args.seed)
        random.seed(args.seed)
        cfgs[s] = drafter_config(target_cfg, s, args.block_size, args.layers, args.intermediate, args.rope_theta)
        drafters[s] = Drafter(cfgs[s]).to(device)
        opts[s] = torch.optim.AdamW(drafters[s].parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
        slots[s] = data.tap_slots(SERIES[s]["target_layer_ids"])
    nparams = sum(p.numel() for p in drafters[series_list[0]].parameters())
    kd = args.kd_weight
    kd_slot = data.hs_indices.index(target_cfg.num_hidden_layers) if kd > 0 else None
    B, nA, bs = args.block_size, args.anchors, args.batch_seqs
    wk = torch.exp(-torch.arange(B - 1, device=device, dtype=torch.float32) / args.gamma)  # k=1..B-1
    steps = state["steps"] if state else args.steps
    warm = max(1, int(args.warmup_ratio * steps))

    def lr_at(step):
        if step < warm:
            return args.lr * (step + 1) / warm
        pr = (step - warm) / max(1, steps - warm)
        return args.lr * (args.lr_min_ratio + (1 - args.lr_min_ratio) * 0.5 * (1 + math.cos(math.pi * pr)))

    save_at = sorted(set(int(round(f * steps)) for f in args.save_fracs))
    gen = torch.Generator(device=device).manual_seed(args.seed)
    cpu_gen = torch.Generator().manual_seed(args.seed)
    T_cpu = data.T.cpu()
    # batches are drawn on the CPU so that the loop never waits on the GPU to size a batch
    perm, pp = torch.randperm(data.N, generator=cpu_gen), 0
    window = {s: [] for s in series_list}
    saved = {s: [] for s in series_list}
    gn = {}
    first_step, t_before = 1, 0.0
    if state:
        for s in series_list:
            drafters[s].load_state_dict(state["drafters"][s])
            opts[s].load_state_dict(state["opts"][s])
        window, saved, gn = state["window"], state["saved"], state["gn"]
        perm, pp = state["perm"], state["pp"]
        gen.set_state(state["gen"])
        cpu_gen.set_state(state["cpu_gen"])
        first_step, t_before = state["step"] + 1, state["train_seconds"]
        log(f"resumed from {args.resume} after step {state['step']} of {steps} ({t_before:.0f} s of training before)")
    t_start = time.time() - t_before
    for s in series_list:
        log(
            f"{s}: {nparams} params ({args.layers} layers, MLP {args.intermediate}), taps {SERIES[s]['target_layer_ids']} "
            f"(hs {[data.hs_indices[i] for i in slots[s]]}), inclusive={SERIES[s]['inclusive']}, kd {kd}, {steps} steps, saves at {save_at}"
        )
    t_warm = None
    stop_epoch = getattr(args, "train_stop_epoch", None)
    for step in range(first_step, steps + 1):
        if step == first_step + 10:  # steady-state timing starts after 10 warm-up steps (allocator, cuBLAS plans)
            sync(device)
            t_warm = time.time()
        if pp + bs > data.N:
            perm, pp = torch.randperm(data.N, generator=cpu_gen), 0
        idx_cpu = perm[pp : pp + bs]
        pp += bs
        S = int(T_cpu[idx_cpu].max())
        idx = idx_cpu.to(device, non_blocking=True)
        # anchors: uniform without replacement over completion positions a in [P, T-2]
        pos = torch.arange(S, device=device)[None]
        valid = (pos >= data.P[idx][:, None]) & (pos <= data.T[idx][:, None] - 2)
        r = torch.rand((len(idx), S), device=device, generator=gen).masked_fill(~valid, -1.0)
        n_take = min(nA, S)
        vals, anchors = r.topk(n_take, dim=1)
        keep = vals >= 0
        anchors = torch.where(keep, anchors, data.P[idx][:, None].expand_as(anchors))
        emb, labels, inb, lpos = block_inputs(data, idx, anchors, B, E)
        valid_k = inb & keep[..., None]
        w = wk * valid_k
        wn = (w / w.sum().clamp(min=1e-6)).flatten()
        # KD teacher: the target's final-normed last hidden state at a+k-1 (its logits there
        # predict the label y_{a+k}); rows out of bounds have weight 0.
        teacher = data.tap_at(idx, lpos - 1, kd_slot).flatten(0, 2) if kd > 0 else None
        hs = []
        for s in series_list:
            taps = data.gather_taps(idx, S, slots[s])  # [b,S,n_taps*H], target_layer_ids order
            with torch.autocast(device, dtype=torch.bfloat16):
                hs.append(drafters[s](taps, emb.to(torch.bfloat16), anchors, SERIES[s]["inclusive"])[:, :, 1:].flatten(0, 2))
        losses, hards, corrects = block_loss(hs, lm_head, labels.flatten(), wn, teacher, kd, args.loss_chunk)
        for s in series_list:
            for g in opts[s].param_groups:
                g["lr"] = lr_at(step - 1)
            opts[s].zero_grad(set_to_none=True)
        sum(losses).backward()
        for j, s in enumerate(series_list):
            gn[s] = torch.nn.utils.clip_grad_norm_(drafters[s].parameters(), 1.0)
            opts[s].step()
            with torch.no_grad():
                correct = corrects[j].view(labels.shape) & valid_k
                A = streaks(correct)
                window[s].append(
                    torch.stack(
                        [hards[j].detach(), correct.sum().float(), valid_k.sum().float(), (A * keep).sum().float(), keep.sum().float(), losses[j].detach()]
                    )
                )
                window[s] = window[s][-args.metric_window :]
        stopped = step < steps and (
            (stop_epoch is not None and time.time() > stop_epoch) or step == getattr(args, "stop_after_step", None)  # the latter: selftest
        )
        last = step == steps or stopped
        if step % args.log_every == 0 or step in save_at or step == 1 or last:
            for s in series_list:
                m = torch.stack(window[s]).sum(0).tolist()
                log(
                    f"{s} step {step}/{steps} loss {m[0] / len(window[s]):.4f} flat_acc {m[1] / max(m[2], 1):.4f} "
                    f"streak {m[3] / max(m[4], 1):.3f}" + (f" kd_objective {m[5] / len(window[s]):.4f}" if kd > 0 else "")
                    + f" lr {lr_at(step - 1):.2e} gnorm {float(gn[s]):.2f} ({time.time() - t_start:.0f}s)"
                )
        if stopped and getattr(args, "state_out", None):
            state = {
                "steps": steps, "step": step, "train_seconds": time.time() - t_start,
                "drafters": {s: drafters[s].state_dict() for s in series_list},
                "opts": {s: opts[s].state_dict() for s in series_list},
                "window": window, "saved": saved, "gn": gn, "perm": perm, "pp": pp,
                "gen": gen.get_state(), "cpu_gen": cpu_gen.get_state(),
            }
            torch.save(state, args.state_out + ".tmp")
            os.replace(args.state_out + ".tmp", args.state_out)
            log(f"train: past this call's deadline at step {step} of {steps}: state saved to {args.state_out} for --resume")
            return saved, {"params": nparams, "train_seconds": round(time.time() - t_start, 1), "steps": step, "steps_planned": steps, "resumable": True}
        if step in save_at or stopped:
            if stopped:
                log(f"train: past the training deadline at step {step} of {steps}: saving this step as the last checkpoint")
            for s in series_list:
                m = torch.stack(window[s]).sum(0).tolist()
                metrics = {
                    "series": s,
                    "step": step,
                    "steps_total": steps,
                    "train_style": {
                        "what": "averages over the last %d training batches, measured the way training sees blocks: "
                        "uniform anchors over completion positions, context %s, labels = target greedy tokens; loss = hard-label CE"
                        % (len(window[s]), "kv <= a (inclusive, the leaky mask)" if SERIES[s]["inclusive"] else "kv < a (strict)"),
                        "loss": m[0] / len(window[s]),
                        "flat_accuracy": m[1] / max(m[2], 1),
                        "mean_streak": m[3] / max(m[4], 1),
                        "mean_streak_plus_bonus": 1 + m[3] / max(m[4], 1),
                        **({"kd_objective": m[5] / len(window[s])} if kd > 0 else {}),
                    },
                    "blocks_seen": step * bs * nA,
                    "sequences_seen": step * bs,
                    "train_seconds": round(time.time() - t_start, 1),
                    "recipe": recipe_dict(args, s),
                }
                path = os.path.join(out_dir, f"{CKPT_PREFIX}-{s}", f"step-{step}")
                save_checkpoint(drafters[s], cfgs[s], path, metrics)
                saved[s].append(path)
                log(f"saved {path}")
        if last:
            break
    sync(device)
    steady = (time.time() - t_warm) / (step - first_step - 9) if t_warm is not None and step > first_step + 9 else None
    return saved, {"params": nparams, "train_seconds": round(time.time() - t_start, 1), "steps": step, "steps_planned": steps, "steady_step_s": steady}


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
        "schedule": f"linear warm-up, cosine to {args.lr_min_ratio} x lr",
        "drafter_layers": args.layers,
        "intermediate_size": args.intermediate,
        "loss": "cross-entropy against q = kd * softmax(target logits at a+k-1) + (1 - kd) * onehot(y_{a+k}), kd = %g" % args.kd_weight
        if args.kd_weight > 0
        else "hard-label cross-entropy",
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
        taps = data.gather_taps(idx, S, slots)
        ar = torch.arange(nmax, device=device)[None]
        anchors = data.P[idx][:, None] + ar
        keep = anchors <= data.T[idx][:, None] - 2
        anchors = torch.where(keep, anchors, data.P[idx][:, None].expand_as(anchors))
        emb, labels, inb, _ = block_inputs(data, idx, anchors, B, E)
        with torch.autocast(device, dtype=torch.bfloat16):
            h = drafter(taps, emb.to(torch.bfloat16), anchors, inclusive)[:, :, 1:]
        top1 = chunked_argmax(h, lm_head)
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
    ap.add_argument("--max-train-seqs", type=int, default=None, help="train on the first N sequences of each part (reloaded, extra) only (dry runs)")
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
    ap.add_argument("--steps", type=int, default=3000, help="training steps (upper bound when --time-budget is set); all series train together, one step of each per step")
    ap.add_argument("--time-budget", type=float, default=None, help="training seconds (all series together): the step count is lowered to fit, from the steady-state timing of a 30-step probe")
    ap.add_argument("--probe-steps", type=int, default=30, help="steps of the timing probe (the first 10 are not timed)")
    ap.add_argument("--save-fracs", default="0.1,0.35,1.0", help="checkpoints at these fractions of the steps")
    ap.add_argument("--metric-window", type=int, default=50)
    ap.add_argument("--eval-blocks", type=int, default=4096, help="blocks per evaluation forward")
    ap.add_argument("--deadline-epoch", type=float, default=None, help="unix time by which everything must be written; the training time budget shrinks to fit (keeps --eval-reserve seconds), and training stops early, saving its last step, if it runs into half of that reserve")
    ap.add_argument("--eval-reserve", type=float, default=60.0)
    ap.add_argument("--log-every", type=int, default=250)
    ap.add_argument("--ids-out", default=None, help="write the regenerated token ids (train + eval) as .json.gz")
    ap.add_argument("--ids-in", action="append", default=[], help="reuse token ids written by --ids-out / --ids-extra-out instead of regenerating (repeatable: later files add their keys, e.g. an earlier run's ids then the extra sequences of a later one)")
    ap.add_argument("--ids-extra-out", default=None, help="write only the sequences generated from --extra-prompts (key train_extra) as .json.gz")
    ap.add_argument("--rendezvous", default=None, metavar="DIR:N", help="N processes training series in parallel agree on one step count through DIR")
    ap.add_argument("--extra-prompts", default=None, help="more training prompts (JSONL, .gz allowed) whose responses this run generates, in file order, until --extra-gen-seconds; added to the training set after the --ids-in / regenerated one (skipped when --ids-in already holds them)")
    ap.add_argument("--extra-limit", type=int, default=None, help="first N prompts of --extra-prompts")
    ap.add_argument("--extra-gen-seconds", type=float, default=150.0, help="no new generation round starts after this many seconds of generating --extra-prompts")
    ap.add_argument("--reserve-after-gen", type=float, default=280.0, help="with --deadline-epoch: no generation round starts later than this many seconds before the deadline (taps, training, evaluation)")
    ap.add_argument("--gen-round", type=int, default=4096, help="prompts per generation round under --extra-gen-seconds")
    ap.add_argument("--gen-tokens", type=int, default=None, help="KV-cache rows per generation batch (prompts x (longest prompt + max new)): long prompts come in smaller batches")
    ap.add_argument("--gpu-reserve-gb", type=float, default=32.0, help="GPU memory kept free beside the training taps (step buffers, evaluation); training sequences that do not fit are dropped, last first, and counted")
    ap.add_argument("--kd-weight", type=float, default=0.0, help="weight of the target's soft labels (KD) in the loss, 0..0.5 (0: hard labels only)")
    ap.add_argument("--loss-chunk", type=int, default=8192, help="rows per chunk of the LM-head loss")
    ap.add_argument("--lr-min-ratio", type=float, default=0.1, help="the cosine schedule ends at this fraction of --lr")
    ap.add_argument("--results", default="results.json", help="name of the results file in --out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--export-target", default=None, metavar="DIR", help="save the loaded target (fp32) and its fixed tokenizer as an HF folder, for a later call's --target (loads in seconds, not the GGUF's dequantisation)")
    ap.add_argument("--state-out", default=None, help="when training stops at the deadline, save the loop's whole state here (weights, optimiser, batch order, RNGs) instead of a last checkpoint, and stop without evaluating: a later call continues with --resume")
    ap.add_argument("--resume", default=None, help="continue the training saved by --state-out (same data: pass the same --ids-in files; the step count and schedule come from the state)")
    ap.add_argument("--later-seconds", type=float, default=0.0, help="with --state-out: training seconds the resumed call(s) will add; the probe sizes the step count for this call's budget plus these")
    args = ap.parse_args()
    args.save_fracs = [float(x) for x in args.save_fracs.split(",")]
    if not 0 <= args.kd_weight <= 0.5:
        raise SystemExit(f"train.py: --kd-weight {args.kd_weight}: must be in [0, 0.5] (above 0.5 the soft label could outvote the greedy token)")
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
    if args.export_target:
        # the GGUF quantizer refuses to serialise; the weights are already dequantised fp32, so
        # drop it (the reloaded folder's state dict equals this one, checked on the CPU)
        target.hf_quantizer, target.is_quantized = None, False
        if hasattr(target.config, "quantization_config"):
            del target.config.quantization_config
        target.save_pretrained(args.export_target)
        tok.save_pretrained(args.export_target)
        log(f"target saved as an HF folder in {args.export_target}")
    results["stages"]["load_s"] = round(time.time() - T0, 1)
    log(f"target loaded: {target.config.num_hidden_layers} layers, vocab {target.config.vocab_size}")

    series_list = [s for s in args.series.split(",") if s]
    hs_indices = {i + 1 for s in series_list for i in SERIES[s]["target_layer_ids"]}
    if args.kd_weight > 0:
        # the KD teacher: the final-normed last hidden state (hs[num_layers]); logits = it @ LM head
        hs_indices.add(target.config.num_hidden_layers)
    hs_indices = sorted(hs_indices)
    # Token ids first (regenerated by the target, or reloaded from --ids-in), taps second.
    if args.ids_in:
        all_ids = {}
        for path in args.ids_in:
            with gzip.open(path, "rt") as f:
                all_ids.update(json.load(f))
        log(f"token ids reloaded from {', '.join(args.ids_in)} (no regeneration): {', '.join(k for k in all_ids if k != 'eval')}")
        if "train" not in all_ids or "eval" not in all_ids:
            raise SystemExit(f"train.py: --ids-in {args.ids_in}: no 'train' or 'eval' key (give the --ids-out file of an earlier run first)")
    else:
        rows = read_prompts(args.train_prompts, args.max_train_prompts)
        held = []
        if args.heldout_frac > 0:
            k = max(2, round(1 / args.heldout_frac))
            held = rows[k - 1 :: k]
            rows = [r for i, r in enumerate(rows) if i % k != k - 1]
        all_ids = {"train": regenerate(target, tok, rows, args.max_prompt_tokens, args.max_new, args.gen_batch, device, args.gen_tokens), "eval": {}}
        if held:
            all_ids["eval"]["heldout"] = regenerate(target, tok, held, args.max_prompt_tokens, args.eval_max_new, args.gen_batch, device, args.gen_tokens)
        for spec in args.eval:
            name, path = spec.split("=", 1)
            erows = read_prompts(path, args.eval_limit)
            all_ids["eval"][name] = regenerate(target, tok, erows, 4096, args.eval_max_new, args.gen_batch, device, args.gen_tokens)
    if args.extra_prompts and "train_extra" in all_ids:
        log(f"--extra-prompts: the --ids-in file already holds {len(all_ids['train_extra']['names'])} extra sequences: reused, none generated")
    elif args.extra_prompts:
        t = time.time()
        deadline = t + args.extra_gen_seconds
        if args.deadline_epoch:
            deadline = min(deadline, args.deadline_epoch - args.reserve_after_gen)
        rows = read_prompts(args.extra_prompts, args.extra_limit)
        log(f"generating the responses of up to {len(rows)} extra prompts for {args.extra_gen_seconds:.0f} s")
        all_ids["train_extra"] = regenerate(target, tok, rows, args.max_prompt_tokens, args.max_new, args.gen_batch, device, args.gen_tokens, deadline=deadline, round_prompts=args.gen_round)
        results["stages"]["extra_generation_s"] = round(time.time() - t, 1)
        if device == "cuda":
            torch.cuda.empty_cache()
    if args.ids_out:
        tmp = args.ids_out + ".tmp"
        with gzip.open(tmp, "wt") as f:
            json.dump(all_ids, f)
        os.replace(tmp, args.ids_out)
        log(f"token ids written to {args.ids_out}")
    if args.ids_extra_out and "train_extra" in all_ids:
        tmp = args.ids_extra_out + ".tmp"
        with gzip.open(tmp, "wt") as f:
            json.dump({"train_extra": all_ids["train_extra"]}, f)
        os.replace(tmp, args.ids_extra_out)
        log(f"extra token ids written to {args.ids_extra_out}")
    if not series_list:
        log("no series asked: stopping after the data")
        return
    parts = [all_ids["train"]] + ([all_ids["train_extra"]] if "train_extra" in all_ids else [])
    if args.max_train_seqs:  # dry runs: the first N sequences of each part
        parts = [{k: (v[: args.max_train_seqs] if isinstance(v, list) else v) for k, v in p.items()} for p in parts]
    train_ids = merge_ids(parts)
    max_rows = None
    if device == "cuda":
        row_bytes = len(hs_indices) * target.config.hidden_size * 2
        max_rows = int((torch.cuda.get_device_properties(0).total_memory - args.gpu_reserve_gb * 2**30) / row_bytes)
        log(f"training taps: at most {max_rows} rows ({row_bytes} bytes each, {args.gpu_reserve_gb:.0f} GiB kept free)")
    t = time.time()
    train_data, info = build_data(target, train_ids, args.tf_batch, hs_indices, device, "train", max_rows)
    info["sources"] = {"ids": train_ids["parts"]}
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
        if args.eval_limit:
            ids = {k: (v[: args.eval_limit] if isinstance(v, list) else v) for k, v in ids.items()}
        d, einfo = build_data(target, ids, 16, hs_indices, device, f"eval:{name}")
        evals[name] = d
        results.setdefault("eval_data", {})[name] = einfo
        results.setdefault("eval_continuations", {})[name] = {n: s[len(s) - (int(d.T[i]) - int(d.P[i])) :] for i, (n, s) in enumerate(zip(d.names, d.seqs))}
    results["stages"]["taps_s"] = round(time.time() - t, 1)
    write_json(res_path, results)

    if args.deadline_epoch:
        left = args.deadline_epoch - time.time() - args.eval_reserve
        if args.time_budget is None or left < args.time_budget:
            log(f"deadline: {left:.0f} s left for training (asked {args.time_budget})")
            args.time_budget = max(10.0, left)
        args.train_stop_epoch = args.deadline_epoch - args.eval_reserve / 2
        results["time_budget"] = args.time_budget
    if args.time_budget and not args.resume:
        # Probe: time a few steps of the real loop, then fix the step count (recorded in results).
        probe = argparse.Namespace(**vars(args))
        probe.steps, probe.save_fracs, probe.log_every, probe.train_stop_epoch = max(12, args.probe_steps), [], 10**9, None
        _, pinfo = train_series(series_list, train_data, E, lm_head, probe, device, os.path.join(args.out, "probe"), target.config)
        per_step = pinfo["steady_step_s"]
        if args.rendezvous:
            per_step = rendezvous_step_time(args.rendezvous, series_list, per_step)
        budget = args.time_budget
        if args.deadline_epoch:  # what is left after the probe
            budget = min(budget, args.deadline_epoch - time.time() - args.eval_reserve)
        args.steps = max(min(50, args.steps), min(args.steps, int((budget + args.later_seconds) / per_step)))
        results["step_seconds_probe"] = per_step
        log(f"probe: {per_step * 1000:.1f} ms/step ({'+'.join(series_list)}) -> {args.steps} steps")
    results["steps"] = args.steps

    t = time.time()
    saved_all, tinfo = train_series(series_list, train_data, E, lm_head, args, device, args.out, target.config)
    results["stages"]["train_s"] = round(time.time() - t, 1)
    results["steps"] = tinfo["steps_planned"]
    if tinfo.get("resumable"):
        results["train_part"] = tinfo
        results["total_s"] = round(time.time() - T0, 1)
        write_json(res_path, results)
        log("stopped for --resume: no evaluation in this call")
        return
    results["series"] = {}
    t = time.time()
    for s in series_list:
        results["series"][s] = {"train": tinfo, "checkpoints": {}}
        for path in saved_all[s]:
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
    results["stages"]["eval_s"] = round(time.time() - t, 1)
    results["total_s"] = round(time.time() - T0, 1)
    write_json(res_path, results)
    log("done")


if __name__ == "__main__":
    main()
