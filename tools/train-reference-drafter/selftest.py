#!/usr/bin/env python3
"""CPU self-test of train.py's drafter: the batched, masked forward used for training and
evaluation must equal a plain one-block-at-a-time implementation written independently here
(context sliced to rows < a, K/V = [context ; block], full softmax, no mask at all).

    python3 tools/train-reference-drafter/selftest.py      # prints max errors, exits 1 on failure
"""

import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_ref(x, pos, theta):
    """Rotate-half RoPE written out per position, independent of train.rope_table."""
    hd = x.shape[-1]
    out = torch.empty_like(x)
    for t, p in enumerate(pos.tolist()):
        for i in range(hd // 2):
            ang = p / (theta ** (2 * i / hd))
            c, s = math.cos(ang), math.sin(ang)
            a, b = x[t, ..., i], x[t, ..., i + hd // 2]
            out[t, ..., i] = a * c - b * s
            out[t, ..., i + hd // 2] = b * c + a * s
    return out


def one_block(d, c, taps, x, a, inclusive):
    """taps [S, n*H] of one sequence, x [B, H] embedded block at anchor a -> normed hidden [B, H]."""
    eps, theta = c["rms_norm_eps"], c["rope_theta"]
    hq, hk, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    B = x.shape[0]
    end = a + 1 if inclusive else a
    ctx = rms(taps[:end] @ d.fc.weight.T, d.hidden_norm.weight, eps)
    cpos = torch.arange(end)
    bpos = torch.arange(a, a + B)
    for L in d.layers:
        at = L.self_attn
        h = rms(x, L.input_layernorm.weight, eps)
        q = rope_ref(rms((h @ at.q_proj.weight.T).view(B, hq, hd), at.q_norm.weight, eps), bpos, theta)
        kb = rope_ref(rms((h @ at.k_proj.weight.T).view(B, hk, hd), at.k_norm.weight, eps), bpos, theta)
        kc = rope_ref(rms((ctx @ at.k_proj.weight.T).view(end, hk, hd), at.k_norm.weight, eps), cpos, theta)
        v = torch.cat([(ctx @ at.v_proj.weight.T).view(end, hk, hd), (h @ at.v_proj.weight.T).view(B, hk, hd)])
        k = torch.cat([kc, kb])
        rep = hq // hk
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd), dim=-1)
        o = torch.einsum("hqk,khd->qhd", att, v).reshape(B, hq * hd)
        x = x + o @ at.o_proj.weight.T
        h = rms(x, L.post_attention_layernorm.weight, eps)
        m = L.mlp
        x = x + (F.silu(h @ m.gate_proj.weight.T) * (h @ m.up_proj.weight.T)) @ m.down_proj.weight.T
    return rms(x, d.norm.weight, eps)


def main():
    torch.manual_seed(0)
    torch.set_default_dtype(torch.float64)
    H, n_taps, B = 48, 3, 6
    c = {
        "hidden_size": H,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 16,  # != H / heads: the drafter must use the explicit head_dim
        "intermediate_size": 40,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1e4,
        "num_hidden_layers": 2,
        "block_size": B,
        "dflash_config": {"target_layer_ids": list(range(n_taps)), "mask_token_id": 0},
    }
    d = train.Drafter(c)
    with torch.no_grad():
        for p in d.parameters():  # non-trivial norms too
            p.add_(torch.randn_like(p) * 0.3)
    S, b, n = 23, 2, 4
    taps = torch.randn(b, S, n_taps * H)
    anchors = torch.tensor([[3, 7, 15, 21], [1, 4, 9, 17]])
    emb = torch.randn(b, n, B, H)
    worst = 0.0
    for inclusive in (False, True):
        got = d(taps, emb, anchors, inclusive)
        for i in range(b):
            for j in range(n):
                ref = one_block(d, c, taps[i], emb[i, j], int(anchors[i, j]), inclusive)
                err = ((got[i, j] - ref).norm() / ref.norm()).item()
                worst = max(worst, err)
    # (train.py computes norms and RoPE tables in float32, hence ~1e-7 rather than 1e-15)
    # the masks must matter: the inclusive forward differs from the strict one
    diff = (d(taps, emb, anchors, True) - d(taps, emb, anchors, False)).abs().max().item()
    # replay arithmetic on a hand-made case: streaks 2,0,... -> rounds at anchors 0, 3, 4
    m = torch.zeros(6, B - 1, dtype=torch.bool)
    m[0, :2] = True
    m[4, :1] = True
    inb = torch.ones_like(m)
    tokens, rounds, per = train.replay(m, inb)
    ok = worst < 1e-5 and diff > 1e-3 and (tokens, rounds, per) == (6, 3, [3, 1, 2])
    print(f"batched vs one-block max rel err {worst:.2e}; strict vs inclusive differ by {diff:.3f}; replay {tokens, rounds, per}")
    print("selftest: " + ("ok" if ok else "FAILED"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
