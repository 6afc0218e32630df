#!/usr/bin/env python3
"""Golden outputs of an EAGLE-3 drafter (SpecForge / vLLM `LlamaForCausalLMEagle3` layout), for
draftlens' EAGLE-3 implementation (crates/engine/src/drafter/eagle3/).

CPU only, pure PyTorch, float64 maths on the stored weights (bf16 values, exact in f32/f64). The
drafter written here is a random-weight checkpoint on top of the random Qwen3 golden target
(tests/fixtures/golden/qwen3: hidden 128, 4 layers, vocabulary 512); its taps are that golden's
f16 hidden states `p{i}.hs{t+1}` for tap id t (HF convention: decoder-layer outputs).

The reference below is written against the checkpoint layout and follows how the engines run the
draft (docs/eagle3.md §2):

  SpecForge specforge/modeling/draft/llama3_eagle.py (LlamaDecoderLayer, LlamaForCausalLMEagle3),
  vLLM vllm/model_executor/models/llama_eagle3.py (LlamaDecoderLayer, Eagle3LlamaForCausalLM),
  EAGLE eagle/model/cnets.py (Model.forward, Model.topK_genrate).

  * the draft's context row j (j = 0..a-1) holds the target's fused taps at position j and the
    embedding of token y_{j+1}, at RoPE position j: tokens are shifted one left of the features
    (cnets.py `input_ids = input_ids[:, 1:]`; vLLM's proposer writes target_token_ids[1:] and the
    next token next to the target's hidden states at the target's positions);
  * midlayer input = cat(input_layernorm(embed(token)), hidden_norm(hidden)), 2*hidden wide for
    q/k/v; the residual is the un-normed hidden; post_attention_layernorm + SwiGLU MLP;
  * step 1 at anchor a is context row a-1 (causal attention over rows 0..a-1); its logits
    lm_head(norm(h)) give d_1 (a draft-vocabulary id, mapped to the target by d_1 + d2t[d_1]);
  * step s >= 2 feeds the drafter's own pre-norm output h_{s-1} and the embedding of d_{s-1}, at
    position a-1+(s-1), attending to the context rows 0..a-1 and its own earlier step rows
    (causal), as the KV cache of vLLM / cnets.py holds them.

Written to tests/fixtures/golden/eagle3/ (one folder is the checkpoint and its golden):

  config.json, model.safetensors   the checkpoint (bf16 weights, I64 d2t, BOOL t2d)
  golden.safetensors               per prompt p and anchor a:
    p{p}.a{a}.draft_ids     I64 [K]     the chain's top-1 per step, target ids
    p{p}.a{a}.top8_ids      I64 [K, 8]  top-8 per step, target ids, best first
    p{p}.a{a}.top8_logprobs F32 [K, 8]  their log-softmax over the draft vocabulary
    p{p}.a{a}.margin        F32 [K]     top-1 minus top-2 logit per step (a near-tie may flip)
    p{p}.a{a}.hidden        F32 [K, D]  the midlayer's pre-norm output per step
  manifest.json                    settings, anchors, sha256s, tolerances

    /root/.pyenv/versions/3.12.1/bin/python3.12 tools/golden/make_eagle3_golden.py
"""

import argparse
import hashlib
import json
import math
import os
import sys

import torch

TARGET = "tests/fixtures/golden/qwen3"
TAPS = [0, 1, 2]  # decoder-layer outputs: hs1, hs2, hs3 of the 4-layer target
STEPS = 5  # chain length K (config num_speculative_tokens)
# p0: 12 prompt tokens, T = 44; p1: 23 prompt tokens, T = 55. Anchor 1 has a one-row context;
# 12 and 23 are the first completion anchors; 53 = T-2 is the last evaluated one.
ANCHORS = {0: [1, 12, 25, 40], 1: [23, 37, 53]}
D, HEADS, KV_HEADS, HEAD_DIM, INTER = 64, 4, 2, 16, 96
TARGET_HIDDEN, VOCAB, DRAFT_VOCAB = 128, 512, 160
ROPE_THETA, EPS = 10000.0, 1e-6
SEED = 20261206


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def config():
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": D,
        "intermediate_size": INTER,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rms_norm_eps": EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "max_position_embeddings": 1024,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
        "target_hidden_size": TARGET_HIDDEN,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "num_speculative_tokens": STEPS,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": TAPS, "use_aux_hidden_state": True},
    }


def random_weights(gen):
    """bf16 weights: matrices U(±sqrt(3/fan_in)) (variance 1/fan_in), with q_proj x2 (attention
    far from uniform), fc x0.15 (the taps are O(10)) and v_proj x2, o_proj x3, down_proj x2 so that
    the token and the attention move the residual stream (with plain scales the fed-back hidden
    state dominates and every chain repeats one token); norm scales U(0.5, 1.5); embedding N(0, 1)."""

    def mat(out, inp, scale=1.0):
        b = math.sqrt(3.0 / inp) * scale
        return ((torch.rand(out, inp, generator=gen) * 2 - 1) * b).to(torch.bfloat16)

    def norm(n):
        return (torch.rand(n, generator=gen) + 0.5).to(torch.bfloat16)

    qd, kvd = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    w = {
        "embed_tokens.weight": torch.randn(VOCAB, D, generator=gen).to(torch.bfloat16),
        "fc.weight": mat(D, 3 * TARGET_HIDDEN, 0.15),
        "midlayer.input_layernorm.weight": norm(D),
        "midlayer.hidden_norm.weight": norm(D),
        "midlayer.self_attn.q_proj.weight": mat(qd, 2 * D, 2.0),
        "midlayer.self_attn.k_proj.weight": mat(kvd, 2 * D),
        "midlayer.self_attn.v_proj.weight": mat(kvd, 2 * D, 2.0),
        "midlayer.self_attn.o_proj.weight": mat(D, qd, 3.0),
        "midlayer.post_attention_layernorm.weight": norm(D),
        "midlayer.mlp.gate_proj.weight": mat(INTER, D),
        "midlayer.mlp.up_proj.weight": mat(INTER, D),
        "midlayer.mlp.down_proj.weight": mat(D, INTER, 2.0),
        "norm.weight": norm(D),
        "lm_head.weight": mat(DRAFT_VOCAB, D),
    }
    # The draft vocabulary: DRAFT_VOCAB target ids, sorted, as SpecForge's vocabulary mapping
    # stores them (d2t[i] = target id of draft id i, minus i; t2d = membership mask).
    used = torch.sort(torch.randperm(VOCAB, generator=gen)[:DRAFT_VOCAB]).values
    w["d2t"] = (used - torch.arange(DRAFT_VOCAB)).to(torch.int64)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[used] = True
    w["t2d"] = t2d
    return w


def rms(x, w):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rope(x, positions):
    """Rotate-half RoPE (Llama) of x [n, heads, hd] at integer positions [n]."""
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM))
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Midlayer:
    """The EAGLE-3 decoder layer with a KV cache (rows appended in order; causal)."""

    def __init__(self, w):
        self.w = w
        self.k = torch.zeros(0, KV_HEADS, HEAD_DIM, dtype=torch.float64)
        self.v = torch.zeros(0, KV_HEADS, HEAD_DIM, dtype=torch.float64)

    def __call__(self, emb, hidden, positions):
        w, n = self.w, emb.shape[0]
        x = torch.cat([rms(emb, w["midlayer.input_layernorm.weight"]), rms(hidden, w["midlayer.hidden_norm.weight"])], -1)
        residual = hidden
        q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(n, HEADS, HEAD_DIM)
        k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(n, KV_HEADS, HEAD_DIM)
        v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(n, KV_HEADS, HEAD_DIM)
        q, k = rope(q, positions), rope(k, positions)
        past = self.k.shape[0]
        self.k, self.v = torch.cat([self.k, k]), torch.cat([self.v, v])
        group = HEADS // KV_HEADS
        kk = self.k.repeat_interleave(group, dim=1)  # [S, heads, hd]
        vv = self.v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, kk) / math.sqrt(HEAD_DIM)
        # Row i (cache index past + i) sees keys 0..past+i.
        visible = torch.arange(self.k.shape[0])[None, :] <= (past + torch.arange(n))[:, None]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv).reshape(n, HEADS * HEAD_DIM)
        h = residual + o @ w["midlayer.self_attn.o_proj.weight"].T
        g = rms(h, w["midlayer.post_attention_layernorm.weight"])
        act = torch.nn.functional.silu(g @ w["midlayer.mlp.gate_proj.weight"].T) * (g @ w["midlayer.mlp.up_proj.weight"].T)
        return h + act @ w["midlayer.mlp.down_proj.weight"].T


def draft_chain(w, fused, ids, a):
    """The K-step chain at anchor a: context rows 0..a-1, then STEPS-1 more steps."""
    layer = Midlayer(w)
    E = w["embed_tokens.weight"]
    # Context prefill: row j = (fused taps at j, token y_{j+1}) at position j.
    h = layer(E[ids[1 : a + 1]], fused[:a], torch.arange(a))[-1:]
    d2t = w["d2t"]
    out = {"draft_ids": [], "top8_ids": [], "top8_logprobs": [], "margin": [], "hidden": []}
    for s in range(1, STEPS + 1):
        if s > 1:
            h = layer(E[token][None], h, torch.tensor([a - 1 + (s - 1)]))
        logits = (rms(h, w["norm.weight"]) @ w["lm_head.weight"].T)[0]  # draft vocabulary
        lp = logits.log_softmax(-1)
        top = torch.topk(lp, 8)
        two = torch.topk(logits, 2).values
        target_ids = top.indices + d2t[top.indices]
        token = int(target_ids[0])
        out["draft_ids"].append(token)
        out["top8_ids"].append(target_ids)
        out["top8_logprobs"].append(top.values)
        out["margin"].append(float(two[0] - two[1]))
        out["hidden"].append(h[0])
    return {
        "draft_ids": torch.tensor(out["draft_ids"], dtype=torch.int64),
        "top8_ids": torch.stack(out["top8_ids"]).to(torch.int64),
        "top8_logprobs": torch.stack(out["top8_logprobs"]).float(),
        "margin": torch.tensor(out["margin"], dtype=torch.float32),
        "hidden": torch.stack(out["hidden"]).float(),
    }


def main():
    from safetensors.torch import load_file, save_file

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/golden/eagle3")
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(SEED)
    weights = random_weights(gen)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(), f, indent=2)
        f.write("\n")
    model_path = os.path.join(a.out, "model.safetensors")
    save_file({k: v.contiguous() for k, v in weights.items()}, model_path)
    # Compute from the stored values (bf16 upcast), never from the f32 draws.
    w = {k: (v.to(torch.float64) if v.is_floating_point() else v) for k, v in load_file(model_path).items()}
    g = load_file(os.path.join(TARGET, "golden.safetensors"))
    tensors, anchors_meta = {}, {}
    for p, anchors in ANCHORS.items():
        ids = torch.cat([g[f"p{p}.input_ids"], g[f"p{p}.greedy_ids"]])
        taps = torch.cat([g[f"p{p}.hs{t + 1}"].to(torch.float64) for t in TAPS], -1)  # [T, 3*Dt]
        fused = taps @ w["fc.weight"].T
        for anc in anchors:
            assert 1 <= anc <= len(ids) - 2, (p, anc)
            r = draft_chain(w, fused, ids, anc)
            for name, t in r.items():
                tensors[f"p{p}.a{anc}.{name}"] = t.contiguous()
            print(f"p{p} a{anc}: chain {r['draft_ids'].tolist()} min margin {float(r['margin'].min()):.4f}")
        anchors_meta[f"p{p}"] = {"anchors": anchors, "sequence_length": len(ids), "prompt_length": len(g[f"p{p}.input_ids"])}
    golden_path = os.path.join(a.out, "golden.safetensors")
    save_file(tensors, golden_path)
    margins = torch.cat([t for k, t in tensors.items() if k.endswith(".margin")])
    manifest = {
        "what": "EAGLE-3 draft chains (tools/golden/make_eagle3_golden.py): pure PyTorch float64 reference written against the SpecForge / vLLM LlamaForCausalLMEagle3 layout, CPU",
        "target": f"{TARGET} (random Qwen3, hidden {TARGET_HIDDEN}, 4 layers, vocabulary {VOCAB}); taps = its f16 p{{i}}.hs{{t+1}} for t in {TAPS}",
        "drafter": f"random weights (seed {SEED}): hidden {D}, {HEADS} heads / {KV_HEADS} KV heads of {HEAD_DIM}, MLP {INTER}, own embedding, draft vocabulary {DRAFT_VOCAB} of {VOCAB} (sorted random subset; d2t offsets, t2d mask), RoPE theta {ROPE_THETA}",
        "chain": "context row j = (fc(taps at j), embed(y_{j+1})) at position j, causal; step 1 = row a-1; step s >= 2 = (own pre-norm output of step s-1, embed(d_{s-1})) at position a-1+(s-1); draft id -> target id = id + d2t[id]",
        "steps": STEPS,
        "prompts": anchors_meta,
        "min_top1_margin": float(margins.min()),
        "model_safetensors_sha256": sha256(model_path),
        "golden_safetensors_sha256": sha256(golden_path),
        "target_golden_sha256": sha256(os.path.join(TARGET, "golden.safetensors")),
        "tolerance_note": "reference in float64 on bf16 weights and f16 taps (both exact in f32); an f32 implementation should match hidden to ~1e-5 relative, log-probs to ~1e-4 absolute, and every draft id (min top-1 margin above)",
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
    }
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(a.out, n)) for n in os.listdir(a.out))
    print(f"wrote {a.out}: {total} bytes")


if __name__ == "__main__":
    main()
