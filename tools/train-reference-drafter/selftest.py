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


def check_forward(layers):
    """Batched masked forward == one block at a time, for a drafter of `layers` layers."""
    torch.manual_seed(0)
    H, n_taps, B = 48, 3, 6
    c = {
        "hidden_size": H,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 16,  # != H / heads: the drafter must use the explicit head_dim
        "intermediate_size": 40,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1e4,
        "num_hidden_layers": layers,
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
    n_layer_keys = len({k.split(".")[1] for k in d.state_dict() if k.startswith("layers.")})
    print(f"{layers} layer(s): batched vs one-block max rel err {worst:.2e}; strict vs inclusive differ by {diff:.3f}; layers.{{i}} in the state dict: {n_layer_keys}")
    return worst < 1e-5 and diff > 1e-3 and n_layer_keys == layers


def check_loss():
    """BlockLoss (chunked, gradient computed in forward, several drafters at once) == autograd of
    the plain formula: CE against q = kd * softmax(teacher @ W.T) + (1 - kd) * onehot(y), weighted."""
    torch.manual_seed(1)
    R, D, V = 13, 8, 29
    W = torch.randn(V, D)
    y = torch.randint(0, V, (R,))
    w = torch.rand(R) * (torch.rand(R) > 0.2)
    w = w / w.sum()
    teacher = torch.randn(R, D)
    worst = 0.0
    for kd in (0.0, 0.5):
        hs = [torch.randn(R, D, requires_grad=True) for _ in range(2)]
        losses, hards, corrects = train.block_loss(hs, W, y, w, teacher if kd else None, kd, chunk=5)
        (losses[0] + 2 * losses[1]).backward()
        for j, h in enumerate(hs):
            h2 = h.detach().clone().requires_grad_(True)
            logp = torch.log_softmax(h2 @ W.T, -1)
            q = (1 - kd) * F.one_hot(y, V).double() + (kd * torch.softmax(teacher @ W.T, -1) if kd else 0)
            ref = (w * -(q * logp).sum(-1)).sum()
            ((1 + j) * ref).backward()
            hard_ref = (w * F.nll_loss(logp, y, reduction="none")).sum()
            worst = max(worst, abs(losses[j].item() - ref.item()), abs(hards[j].item() - hard_ref.item()), (h.grad - h2.grad).abs().max().item())
            assert torch.equal(corrects[j], (h2 @ W.T).argmax(-1) == y)
    print(f"BlockLoss vs autograd (kd 0 and 0.5, 2 drafters, chunks of 5): max abs err {worst:.2e} (float32 inside)")
    return worst < 1e-5  # BlockLoss works in float32 (as train.py on the GPU)


def fake_data(packed):
    """A small SeqData with random taps, packed (offsets) or padded, from the same numbers."""
    g = torch.Generator().manual_seed(2)
    U, H = 4, 48
    lens_p, lens_c = [5, 9, 3, 7, 6, 4], [12, 8, 15, 10, 9, 11]
    pids = [torch.randint(20, 90, (n,), generator=g).tolist() for n in lens_p]
    conts = [torch.randint(20, 90, (n,), generator=g).tolist() for n in lens_c]
    seq_taps = [torch.randn(p + c, U, H, generator=g) for p, c in zip(lens_p, lens_c)]
    seq_am = [torch.tensor(p[1:] + c + [0]) for p, c in zip(pids, conts)]  # "target argmax" = next token
    if packed:
        lens = torch.tensor([p + c for p, c in zip(lens_p, lens_c)])
        taps, am, offsets = torch.cat(seq_taps), torch.cat(seq_am), torch.cumsum(lens, 0) - lens
    else:
        Smax = max(p + c for p, c in zip(lens_p, lens_c))
        taps = torch.zeros(len(pids), Smax, U, H)
        am = torch.zeros(len(pids), Smax, dtype=torch.long)
        for i, (t, a) in enumerate(zip(seq_taps, seq_am)):
            taps[i, : len(t)], am[i, : len(a)] = t, a
        offsets = None
    return train.SeqData([str(i) for i in range(len(pids))], pids, conts, taps, am, [2, 3, 5, 7], "cpu", offsets=offsets)


def check_packed():
    """Packed taps (what build_data makes) read the same as padded ones (tools/bench/hf_e2e.py)."""
    a, b = fake_data(True), fake_data(False)
    idx = torch.tensor([3, 0, 5])
    S = int(a.T[idx].max())
    inside = (torch.arange(S)[None] < a.T[idx][:, None])[..., None]  # rows past a sequence's end are never visible
    same = torch.equal(a.gather_taps(idx, S, [3, 0]) * inside, b.gather_taps(idx, S, [3, 0]) * inside)
    pos = torch.tensor([[4, 6], [1, 2], [9, 3]])
    same &= torch.equal(a.tap_at(idx, pos, 2), b.tap_at(idx, pos, 2))
    # positions inside each sequence only (past its end both read its last row, masked by callers)
    same &= a.greedy_consistency() == b.greedy_consistency() == 1.0
    print(f"packed vs padded taps: {'equal' if same else 'DIFFER'}")
    return bool(same)


def check_joint():
    """Two series trained in one loop == each trained alone (same batches, anchors, init)."""
    import argparse

    saved = dict(train.SERIES)
    train.SERIES.clear()
    train.SERIES.update({"a": {"target_layer_ids": [1, 2], "inclusive": False}, "b": {"target_layer_ids": [1, 4], "inclusive": True}})
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)  # what autocast casts to bf16 (float64 it leaves alone)
    try:
        data = fake_data(True)
        H = 48
        E = torch.randn(100, H)
        cfg = argparse.Namespace(hidden_size=H, num_attention_heads=6, num_key_value_heads=2, num_hidden_layers=6, vocab_size=100, max_position_embeddings=64)
        args = argparse.Namespace(
            seed=0, block_size=4, layers=2, intermediate=40, rope_theta=1e4, lr=3e-3, weight_decay=0.01, kd_weight=0.5,
            anchors=3, batch_seqs=2, gamma=7.0, steps=4, warmup_ratio=0.25, lr_min_ratio=0.1, save_fracs=[], metric_window=5,
            log_every=10**9, loss_chunk=7, train_stop_epoch=None,
        )
        data.hs_indices = [2, 3, 5, 6]  # hs[6] = the KD teacher (num_hidden_layers)
        old_mask, train.MASK_TOKEN_ID = train.MASK_TOKEN_ID, 0
        weights = {}
        for series in (["a", "b"], ["a"], ["b"]):
            out = {}
            orig = train.save_checkpoint
            train.save_checkpoint = lambda d, c, p, m, out=out: out.__setitem__(c["dflash_config"]["target_layer_ids"][-1], d.state_dict())
            args.save_fracs = [1.0]
            train.train_series(series, data, E, E, args, "cpu", "/tmp/selftest-joint", cfg)
            train.save_checkpoint = orig
            weights[tuple(series)] = out
        train.MASK_TOKEN_ID = old_mask
        err = 0.0
        for s, tap in (("a", 2), ("b", 4)):
            joint, alone = weights[("a", "b")][tap], weights[(s,)][tap]
            err = max(err, max((joint[k] - alone[k]).abs().max().item() for k in joint))
        moved = (weights[("a",)][2]["fc.weight"] - weights[("b",)][4]["fc.weight"]).abs().max().item()
    finally:
        torch.set_default_dtype(dtype)
        train.SERIES.clear()
        train.SERIES.update(saved)
    print(f"two series in one loop vs each alone (4 steps, kd 0.5): max weight difference {err:.2e}; the two series differ by {moved:.3f}")
    return err < 1e-6 and moved > 1e-4


def check_resume():
    """Training stopped after step 3 with --state-out and continued with --resume == 6 steps in one
    go (the run split over two device calls takes the steps one process would have taken)."""
    import argparse

    saved = dict(train.SERIES)
    train.SERIES.clear()
    train.SERIES.update({"a": {"target_layer_ids": [1, 2], "inclusive": False}, "b": {"target_layer_ids": [1, 4], "inclusive": True}})
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    old_mask, train.MASK_TOKEN_ID = train.MASK_TOKEN_ID, 0
    orig = train.save_checkpoint
    try:
        data = fake_data(True)
        data.hs_indices = [2, 3, 5, 6]
        H = 48
        E = torch.randn(100, H)
        cfg = argparse.Namespace(hidden_size=H, num_attention_heads=6, num_key_value_heads=2, num_hidden_layers=6, vocab_size=100, max_position_embeddings=64)

        def run(**extra):
            out = {}
            train.save_checkpoint = lambda d, c, p, m, out=out: out.__setitem__((c["dflash_config"]["target_layer_ids"][-1], m["step"]), d.state_dict())
            args = argparse.Namespace(
                seed=0, block_size=4, layers=2, intermediate=40, rope_theta=1e4, lr=3e-3, weight_decay=0.01, kd_weight=0.5,
                anchors=3, batch_seqs=2, gamma=7.0, steps=6, warmup_ratio=0.25, lr_min_ratio=0.1, save_fracs=[0.34, 1.0], metric_window=5,
                log_every=10**9, loss_chunk=7, train_stop_epoch=None, **extra,
            )
            _, info = train.train_series(["a", "b"], data, E, E, args, "cpu", "/tmp/selftest-resume", cfg)
            return out, info

        state = "/tmp/selftest-resume.state"
        straight, _ = run()
        first, info = run(state_out=state, stop_after_step=3)
        second, _ = run(resume=state)
        err = max(
            (straight[key][k] - second[key][k]).abs().max().item() for key in [(2, 6), (4, 6)] for k in straight[key]
        )
        # step 2 (0.34 of 6) was saved before the stop; the resumed call reports it among its checkpoints
        ok = info.get("resumable") and set(first) == {(2, 2), (4, 2)} and set(second) == {(2, 6), (4, 6)} and err < 1e-6
    finally:
        train.save_checkpoint = orig
        train.MASK_TOKEN_ID = old_mask
        torch.set_default_dtype(dtype)
        train.SERIES.clear()
        train.SERIES.update(saved)
    print(f"6 steps straight vs stopped after 3 + resumed: max weight difference {err:.2e}")
    return bool(ok)


def main():
    torch.set_default_dtype(torch.float64)
    B = 6
    ok = all([check_forward(1), check_forward(2), check_forward(3), check_loss(), check_packed(), check_joint(), check_resume()])
    # replay arithmetic on a hand-made case: streaks 2,0,... -> rounds at anchors 0, 3, 4
    m = torch.zeros(6, B - 1, dtype=torch.bool)
    m[0, :2] = True
    m[4, :1] = True
    inb = torch.ones_like(m)
    tokens, rounds, per = train.replay(m, inb)
    ok &= (tokens, rounds, per) == (6, 3, [3, 1, 2])
    print(f"replay {tokens, rounds, per}")
    print("selftest: " + ("ok" if ok else "FAILED"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
