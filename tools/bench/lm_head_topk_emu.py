#!/usr/bin/env python3
# Lane-level emulation of the fused LM-head top-K (kernels/lm_head_topk.cu, lm_head_topk_partial_k*)
# and of topk_merge (kernels/topk.cu), run on the build machine before any device call
# (docs/cuda.md, "The LM head's top-K"): byte-addressed shared memory written by the kernel's own
# cp.async address formula (lh_swz), ldmatrix addresses computed exactly as lh_mma_stage does,
# mma.sync m16n8k16 fragment layouts per the PTX ISA, the (tile, chunk) pipeline's stage indices,
# the epilogue's fragment → (row, id) map, the vocabulary-end mask, the log-sum-exp folds per
# (row, wn) by the owning lane, the round buffer [64][132] and the row owners' sorted lists, the
# 1-D raster, the partials and the merge. Compared with a float64 reference: on integer data
# (exact logits, many exact ties) ids must be equal and log-probs within 1e-5; on bf16 floats
# with planted duplicate rows of W (exact ties across tiles and slices) the same.
# What it cannot check: the hardware itself (the fragment layouts are the PTX ISA's as this file
# states them, the same statement tools/bench/attn2_emu.py makes for flash_attention2), timing,
# races between threads (the kernel's barriers are placed as the comments in the .cu say).
# Usage: python3 tools/bench/lm_head_topk_emu.py [quick]   (numpy; ~1 min, quick ~10 s)
import sys

import numpy as np

BM, BN, BK, STAGES, THREADS = 128, 256, 32, 4, 256
ROW_BYTES = BK * 2
STAGE_BYTES = (BM + BN) * ROW_BYTES
ROUND_IDS, BUF_LD, WN, GROUP = 64, 132, 4, 16
NONE = 0xFFFFFFFF
F32 = np.float32


def bf16(a):
    """Round float32 values to bf16 (nearest even), returned as float32."""
    u = np.asarray(a, dtype=F32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(F32)


def better(a, ia, b, ib):
    return a > b or (a == b and ia < ib)


def lh_swz(r, c):
    return r * ROW_BYTES + ((c ^ ((r >> 1) & 3)) << 4)


def load_stage(sm, st, x, w, R, N, H, row0, n0, kc):
    """lh_load_stage: sm is the shared memory as float32 per bf16 element (byte address / 2)."""
    k0 = kc * BK
    for i in range((BM + BN) * 4 // THREADS):
        for tid in range(THREADS):
            p = tid + i * THREADS
            c = p & 3
            kin = k0 + c * 8 < H
            if i < BM * 4 // THREADS:
                r = p >> 2
                ok = kin and row0 + r < R
                dst = st + lh_swz(r, c)
                src = x[row0 + r, k0 + c * 8:k0 + c * 8 + 8] if ok else np.zeros(8, F32)
            else:
                r = (p >> 2) - BM
                ok = kin and n0 + r < N
                dst = st + BM * ROW_BYTES + lh_swz(r, c)
                src = w[n0 + r, k0 + c * 8:k0 + c * 8 + 8] if ok else np.zeros(8, F32)
            assert dst % 16 == 0
            sm[dst // 2:dst // 2 + 8] = src


def ldsm_x4(sm, addrs):
    """ldmatrix.x4: lanes 8i..8i+7 give the rows of matrix i; lane l gets row l//4, elements
    2(l%4), +1 of each matrix (4 registers of 2 values). Each matrix's 8 rows must fall in 8
    distinct 16-byte bank groups (no bank conflicts)."""
    regs = np.zeros((4, 32, 2), F32)
    for i in range(4):
        assert len({(int(a) // 16) % 8 for a in addrs[8 * i:8 * i + 8]}) == 8, "ldmatrix bank conflict"
        rows = []
        for r in range(8):
            a = addrs[8 * i + r]
            assert a % 16 == 0
            rows.append(sm[a // 2:a // 2 + 8])
        M = np.array(rows)
        for l in range(32):
            regs[i, l] = M[l // 4, 2 * (l % 4):2 * (l % 4) + 2]
    return regs


LANES = np.arange(32)
G, T = LANES >> 2, LANES & 3


def mma(d, a, b0, b1):
    """d[32, 4] += A(16×16) · B(16×8) from the fragments (PTX ISA m16n8k16 .row.col layouts)."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for l in range(32):
        g, t = l >> 2, l & 3
        A[g, 2 * t:2 * t + 2] = a[0][l]
        A[g + 8, 2 * t:2 * t + 2] = a[1][l]
        A[g, 2 * t + 8:2 * t + 10] = a[2][l]
        A[g + 8, 2 * t + 8:2 * t + 10] = a[3][l]
        B[2 * t:2 * t + 2, g] = b0[l]
        B[2 * t + 8:2 * t + 10, g] = b1[l]
    D = A @ B
    d[:, 0] += D[G, 2 * T]
    d[:, 1] += D[G, 2 * T + 1]
    d[:, 2] += D[G + 8, 2 * T]
    d[:, 3] += D[G + 8, 2 * T + 1]


def mma_stage(acc, sm, st, wm, wn):
    """lh_mma_stage for one warp: acc[4][8] of [32 lanes, 4]."""
    a_off = (wm * 64 + (LANES & 15)) * ROW_BYTES
    b_off = BM * ROW_BYTES + (wn * 64 + (LANES & 7) + (LANES >> 4) * 8) * ROW_BYTES
    sw = (LANES >> 1) & 3
    for kk in range(BK // 16):
        ya = ((kk * 2 + (LANES >> 4)) ^ sw) << 4
        yb = ((kk * 2 + ((LANES >> 3) & 1)) ^ sw) << 4
        # The kernel's addresses equal the swizzle of the rows and chunks they mean.
        for mt in range(4):
            rows = wm * 64 + mt * 16 + (LANES & 15)
            assert all(st + a_off + mt * 16 * ROW_BYTES + ya == st + np.array([lh_swz(r, c) for r, c in zip(rows, kk * 2 + (LANES >> 4))]))
        a = [ldsm_x4(sm, st + a_off + mt * 16 * ROW_BYTES + ya) for mt in range(4)]
        for np_ in range(4):
            rows = wn * 64 + np_ * 16 + (LANES & 7) + (LANES >> 4) * 8
            chunks = kk * 2 + ((LANES >> 3) & 1)
            want = st + BM * ROW_BYTES + np.array([lh_swz(r, c) for r, c in zip(rows, chunks)])
            assert all(st + b_off + np_ * 16 * ROW_BYTES + yb == want)
            b = ldsm_x4(sm, st + b_off + np_ * 16 * ROW_BYTES + yb)
            for mt in range(4):
                mma(acc[mt][2 * np_], a[mt], b[0], b[1])
                mma(acc[mt][2 * np_ + 1], a[mt], b[2], b[3])


def xor_shfl(v, o):
    return v[LANES ^ o]


def insert(lv, li, row, k, own, v, i):
    j = min(own["cnt"], k - 1)
    while j > 0:
        pv, pi = lv[j - 1][row], li[j - 1][row]
        if not better(v, i, pv, pi):
            break
        lv[j][row], li[j][row] = pv, pi
        j -= 1
    lv[j][row], li[j][row] = v, i
    own["cnt"] = min(own["cnt"] + 1, k)
    if own["cnt"] == k:
        own["tv"], own["ti"] = lv[k - 1][row], li[k - 1][row]


def scan_round(buf, lv, li, row, k, own, n0, r, n_end):
    for c0 in range(0, ROUND_IDS, 8):
        v = [buf[(c0 + e) * BUF_LD + row] for e in range(8)]
        if max(v) < own["tv"]:
            continue
        id0 = n0 + (c0 >> 4) * 64 + 16 * r + (c0 & 15)
        for e in range(8):
            i = id0 + e
            if i < n_end and better(v[e], i, own["tv"], own["ti"]):
                insert(lv, li, row, k, own, v[e], i)


def block(bx, x, w, R, N, H, k, tps, slices, pms, pv, pi, seen):
    row_blocks = (R + BM - 1) // BM
    per_group = GROUP * slices
    grp, within = bx // per_group, bx % per_group
    rows_in_group = min(GROUP, row_blocks - grp * GROUP)
    row0 = (grp * GROUP + within % rows_in_group) * BM
    sl = within // rows_in_group
    assert (row0, sl) not in seen
    seen.add((row0, sl))
    n_begin = sl * tps * BN
    n_end = min(N, n_begin + tps * BN)
    ntiles = (n_end - n_begin + BN - 1) // BN
    kchunks = (H + BK - 1) // BK
    steps = ntiles * kchunks
    sm = np.zeros(STAGES * STAGE_BYTES // 2, F32)
    buf = np.full(ROUND_IDS * BUF_LD, np.nan, F32)
    lse = [[(-np.inf, F32(0))] * BM for _ in range(WN)]
    lv = [[-np.inf] * BM for _ in range(k)]
    li = [[NONE] * BM for _ in range(k)]
    owners = [{"cnt": 0, "tv": -np.inf, "ti": NONE} for _ in range(BM)]
    acc = [[[np.zeros((32, 4)) for _ in range(8)] for _ in range(4)] for _ in range(8)]
    staged = {}  # stage -> step it holds
    for s in range(STAGES - 1):
        if s < steps:
            load_stage(sm, s * STAGE_BYTES, x, w, R, N, H, row0, n_begin + (s // kchunks) * BN, s % kchunks)
            staged[s] = s
    kc = tile = 0
    for i in range(steps):
        nx = i + STAGES - 1
        if nx < steps:
            assert staged.get(nx % STAGES, -1) == i - 1 or i == 0 and nx % STAGES not in staged
            load_stage(sm, (nx % STAGES) * STAGE_BYTES, x, w, R, N, H, row0, n_begin + (nx // kchunks) * BN, nx % kchunks)
            staged[nx % STAGES] = nx
        assert staged[i % STAGES] == i
        for warp in range(8):
            mma_stage(acc[warp], sm, (i % STAGES) * STAGE_BYTES, warp & 1, warp >> 1)
        kc += 1
        if kc < kchunks:
            continue
        n0 = n_begin + tile * BN
        for warp in range(8):
            wm, wn = warp & 1, warp >> 1
            a = acc[warp]
            for mt in range(4):
                for nt in range(8):
                    a[mt][nt] = a[mt][nt].astype(F32)  # fp32 logits
            if n0 + BN > n_end:
                for nt in range(8):
                    for e in range(4):
                        cols = n0 + wn * 64 + nt * 8 + 2 * T + (e & 1)
                        for mt in range(4):
                            a[mt][nt][cols >= n_end, e] = -np.inf
            for mt in range(4):
                for h in range(2):
                    m = np.full(32, -np.inf, F32)
                    for nt in range(8):
                        m = np.maximum(m, np.maximum(a[mt][nt][:, 2 * h], a[mt][nt][:, 2 * h + 1]))
                    m = np.maximum(m, xor_shfl(m, 1))
                    m = np.maximum(m, xor_shfl(m, 2))
                    s = np.zeros(32, F32)
                    with np.errstate(invalid="ignore"):
                        for nt in range(8):
                            s = np.where(m != -np.inf, s + (np.exp(a[mt][nt][:, 2 * h] - m) + np.exp(a[mt][nt][:, 2 * h + 1] - m)), s).astype(F32)
                    s = (s + xor_shfl(s, 1)).astype(F32)
                    s = (s + xor_shfl(s, 2)).astype(F32)
                    for l in range(32):
                        if T[l] == ((2 * mt + h) & 3) and m[l] != -np.inf:
                            row = wm * 64 + mt * 16 + G[l] + 8 * h
                            ox, oy = lse[wn][row]
                            mm = max(ox, m[l])
                            ss = F32((F32(0) if ox == -np.inf else F32(oy * np.exp(F32(ox - mm)))) + F32(s[l] * np.exp(F32(m[l] - mm))))
                            lse[wn][row] = (F32(mm), ss)
        for r in range(4):
            buf[:] = np.nan
            # One store instruction of a warp (fixed mt, h, j and column parity): 32 distinct banks.
            for wm in range(2):
                for wn in range(WN):
                    rows = wm * 64 + G
                    c = wn * 16 + 2 * T
                    assert len(set(((c * BUF_LD + rows) % 32).tolist())) == 32, "buffer bank conflict"
            for warp in range(8):
                wm, wn = warp & 1, warp >> 1
                for mt in range(4):
                    for h in range(2):
                        for j in range(2):
                            row = wm * 64 + mt * 16 + G + 8 * h
                            c = wn * 16 + j * 8 + 2 * T
                            buf[c * BUF_LD + row] = acc[warp][mt][2 * r + j][:, 2 * h]
                            buf[(c + 1) * BUF_LD + row] = acc[warp][mt][2 * r + j][:, 2 * h + 1]
            assert not np.isnan(buf.reshape(ROUND_IDS, BUF_LD)[:, :BM]).any()
            for tid in range(BM):
                if row0 + tid < R:
                    scan_round(buf, lv, li, tid, k, owners[tid], n0, r, n_end)
        acc = [[[np.zeros((32, 4)) for _ in range(8)] for _ in range(4)] for _ in range(8)]
        kc = 0
        tile += 1
    for tid in range(BM):
        if row0 + tid < R:
            at = (row0 + tid) * slices + sl
            mm = max(lse[q][tid][0] for q in range(WN))
            ss = F32(0)
            for q in range(WN):
                px, py = lse[q][tid]
                if px != -np.inf:
                    ss = F32(ss + F32(py * np.exp(F32(px - mm))))
            pms[at] = (mm, ss)
            for j in range(k):
                pv[at * k + j] = lv[j][tid]
                pi[at * k + j] = li[j][tid]


def merge(pms, pv, pi, S, k, R):
    """topk_merge (kernels/topk.cu): log-sum-exp over the slices in slice order, k rounds over
    the slices' heads."""
    ids = np.zeros((R, k), np.int64)
    lps = np.zeros((R, k))
    for row in range(R):
        mm = max(pms[row * S + s][0] for s in range(S))
        ss = F32(0)
        for s in range(S):
            px, py = pms[row * S + s]
            if px != -np.inf:
                ss = F32(ss + F32(py * np.exp(F32(px - mm))))
        lse = F32(mm + np.log(ss))
        head = [0] * S
        for r in range(k):
            bv, bi, bs = -np.inf, NONE, -1
            for s in range(S):
                if head[s] < k:
                    at = (row * S + s) * k + head[s]
                    if pi[at] != NONE and better(pv[at], pi[at], bv, bi):
                        bv, bi, bs = pv[at], pi[at], s
            if bs >= 0:
                head[bs] += 1
            ids[row, r] = bi
            lps[row, r] = F32(bv - lse)
    return ids, lps


def fused(x, w, k, tps):
    R, H = x.shape
    N = w.shape[0]
    k = min(k, N)
    tiles = (N + BN - 1) // BN
    slices = (tiles + tps - 1) // tps
    pms = [None] * (R * slices)
    pv = [None] * (R * slices * k)
    pi = [None] * (R * slices * k)
    seen = set()
    blocks = ((R + BM - 1) // BM) * slices
    for bx in range(blocks):
        block(bx, x, w, R, N, H, k, tps, slices, pms, pv, pi, seen)
    assert len(seen) == blocks
    return merge(pms, pv, pi, slices, k, R)


def reference(x, w, k):
    logits = x.astype(np.float64) @ w.astype(np.float64).T
    k = min(k, w.shape[0])
    mx = logits.max(axis=1, keepdims=True)
    lse = (mx + np.log(np.exp(logits - mx).sum(axis=1, keepdims=True)))[:, 0]
    ids = np.zeros((x.shape[0], k), np.int64)
    lps = np.zeros((x.shape[0], k))
    for r in range(x.shape[0]):
        order = sorted(range(w.shape[0]), key=lambda i: (-logits[r, i], i))[:k]
        ids[r] = order
        lps[r] = logits[r, order] - lse[r]
    return ids, lps


def check(name, x, w, k, tps):
    ids, lps = fused(x, w, k, tps)
    rids, rlps = reference(x, w, k)
    assert (ids == rids).all(), f"{name}: ids differ at {np.argwhere(ids != rids)[:5].tolist()}"
    worst = float((np.abs(lps - rlps) / (1 + np.abs(rlps))).max())
    assert worst < 1e-5, f"{name}: log-probs differ by {worst}"
    print(f"{name}: ids equal, log-probs within {worst:.1e}")


def raster_is_a_bijection():
    for R in [65, 128, 129, 2047, 2048, 2049, 4097, 16384]:
        rb = (R + BM - 1) // BM
        for slices in [1, 2, 3, 17, 38, 256]:
            seen = set()
            per_group = GROUP * slices
            for bx in range(rb * slices):
                grp, within = bx // per_group, bx % per_group
                rig = min(GROUP, rb - grp * GROUP)
                pair = (grp * GROUP + within % rig, within // rig)
                assert 0 <= pair[0] < rb and 0 <= pair[1] < slices and pair not in seen
                seen.add(pair)
    print("raster: every (row block, slice) exactly once")


def main():
    quick = len(sys.argv) > 1 and sys.argv[1] == "quick"
    raster_is_a_bijection()
    rng = np.random.default_rng(7)
    # Integer data: exact logits in any order, many exact ties (ties to the lower id).
    R, N, H = (130, 600, 40) if quick else (130, 1003, 72)
    xi = rng.integers(-1, 2, (R, H)).astype(F32)
    wi = rng.integers(-2, 3, (N, H)).astype(F32)
    for k, tps in ([(8, 1), (64, 2)] if quick else [(1, 1), (5, 2), (8, 16), (20, 1), (64, 2)]):
        check(f"integers R={R} N={N} H={H} k={k} tiles/slice={tps}", xi, wi, k, tps)
    # bf16 floats with duplicated W rows across tiles and slices (exact ties).
    R, N, H = 67, 700, 48
    xf = bf16(rng.standard_normal((R, H)).astype(F32))
    wf = bf16((rng.standard_normal((N, H)) * 0.5).astype(F32))
    for dst, src in [(255, 3), (256, 3), (511, 40), (512, 40), (699, 3), (300, 299)]:
        wf[dst] = wf[src]
    wf[10] = wf[3] * 4  # a row most inputs rank first, duplicated below
    wf[600] = wf[10]
    check(f"bf16 + planted ties R={R} N={N} H={H} k=8", xf, wf, 8, 1)
    # A vocabulary smaller than k (the host clamps k to it) and than one tile.
    check("vocabulary 5, k 8", xi[:70, :40], wi[:5, :40], 8, 16)


if __name__ == "__main__":
    main()
