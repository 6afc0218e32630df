#!/usr/bin/env python3
"""Golden EAGLE-3 dynamic draft trees, for draftlens' `run --eagle3-tree`
(crates/engine/src/drafter/eagle3/tree.rs, docs/eagle3.md §3.1).

CPU only, pure PyTorch, float64. The drafter is the committed EAGLE-3 golden checkpoint
(tests/fixtures/golden/eagle3, written by make_eagle3_golden.py, read here, not regenerated) on the
random Qwen3 golden target's taps; the midlayer maths (norms, RoPE, the 2·D q/k/v input, the
residual, the MLP) are that script's, imported from it.

The tree follows SGLang's EAGLE worker tensor for tensor (its sglang/srt/speculative/
eagle_worker.py `draft_forward`, eagle_utils.py `select_top_k_tokens` and
`organize_draft_results`), for one request:

  * step 1 (the draft extend): the midlayer over context rows 0..a-1 (row j = fc(taps at j) and
    the embedding of y_{j+1}, position j, causal); probs = softmax(lm_head(norm(h_{a-1}))) over the
    draft vocabulary, topk_p, topk_index = topk(probs, TOPK), ids mapped to the target by d2t;
  * i = 0: scores = topk_p; score_list gets topk_p (TOPK candidates), token_list their ids; the
    TOPK nodes are the inputs of the first tree forward, each fed h_{a-1};
  * i = 1..K-1: one forward of the TOPK input nodes (token, hidden = the parent's output,
    position a-1+i), with a tree attention mask: each row sees context rows 0..a-1, the rows of its
    own ancestors' forwards and itself (SGLang's tree mask; EAGLE's `tree_mask`); then
    expand_scores = scores[:, None] * topk_p (TOPK x TOPK), flattened parent-major, all of them
    appended to score_list; the TOPK best are the next inputs (input ids gathered, hidden states
    of their parents: `topk_cs_index // topk`);
  * the loop stops before the K-th forward ("we get 1 token from draft prefill and (#spec steps -
    1) tokens here"): K depths, TOPK + (K-1)·TOPK² candidates;
  * organize_draft_results: the TOTAL - 1 best of score_list (the root is the verified token),
    sorted by index.

Probabilities are multiplied here, as SGLang does; draftlens sums log-probabilities (EAGLE's
`topK_genrate`); the order is the same up to rounding. Each anchor's smallest log-gap at a cut (a
node's top-k, the k kept per depth, the final TOTAL - 1) and between two ordered nodes (whose order
numbers the next depth's candidates) is stored, so that the test leaves out the few near ties
where f32 rounding may legitimately choose otherwise.

Accepted length (greedy verification, SGLang's `verify_tree_greedy`): from the root, follow the
selected child whose token is the target's next token, as long as one exists.

Written to tests/fixtures/golden/eagle3_tree/:

  tree.safetensors   per tree shape c = k{TOPK}t{TOTAL} and prompt p, over the completion anchors
                     prompt_len..T-2 (rows in anchor order):
    c.p{p}.selected         I64 [n, TOTAL-1]   selected candidate indices, ascending (SGLang's
                                               score_list numbering)
    c.p{p}.tokens           I64 [n, TOTAL-1]   their target token ids
    c.p{p}.parents          I64 [n, TOTAL-1]   their parent candidate indices (-1: the root)
    c.p{p}.log_scores       F32 [n, TOTAL-1]   log of their cumulative probabilities
    c.p{p}.min_cut_gap      F32 [n]            smallest log-gap at a cut of the anchor's tree
    c.p{p}.min_order_gap    F32 [n]            smallest log-gap between two ordered nodes
    c.p{p}.accepted         I64 [n]            accepted length on the target's greedy continuation
    c.p{p}.planted_labels   I64 [T]            a continuation planted along the tree's chain
    c.p{p}.accepted_planted I64 [n]            accepted length on it
  manifest.json      shapes, anchors, per-prompt replayed tree τ, gaps, sha256s

    /root/.pyenv/versions/3.12.1/bin/python3.12 tools/golden/make_eagle3_tree_golden.py
"""

import hashlib
import importlib.util
import json
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("eagle3_golden", os.path.join(HERE, "make_eagle3_golden.py"))
E3 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(E3)

CHECKPOINT = "tests/fixtures/golden/eagle3"
OUT = "tests/fixtures/golden/eagle3_tree"
# (TOPK, TOTAL): the chain (SGLang sets TOTAL = K + 1 for TOPK 1), SGLang's automatic choice for
# most targets (topk 4, 8 draft tokens), and a wider tree.
SHAPES = [(1, E3.STEPS + 1), (4, 8), (3, 16)]
# A log-gap below this at an anchor's cut or order is a near tie (module doc): 100x the f32
# log-prob error the chain golden measures (2e-6).
NEAR_TIE = 1e-4


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


class TreeLayer:
    """The EAGLE-3 midlayer with a KV cache whose rows are visible as a boolean mask says."""

    def __init__(self, w):
        self.w = w
        self.k = torch.zeros(0, E3.KV_HEADS, E3.HEAD_DIM, dtype=torch.float64)
        self.v = torch.zeros(0, E3.KV_HEADS, E3.HEAD_DIM, dtype=torch.float64)

    def __call__(self, emb, hidden, positions, visible):
        """New rows (emb, hidden at positions); visible(n_new, n_cache_after) says which cache rows
        each new row attends to. Returns the pre-norm outputs and the new rows' cache indices."""
        w, n = self.w, emb.shape[0]
        x = torch.cat([E3.rms(emb, w["midlayer.input_layernorm.weight"]), E3.rms(hidden, w["midlayer.hidden_norm.weight"])], -1)
        q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(n, E3.HEADS, E3.HEAD_DIM)
        k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(n, E3.KV_HEADS, E3.HEAD_DIM)
        v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(n, E3.KV_HEADS, E3.HEAD_DIM)
        q, k = E3.rope(q, positions), E3.rope(k, positions)
        first = self.k.shape[0]
        self.k, self.v = torch.cat([self.k, k]), torch.cat([self.v, v])
        group = E3.HEADS // E3.KV_HEADS
        kk, vv = self.k.repeat_interleave(group, dim=1), self.v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, kk) / math.sqrt(E3.HEAD_DIM)
        mask = visible(n, self.k.shape[0])
        scores = scores.masked_fill(~mask[None], float("-inf"))
        o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv).reshape(n, E3.HEADS * E3.HEAD_DIM)
        h = hidden + o @ w["midlayer.self_attn.o_proj.weight"].T
        g = E3.rms(h, w["midlayer.post_attention_layernorm.weight"])
        act = torch.nn.functional.silu(g @ w["midlayer.mlp.gate_proj.weight"].T) * (g @ w["midlayer.mlp.up_proj.weight"].T)
        return h + act @ w["midlayer.mlp.down_proj.weight"].T, list(range(first, first + n))


def draft_probs(w, h):
    """softmax over the draft vocabulary and the top-k, ids mapped to the target's."""
    return (E3.rms(h, w["norm.weight"]) @ w["lm_head.weight"].T).softmax(-1)


def tree_at(w, fused, ids, a, topk, total):
    """SGLang's draft tree at anchor a (one request). Returns (selected, tokens, parents,
    log_scores) over the selected candidates, and the smallest log-gap at any cut."""
    layer, E, d2t = TreeLayer(w), w["embed_tokens.weight"], w["d2t"]
    # The draft extend: context rows 0..a-1, causal.
    causal = lambda n, s: torch.arange(s)[None, :] <= torch.arange(n)[:, None]
    h, _ = layer(E[ids[1 : a + 1]], fused[:a], torch.arange(a), causal)
    probs = draft_probs(w, h[-1:])
    topk_p, topk_index = torch.topk(probs, topk, dim=-1)  # [1, k]
    to_target = lambda i: i + d2t[i]
    gaps = []

    def gap(values, n, order=True):
        # The log-gaps a float error would have to cross to change the result: at the cut after
        # the n-th best, and (order=True) between any two of the n best, whose order numbers the
        # next depth's candidates.
        s = torch.log(torch.sort(values.flatten(), descending=True).values)
        if n < s.numel():
            gaps.append(("cut", float(s[n - 1] - s[n])))
        if order:
            gaps.extend(("order", float(s[i] - s[i + 1])) for i in range(min(n, s.numel()) - 1))

    gap(probs, topk)
    # i = 0
    scores = topk_p[0]  # [k]
    score_list, token_list, parent_list = [scores], [to_target(topk_index[0])], [torch.full((topk,), -1)]
    kept_cand = torch.arange(topk)  # candidate index of each input node
    input_ids = to_target(topk_index[0])
    hidden = h[-1:].repeat(topk, 1)
    ancestors = [[] for _ in range(topk)]  # cache rows of each input node's ancestors' forwards
    n_cand = topk
    for i in range(E3.STEPS):
        if i == E3.STEPS - 1:
            break
        # One forward of the k input nodes at position a - 1 + (i + 1).
        rows_before = layer.k.shape[0]

        def tree_mask(n, s):
            m = torch.zeros(n, s, dtype=torch.bool)
            m[:, :a] = True  # context rows 0..a-1
            for r in range(n):
                for c in ancestors[r]:
                    m[r, c] = True
                m[r, rows_before + r] = True
            return m

        out, own_rows = layer(E[input_ids], hidden, torch.full((topk,), a + i), tree_mask)
        probs = draft_probs(w, out)
        topk_p, topk_index = torch.topk(probs, topk, dim=-1)  # [k, k]
        for row in probs:
            gap(row, topk)
        # select_top_k_tokens, i >= 1
        expand_scores = scores[:, None] * topk_p  # [k, k]
        gap(expand_scores, topk)
        topk_cs_p, topk_cs_index = torch.topk(expand_scores.flatten(), topk)
        cand_ids = to_target(topk_index.flatten())
        score_list.append(expand_scores.flatten())
        token_list.append(cand_ids)
        parent_list.append(kept_cand.repeat_interleave(topk))
        parent_slot = topk_cs_index // topk
        scores = topk_cs_p
        input_ids = cand_ids[topk_cs_index]
        hidden = out[parent_slot]
        ancestors = [ancestors[j] + [own_rows[j]] for j in parent_slot.tolist()]
        kept_cand = n_cand + topk_cs_index
        n_cand += topk * topk
    # organize_draft_results
    all_scores = torch.cat(score_list)
    all_tokens = torch.cat(token_list)
    all_parents = torch.cat(parent_list)
    assert all_scores.numel() == topk + (E3.STEPS - 1) * topk * topk
    gap(all_scores, total - 1, order=False)
    top = torch.topk(all_scores, total - 1).indices
    selected = torch.sort(top).values
    return selected, all_tokens[selected], all_parents[selected], torch.log(all_scores[selected]), gaps


def accepted_len(selected, tokens, parents, labels):
    """Greedy tree verification: follow the selected child whose token is the next label."""
    node, depth = -1, 0
    while depth < len(labels):
        nxt = [int(c) for c, t, p in zip(selected, tokens, parents) if int(p) == node and int(t) == labels[depth]]
        if not nxt:
            break
        node, depth = nxt[0], depth + 1
    return depth


def path_of(node, selected, tokens, parents):
    by = {int(c): (int(t), int(p)) for c, t, p in zip(selected, tokens, parents)}
    path = []
    while node != -1:
        t, p = by[node]
        path.append(t)
        node = p
    return path[::-1]


def replay(plen, n, acc_at):
    """The replayed τ's (tokens, rounds) (docs/metrics.md §2-§3): a0 = the prompt length,
    a += A + 1, each round min(A + 1, end - a) tokens, until a reaches end = T - 1."""
    end, a, tokens, rounds, visited = n - 1, plen, 0, 0, []
    while a < end:
        visited.append(a)
        tokens += min(acc_at[a] + 1, end - a)
        rounds += 1
        a += acc_at[a] + 1
    return tokens, rounds, visited


def main():
    from safetensors.torch import load_file, save_file

    w = {k: (v.to(torch.float64) if v.is_floating_point() else v) for k, v in load_file(os.path.join(CHECKPOINT, "model.safetensors")).items()}
    g = load_file(os.path.join(E3.TARGET, "golden.safetensors"))
    os.makedirs(OUT, exist_ok=True)
    tensors, meta = {}, {}
    for topk, total in SHAPES:
        c = f"k{topk}t{total}"
        meta[c] = {"topk": topk, "total_tokens": total, "depth": E3.STEPS, "prompts": {}}
        for p in (0, 1):
            prompt = g[f"p{p}.input_ids"]
            ids = torch.cat([prompt, g[f"p{p}.greedy_ids"]])
            taps = torch.cat([g[f"p{p}.hs{t + 1}"].to(torch.float64) for t in E3.TAPS], -1)
            fused = taps @ w["fc.weight"].T
            plen, n = len(prompt), len(ids)
            anchors = list(range(plen, n - 1))
            trees, cols = {}, {k: [] for k in ("selected", "tokens", "parents", "log_scores", "min_cut_gap", "min_order_gap")}
            for a in anchors:
                sel, tok, par, lsc, gaps = tree_at(w, fused, ids, a, topk, total)
                trees[a] = (sel, tok, par)
                for k_, v_ in (("selected", sel), ("tokens", tok), ("parents", par), ("log_scores", lsc)):
                    cols[k_].append(v_)
                cols["min_cut_gap"].append(min([x for kind, x in gaps if kind == "cut"] + [math.inf]))
                cols["min_order_gap"].append(min([x for kind, x in gaps if kind == "order"] + [math.inf]))
            # The target's greedy tokens after each anchor (a random drafter accepts little), and
            # a planted continuation: along the tree's own chain, each visited round's deepest
            # selected node (the latest index among them) written after its anchor, so that rounds
            # accept several drafts; every other position keeps the sequence's token.
            labels = ids.tolist()
            planted = list(labels)
            a = plen
            while a < n - 1:
                sel, tok, par = trees[a]
                depth = {}
                for cnd, pa in zip(sel.tolist(), par.tolist()):
                    depth[cnd] = 1 if pa == -1 else depth[pa] + 1
                node = max(depth, key=lambda x: (depth[x], x))
                path = path_of(node, sel, tok, par)[: n - 1 - a]
                planted[a + 1 : a + 1 + len(path)] = path
                a += accepted_len(sel, tok, par, planted[a + 1 :]) + 1
            acc = {a: accepted_len(*trees[a], labels[a + 1 :]) for a in anchors}
            acc_planted = {a: accepted_len(*trees[a], planted[a + 1 :]) for a in anchors}
            for k_ in ("selected", "tokens", "parents"):
                tensors[f"{c}.p{p}.{k_}"] = torch.stack(cols[k_]).to(torch.int64).contiguous()
            tensors[f"{c}.p{p}.log_scores"] = torch.stack(cols["log_scores"]).float().contiguous()
            for k_ in ("min_cut_gap", "min_order_gap"):
                tensors[f"{c}.p{p}.{k_}"] = torch.tensor(cols[k_], dtype=torch.float32).clamp(max=1e9)
            tensors[f"{c}.p{p}.accepted"] = torch.tensor([acc[a] for a in anchors], dtype=torch.int64)
            tensors[f"{c}.p{p}.accepted_planted"] = torch.tensor([acc_planted[a] for a in anchors], dtype=torch.int64)
            tensors[f"{c}.p{p}.planted_labels"] = torch.tensor(planted, dtype=torch.int64)
            tok_r, rounds_r, _ = replay(plen, n, acc)
            tok_p, rounds_p, visited = replay(plen, n, acc_planted)
            near = [a for a, x in zip(anchors, cols["min_cut_gap"]) if x < NEAR_TIE]
            meta[c]["prompts"][f"p{p}"] = {
                "anchors": [anchors[0], anchors[-1]],
                "prompt_length": plen,
                "sequence_length": n,
                "tree_tokens_rounds": [tok_r, rounds_r],
                "planted_tree_tokens_rounds": [tok_p, rounds_p],
                "near_tie_anchors": near,
                "planted_chain_has_a_near_tie": any(a in near for a in visited),
            }
            print(f"{c} p{p}: {len(anchors)} anchors, accepted {sum(acc.values())} drafts (planted {sum(acc_planted.values())}), tree τ {tok_r}/{rounds_r}, planted {tok_p}/{rounds_p}, near ties at {near}")
    path = os.path.join(OUT, "tree.safetensors")
    save_file(tensors, path)
    manifest = {
        "what": "EAGLE-3 dynamic draft trees (tools/golden/make_eagle3_tree_golden.py): pure PyTorch float64, SGLang's draft_forward / select_top_k_tokens / organize_draft_results for one request, tree attention by an explicit mask, CPU",
        "checkpoint": f"{CHECKPOINT} (model.safetensors sha256 {sha256(os.path.join(CHECKPOINT, 'model.safetensors'))})",
        "target": f"{E3.TARGET} (golden.safetensors sha256 {sha256(os.path.join(E3.TARGET, 'golden.safetensors'))}); taps = its f16 hs1..hs3",
        "candidates": "score_list order: depth 1's TOPK, then per depth m >= 2 the TOPK x TOPK children of the kept nodes, kept slot j child c at TOPK + (m-2)·TOPK² + j·TOPK + c",
        "near_tie": NEAR_TIE,
        "near_tie_note": "min_cut_gap: the smallest log-gap at a cut (a node's top-k children, the k kept per depth, the final TOTAL - 1); min_order_gap: between two of the kept or of a node's top-k, whose order numbers the next depth's candidates. An anchor with a gap below near_tie may select (cut) or number (order) its nodes otherwise in f32; the test compares it only where the gap allows",
        "shapes": meta,
        "tree_safetensors_sha256": sha256(path),
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
    }
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(OUT, x)) for x in os.listdir(OUT))
    print(f"wrote {OUT}: {size} bytes")


if __name__ == "__main__":
    main()
