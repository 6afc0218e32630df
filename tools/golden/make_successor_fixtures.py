#!/usr/bin/env python3
"""Known-answer fixtures for every drafter family: a "successor" target, one drafter per family
that proposes exactly the target's greedy continuation (every draft accepted), and one "defect"
drafter per family that is wrong at known places (rounds of every length, rejections included).

Written with the Python standard library only (CI's python3 has no torch): the CPU test
crates/cli/tests/cli_families_known_answer.rs and the GPU script
tools/bench/families_known_answer_device.sh both run it into a temporary folder; nothing is
committed but this script. `--check-hf DEVICE` (needs torch + transformers) also loads both
targets with transformers, in float32 on the CPU or bfloat16 on CUDA, and checks that the greedy
next token at every position of every prompt + expected continuation is the successor, with its
logit margin.

The vocabulary: V = 64 tokens of a word-level tokenizer, the words w0..w61 on the cycle
0 -> 1 -> ... -> 61 -> 0 (succ(t) = (t + 1) mod 62), then <mask> (62, DFlash's mask token) and
<eos> (63, the end of sequence), neither ever produced. Hidden size H = 128 >= V, so token t's
embedding is the one-hot e_t.

Targets (every attention / Gated DeltaNet / MLP *output* projection is zero, their inputs are
pseudo-random, so every kernel runs on real data and the residual stream stays e_t exactly):
  qwen3/   Qwen3, 3 layers (heads 2 / KV 1 of 64), final norm 1, lm_head[succ(t), t] = 3:
           the greedy next token of t is succ(t) with logit 3·sqrt(128) = 33.9, every other
           logit below 0.18 (a small ramp, distinct down each column, so that no two logits tie).
  qwen35/  Qwen3.5 (qwen3_5_text): one Gated DeltaNet layer (2 key / 4 value heads of 128) and
           one gated-attention layer (heads 2 / KV 1 of 128), zero-centred norms at 0, the same
           LM head; with its native MTP head (mtp.*), below. qwen35-defect/ is the same target
           with the defect head.
Every hidden state of either target at position j is e_{y_j} (the final-norm state 11.3·e_{y_j}).

Drafters, each proposing succ^k(y_a) at drafted position k of a round at anchor a:
  dflash/   DFlash, B = 4, one layer of 3 heads (KV 1, head dim 64). Rows 1..3 of the block hold the
            mask token and differ only by position, so the block reads y_a from row 0 through
            RoPE: head h's query is rotated back by h·θ0 (θ0 = 1 rad, RoPE pair 0), so its score
            on row 0 is 2·cos(k − h) at block row k, largest for h = k; head h writes
            succ^(h−1)(y_a) (o_proj), the target's LM head adds one more succ. The context
            (taps of positions < a) is suppressed (score −40 through the slowest RoPE pair), so
            the drafts depend on y_a and the block positions only.
  dflash2/  DFlash2, B = 5: the backbone's drafted rows are the constant state of the mask token
            (logits the ramp of its LM-head column: no two tie, all 64 tokens are candidates,
            selector_top_k 64), and the candidate selector's pairwise term is 100 for
            (prev, succ(prev)) and 0 otherwise: the drafts follow the selector's own path from
            y_a (with y_a as every position's predecessor it would accept one token a round).
  eagle3/   EAGLE-3, K = 4 (B = 5), taps [0, 1, 2], its own draft vocabulary of the 62 cycle
            tokens in reverse order through d2t / t2d (draft id i = target id 61 − i):
            fc maps the tap e_x to e_succ(x), so step 1 (context row a − 1, whose tap is
            e_{y_(a−1)}) holds e_{y_a}; the midlayer's MLP maps e_x to e_succ(x) (attention adds
            nothing), so every step drafts the successor of the state before it.
  qwen35 (target:mtp:3)  the MTP head: fc = [0 | P] (P e_x = e_succ(x)) over the target's
            final-norm state, its layer adding nothing, so step 1 (state at a − 1) drafts
            succ(y_a) through the target's LM head and step s the successor of step s − 1.
  EAGLE-3 and MTP read the taps / states the verify passes captured: a round whose context rows
  came from the wrong positions drafts a wrong token.
The defect drafters (dflash-defect/, dflash2-defect/, eagle3-defect/, qwen35-defect/'s head) are
the same with one change each, chosen so that drafted position k is wrong exactly when the token
before it, y_(a+k−1), is in DEFECTS = {x : x mod 5 = 0 or x mod 13 = 6}: the token drafted
after such an x is succ^32(x), half way round the cycle, instead of succ(x) (DFlash: head k's
o_proj; DFlash2: the selector's successor codebook; EAGLE-3: the MLP; MTP: fc). A round at
anchor a thus accepts A(a) = the number of tokens y_a, y_(a+1), … before the first one in
DEFECTS (at most B − 1), the target's successor is its bonus, and the next round starts there:
with these prompts the rounds commit every length from 1 (all drafts rejected) to B, 10 to 17
rounds a prompt (manifest "cases").

Expected (manifest.json "cases", computed here by that rule; at T = 0 and at T > 0 alike):
with max_new_tokens = 41 (the prefill's token + 40 counted), the exact drafters commit B tokens
every round, so τ = B exactly (10 rounds at B = 4, 8 at B = 5), the defect drafters the rounds
the rule gives; replayed τ (run) = live τ; live output = plain greedy = the successor words. At
T > 0 the target's p and every drafter's q put all but about e^-30 of their mass on one token
(logit margins >= 30, manifest "margins"): a right draft is accepted with probability
1 − O(64·e^-30), a wrong one rejected with the same, and the residual and the bonus are the
successor, so the sampled rounds and tokens are the greedy ones (in f32, p and q of the top
token round to 1).

Outputs (OUT/): qwen3/, qwen35/, qwen35-defect/ (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json), dflash/, dflash2/, eagle3/ and their -defect/ (config.json,
model.safetensors), prompts.jsonl, manifest.json (cases, prompts, continuations, expected
rounds and τ, margins).

Usage: python3 tools/golden/make_successor_fixtures.py --out DIR [--check-hf cpu|cuda]
"""
import argparse
import json
import math
import os
import struct
import sys
from array import array

V, CYCLE, MASK, EOS, H = 64, 62, 62, 63, 128
# Target LM head: lm_head[succ(t), t] = HEAD; every other entry a ramp below RAMP.
HEAD, RAMP = 3.0, 1.0 / 64
MAX_NEW_TOKENS = 41
PROMPTS = [("p0", "w3 w4 w5 w6"), ("p1", "w40 w2 w17 w55 w58"), ("p2", "w20")]
# Family, target folder, drafter (a folder of OUT, or the target's MTP head), block size B.
FAMILIES = [("dflash", "qwen3", "dflash", 4), ("dflash2", "qwen3", "dflash2", 5),
            ("eagle3", "qwen3", "eagle3", 5), ("mtp", "qwen35", "target:mtp:3", 4)]


def cases():
    """(name, family, target, drafter, B, defect) of every case: each family exact, then defect
    (the MTP head's defect is a target of its own, the head being part of it)."""
    out = []
    for defect in (False, True):
        suffix = "-defect" if defect else ""
        for family, target, drafter, block in FAMILIES:
            if family == "mtp":
                out.append((family + suffix, family, target + suffix, drafter, block, defect))
            else:
                out.append((family + suffix, family, target, drafter + suffix, block, defect))
    return out


def succ(t, n=1):
    return (t + n) % CYCLE


def in_defects(x):
    """The tokens after which a defect drafter drafts a wrong token."""
    return x % 5 == 0 or x % 13 == 6


def next_draft(x, defect):
    """The token a drafter drafts after token x: its successor, or for the defect drafters where x
    is in DEFECTS the token half way round the cycle (never the successor, and far from every
    token the other DFlash heads write)."""
    return succ(x, CYCLE // 2 + 1) if defect and in_defects(x) else succ(x)


def pred(x):
    return succ(x, CYCLE - 1)


def ramp(s, t):
    """A small value, distinct for every row s of a column t (37 is odd, so s -> 37·s mod 64 is
    one to one): breaks the ties between the logits that are not the successor's."""
    return RAMP * ((37 * s + 11 * t) % 64) / 64


class Rng:
    """splitmix64: the pseudo-random inputs of the zeroed blocks, the same on every machine."""

    def __init__(self, seed):
        self.s = seed

    def uniform(self, scale):
        self.s = (self.s + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        z ^= z >> 31
        return (z / 2.0**64 * 2 - 1) * scale


class Tensors:
    """Tensors of one safetensors file, written as `dtype` (BF16 unless given)."""

    def __init__(self, seed):
        self.t = {}
        self.rng = Rng(seed)

    def put(self, name, shape, values, dtype="BF16"):
        n = math.prod(shape)
        assert len(values) == n, (name, shape, len(values))
        self.t[name] = (dtype, list(shape), values)

    def zeros(self, name, shape):
        self.put(name, shape, [0.0] * math.prod(shape))

    def fill(self, name, shape, value, dtype="BF16"):
        self.put(name, shape, [value] * math.prod(shape), dtype)

    def random(self, name, shape, scale, dtype="BF16"):
        self.put(name, shape, [self.rng.uniform(scale) for _ in range(math.prod(shape))], dtype)

    def matrix(self, name, rows, cols, entries):
        """A [rows, cols] matrix, zero but for `entries` {(row, col): value}."""
        m = [0.0] * (rows * cols)
        for (r, c), v in entries.items():
            m[r * cols + c] = v
        self.put(name, [rows, cols], m)

    def write(self, path):
        header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
        for name in sorted(self.t):
            dtype, shape, values = self.t[name]
            blob = encode(dtype, values)
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(blob)]}
            blobs.append(blob)
            offset += len(blob)
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def encode(dtype, values):
    if dtype == "F32":
        return array("f", values).tobytes()
    if dtype == "I64":
        return struct.pack(f"<{len(values)}q", *values)
    if dtype == "BOOL":
        return bytes(1 if v else 0 for v in values)
    assert dtype == "BF16"
    bits = array("I")
    bits.frombytes(array("f", values).tobytes())
    out = array("H", (bf16_bits(b) for b in bits))
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def bf16_bits(f32_bits):
    """The bfloat16 bits of a float32's bits, rounded to nearest even (as torch's
    .to(torch.bfloat16) rounds finite values)."""
    return ((f32_bits + 0x7FFF + ((f32_bits >> 16) & 1)) >> 16) & 0xFFFF


def bf16(x):
    """x rounded to bfloat16, as the checkpoints store it."""
    (b,) = struct.unpack("<I", struct.pack("<f", x))
    return struct.unpack("<f", struct.pack("<I", bf16_bits(b) << 16))[0]


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=1)
        f.write("\n")


def lm_head_entries():
    """The target's LM head [V, H]: successor entries HEAD, the ramp over the token columns."""
    e = {(s, t): ramp(s, t) for s in range(V) for t in range(V)}
    for t in range(CYCLE):
        e[(succ(t), t)] = HEAD
    return e


def write_tokenizer(out):
    # The mask and end-of-sequence tokens are named as special tokens (`lint` tells them apart
    # from text by the angle brackets).
    vocab = {f"w{i}": i for i in range(CYCLE)} | {"<mask>": MASK, "<eos>": EOS}
    # The WordPiece decoder joins the words with spaces (the output text is "w7 w8 …").
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
           "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
           "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
           "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}}
    write_json(os.path.join(out, "tokenizer.json"), tok)
    write_json(os.path.join(out, "tokenizer_config.json"), {"eos_token": "<eos>"})


# ---------------------------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------------------------

def write_qwen3(out):
    os.makedirs(out, exist_ok=True)
    layers, heads, kv, hd, inter = 3, 2, 1, 64, 128
    write_json(os.path.join(out, "config.json"), {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": V, "hidden_size": H,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv, "head_dim": hd, "hidden_act": "silu", "attention_bias": False,
        "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 1024,
        "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": EOS, "torch_dtype": "bfloat16"})
    t = Tensors(seed=1)
    t.matrix("model.embed_tokens.weight", V, H, {(i, i): 1.0 for i in range(V)})
    for i in range(layers):
        p = f"model.layers.{i}"
        t.fill(f"{p}.input_layernorm.weight", [H], 1.0)
        t.fill(f"{p}.post_attention_layernorm.weight", [H], 1.0)
        t.random(f"{p}.self_attn.q_proj.weight", [heads * hd, H], 0.2)
        t.random(f"{p}.self_attn.k_proj.weight", [kv * hd, H], 0.2)
        t.random(f"{p}.self_attn.v_proj.weight", [kv * hd, H], 0.2)
        t.zeros(f"{p}.self_attn.o_proj.weight", [H, heads * hd])
        t.fill(f"{p}.self_attn.q_norm.weight", [hd], 1.0)
        t.fill(f"{p}.self_attn.k_norm.weight", [hd], 1.0)
        t.random(f"{p}.mlp.gate_proj.weight", [inter, H], 0.2)
        t.random(f"{p}.mlp.up_proj.weight", [inter, H], 0.2)
        t.zeros(f"{p}.mlp.down_proj.weight", [H, inter])
    t.fill("model.norm.weight", [H], 1.0)
    t.matrix("lm_head.weight", V, H, lm_head_entries())
    t.write(os.path.join(out, "model.safetensors"))
    write_tokenizer(out)


# The Qwen3.5 target's gated-attention layer shape, shared by its MTP head's layer.
Q35_HEADS, Q35_KV, Q35_HD, Q35_INTER = 2, 1, 128, 128


def full_attention_layer(t, p):
    """A Qwen3.5 gated-attention decoder layer adding nothing (zero-centred norms at 0)."""
    t.zeros(f"{p}.input_layernorm.weight", [H])
    t.zeros(f"{p}.post_attention_layernorm.weight", [H])
    t.random(f"{p}.self_attn.q_proj.weight", [2 * Q35_HEADS * Q35_HD, H], 0.2)  # query and gate
    t.random(f"{p}.self_attn.k_proj.weight", [Q35_KV * Q35_HD, H], 0.2)
    t.random(f"{p}.self_attn.v_proj.weight", [Q35_KV * Q35_HD, H], 0.2)
    t.zeros(f"{p}.self_attn.o_proj.weight", [H, Q35_HEADS * Q35_HD])
    t.zeros(f"{p}.self_attn.q_norm.weight", [Q35_HD])
    t.zeros(f"{p}.self_attn.k_norm.weight", [Q35_HD])
    t.random(f"{p}.mlp.gate_proj.weight", [Q35_INTER, H], 0.2)
    t.random(f"{p}.mlp.up_proj.weight", [Q35_INTER, H], 0.2)
    t.zeros(f"{p}.mlp.down_proj.weight", [H, Q35_INTER])


def write_qwen35(out, defect):
    """Qwen3.5 text model: Gated DeltaNet then gated attention, with its MTP head."""
    os.makedirs(out, exist_ok=True)
    hk, hv, dk, dv, conv = 2, 4, 128, 128, 4
    write_json(os.path.join(out, "config.json"), {
        "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "vocab_size": V,
        "hidden_size": H, "intermediate_size": Q35_INTER, "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"], "num_attention_heads": Q35_HEADS,
        "num_key_value_heads": Q35_KV, "head_dim": Q35_HD, "linear_num_key_heads": hk,
        "linear_num_value_heads": hv, "linear_key_head_dim": dk, "linear_value_head_dim": dv,
        "linear_conv_kernel_dim": conv, "partial_rotary_factor": 0.25,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25},
        "hidden_act": "silu", "attention_bias": False, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 1024, "tie_word_embeddings": False, "bos_token_id": None,
        "eos_token_id": EOS, "torch_dtype": "bfloat16",
        "mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False})
    t = Tensors(seed=2)
    t.matrix("model.embed_tokens.weight", V, H, {(i, i): 1.0 for i in range(V)})
    p = "model.layers.0"
    t.zeros(f"{p}.input_layernorm.weight", [H])
    t.zeros(f"{p}.post_attention_layernorm.weight", [H])
    qkv = 2 * hk * dk + hv * dv
    t.random(f"{p}.linear_attn.in_proj_qkv.weight", [qkv, H], 0.2)
    t.random(f"{p}.linear_attn.in_proj_z.weight", [hv * dv, H], 0.2)
    t.random(f"{p}.linear_attn.in_proj_b.weight", [hv, H], 0.2)
    t.random(f"{p}.linear_attn.in_proj_a.weight", [hv, H], 0.2)
    t.random(f"{p}.linear_attn.conv1d.weight", [qkv, 1, conv], 0.5)
    t.random(f"{p}.linear_attn.A_log", [hv], 1.0, dtype="F32")
    t.random(f"{p}.linear_attn.dt_bias", [hv], 1.0, dtype="F32")
    t.fill(f"{p}.linear_attn.norm.weight", [dv], 1.0)
    t.zeros(f"{p}.linear_attn.out_proj.weight", [H, hv * dv])
    t.random(f"{p}.mlp.gate_proj.weight", [Q35_INTER, H], 0.2)
    t.random(f"{p}.mlp.up_proj.weight", [Q35_INTER, H], 0.2)
    t.zeros(f"{p}.mlp.down_proj.weight", [H, Q35_INTER])
    full_attention_layer(t, "model.layers.1")
    t.zeros("model.norm.weight", [H])
    t.matrix("lm_head.weight", V, H, lm_head_entries())
    # The MTP head: x = fc([norm(embed(token)) | norm(state)]) reads the state only, through
    # P e_x = e_succ(x); its layer adds nothing; mtp.norm at 0 (scale 1). The target's LM head
    # adds the second successor: the state at a − 1 (token y_(a−1)) drafts next_draft(y_a).
    t.zeros("mtp.pre_fc_norm_embedding.weight", [H])
    t.zeros("mtp.pre_fc_norm_hidden.weight", [H])
    t.matrix("mtp.fc.weight", H, 2 * H, {(pred(next_draft(succ(x), defect)), H + x): 1.0 for x in range(CYCLE)})
    full_attention_layer(t, "mtp.layers.0")
    t.zeros("mtp.norm.weight", [H])
    t.write(os.path.join(out, "model.safetensors"))
    write_tokenizer(out)


# ---------------------------------------------------------------------------------------------
# drafters
# ---------------------------------------------------------------------------------------------

# DFlash: B = 4, one head per drafted row; scores 2·cos(k − h) on block row 0, −40 on context.
DF_B, DF_HD, DF_NORM = 4, 64, 5.0
DF_S0, DF_S1 = 2.0, 40.0
CTX = V  # the hidden dimension fc writes every tap into (no token's embedding uses it)


def dflash_layer(t, heads, kv, hd, inter):
    """Backbone tensors of layer 0 whose attention and MLP add nothing (inputs pseudo-random)."""
    p = "layers.0"
    t.fill(f"{p}.input_layernorm.weight", [H], 1.0)
    t.fill(f"{p}.post_attention_layernorm.weight", [H], 1.0)
    t.random(f"{p}.self_attn.q_proj.weight", [heads * hd, H], 0.2)
    t.random(f"{p}.self_attn.k_proj.weight", [kv * hd, H], 0.2)
    t.random(f"{p}.self_attn.v_proj.weight", [kv * hd, H], 0.2)
    t.zeros(f"{p}.self_attn.o_proj.weight", [H, heads * hd])
    t.fill(f"{p}.self_attn.q_norm.weight", [hd], 1.0)
    t.fill(f"{p}.self_attn.k_norm.weight", [hd], 1.0)
    t.random(f"{p}.mlp.gate_proj.weight", [inter, H], 0.2)
    t.random(f"{p}.mlp.up_proj.weight", [inter, H], 0.2)
    t.zeros(f"{p}.mlp.down_proj.weight", [H, inter])


def dflash_config(block, heads, kv, hd, inter, taps):
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": block,
            "dflash_config": {"mask_token_id": MASK, "target_layer_ids": taps},
            "num_target_layers": 3, "num_hidden_layers": 1, "hidden_size": H, "intermediate_size": inter,
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd, "hidden_act": "silu",
            "rope_theta": 1e6, "rms_norm_eps": 1e-6, "vocab_size": V, "layer_types": ["full_attention"],
            "max_position_embeddings": 1024, "tie_word_embeddings": False}


def dflash_head_map(h, t, defect):
    """Where head h (1-based) writes the anchor token t: the token before row h's draft, the LM
    head adding the successor; the draft is next_draft(succ^(h−1)(t))."""
    return pred(next_draft(succ(t, h - 1), defect))


def write_dflash(out, defect):
    """Block row k's head h (1-based, h = 1..B−1) scores block row 0 at 2·cos(k − h): q of the
    mask token (after q_norm, 8/√2 per unit) at angle −h in RoPE pair 0 (dims 0, 32; θ0 = 1 rad)
    and +1 in pair 31 (dims 31, 63; θ31 = 1e6^(−31/32) ≈ 1.5e-6 rad, so no rotation over a few
    thousand positions); keys of the cycle tokens +1 in pair 0, of the context (fc writes every
    tap into CTX) −1 in pair 31, of the mask token 0; k_norm scales pair 0 to DF_S0 and pair
    31 to DF_S1. Values: the token's one-hot (value dim t); o_proj writes head h's dim t to
    dflash_head_map(h, t): succ^(h−1)(t), for the defect drafter the token before its wrong
    draft."""
    os.makedirs(out, exist_ok=True)
    heads, kv, inter = DF_B - 1, 1, 128
    write_json(os.path.join(out, "config.json"), dflash_config(DF_B, heads, kv, DF_HD, inter, [1]))
    t = Tensors(seed=3)
    t.matrix("fc.weight", H, H, {(CTX, x): 1.0 for x in range(V)})
    t.fill("hidden_norm.weight", [H], 1.0)
    t.fill("norm.weight", [H], DF_NORM)
    dflash_layer(t, heads, kv, DF_HD, inter)
    p, half = "layers.0.self_attn", DF_HD // 2
    q = {}
    for h in range(1, heads + 1):
        base = (h - 1) * DF_HD
        q[(base + 0, MASK)] = math.cos(h)
        q[(base + half, MASK)] = -math.sin(h)
        q[(base + half - 1, MASK)] = 1.0
    t.matrix(f"{p}.q_proj.weight", heads * DF_HD, H, q)
    k = {(0, x): 1.0 for x in range(CYCLE)}
    k[(half - 1, CTX)] = -1.0
    t.matrix(f"{p}.k_proj.weight", DF_HD, H, k)
    t.matrix(f"{p}.v_proj.weight", DF_HD, H, {(x, x): 1.0 for x in range(CYCLE)})
    t.matrix(f"{p}.o_proj.weight", H, heads * DF_HD,
             {(dflash_head_map(h, x, defect), (h - 1) * DF_HD + x): 1.0
              for h in range(1, heads + 1) for x in range(CYCLE)})
    # After q_norm every query unit is sqrt(64 / 2) = 5.657; the score divides by sqrt(64) = 8
    # and k_norm's units are 8·w, so w = S / 5.657.
    unit = math.sqrt(DF_HD / 2)
    kn = [1.0] * DF_HD
    kn[0] = kn[half] = DF_S0 / unit
    kn[half - 1] = kn[DF_HD - 1] = DF_S1 / unit
    t.put(f"{p}.k_norm.weight", [DF_HD], kn)
    t.write(os.path.join(out, "model.safetensors"))


def dflash_margin(defect):
    """The smallest top-1 minus top-2 logit of a drafted row, over every anchor token and row,
    from the construction above in float64 with the stored (bf16) weights and the worst case of
    the context (its keys' mass e^-40 per position is left out: < 1e-15 at 1000 positions)."""
    unit = math.sqrt(DF_HD / 2)
    s0 = unit * bf16(DF_S0 / unit)
    head = {k: bf16(v) for k, v in lm_head_entries().items()}
    worst = math.inf
    for ya in range(CYCLE):
        for k in range(1, DF_B):
            # Keys: row 0 (the anchor), rows 1..B−1 (mask: key 0, score 0).
            w = {}
            for h in range(1, DF_B):
                e = math.exp(s0 * math.cos(k - h))
                w[h] = e / (e + DF_B - 1)
            x = [0.0] * H
            x[MASK] = 1.0
            for h in range(1, DF_B):
                # v = input_layernorm(e_ya) = sqrt(H)·e_ya
                x[dflash_head_map(h, ya, defect)] += math.sqrt(H) * w[h]
            rms = math.sqrt(sum(v * v for v in x) / H + 1e-6)
            n = [v / rms * bf16(DF_NORM) for v in x]
            logits = sorted(((sum(head.get((s, i), 0.0) * n[i] for i in range(V)), s) for s in range(V)), reverse=True)
            assert logits[0][1] == succ(dflash_head_map(k, ya, defect)), (ya, k, logits[:2])
            worst = min(worst, logits[0][0] - logits[1][0])
    return worst


def write_dflash2(out, defect):
    """Drafted rows: the mask token's state, unchanged by the layer (every output projection 0),
    normed to sqrt(H)·e_MASK; the LM head gives it the ramp of column MASK (distinct, < 0.18);
    hidden_projection maps it to 100 on every rank unit, the codebooks pick
    (prev, next_draft(prev))."""
    os.makedirs(out, exist_ok=True)
    block, heads, kv, hd, inter, rank, group, ks = 5, 1, 1, 64, 128, V, 16, 2
    conf = dflash_config(block, heads, kv, hd, inter, [1])
    conf["architectures"] = ["DFlash2DraftModel"]
    conf["dflash_config"].update(block_size=block, conv_kernel_size=ks, conv_group_size=group,
                                 selector_rank=rank, selector_top_k=V, output_multiplier=1.0,
                                 final_logit_softcapping=None)
    write_json(os.path.join(out, "config.json"), conf)
    t = Tensors(seed=4)
    t.random("fc.weight", [H, H], 0.2)
    t.fill("hidden_norm.weight", [H], 1.0)
    t.fill("norm.weight", [H], 1.0)
    dflash_layer(t, heads, kv, hd, inter)
    for conv in ("attention_conv", "mlp_conv"):
        t.random(f"layers.0.{conv}.base_kernel", [2, ks, H], 0.5)
        t.random(f"layers.0.{conv}.kernel_projection.weight", [2 * ks * (H // group), H], 0.05)
    t.matrix("candidate_selector.hidden_projection.weight", rank, H,
             {(r, MASK): 100.0 / math.sqrt(H) for r in range(rank)})
    t.matrix("candidate_selector.predecessor_codebook", V, rank, {(x, x): 1.0 for x in range(CYCLE)})
    t.matrix("candidate_selector.successor_codebook", V, rank,
             {(next_draft(x, defect), x): 1.0 for x in range(CYCLE)})
    t.write(os.path.join(out, "model.safetensors"))


def write_eagle3(out, defect):
    """fc maps tap 0's e_x to e_succ(x); the MLP maps the state e_x (normed: 8·e_x) to
    e_n(x) − e_x, n = next_draft (gate unit x = silu(8)·8, down_proj 1/that), so h' = e_n(x); the LM head
    reads unit 61 − i for draft id i, d2t[i] = 61 − 2i."""
    os.makedirs(out, exist_ok=True)
    d, hd, steps, draft_vocab = 64, 64, 4, CYCLE
    write_json(os.path.join(out, "config.json"), {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": d,
        "intermediate_size": d, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": hd,
        "num_hidden_layers": 1, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "rms_norm_eps": 1e-6, "rope_theta": 1e6, "rope_scaling": None, "max_position_embeddings": 1024,
        "vocab_size": V, "draft_vocab_size": draft_vocab, "target_hidden_size": H,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "num_speculative_tokens": steps,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True}})
    t = Tensors(seed=5)
    t.random("embed_tokens.weight", [V, d], 0.5)
    t.matrix("fc.weight", d, 3 * H, {(succ(x), x): 1.0 for x in range(CYCLE)})
    m = "midlayer"
    t.fill(f"{m}.input_layernorm.weight", [d], 1.0)
    t.fill(f"{m}.hidden_norm.weight", [d], 1.0)
    t.random(f"{m}.self_attn.q_proj.weight", [hd, 2 * d], 0.2)
    t.random(f"{m}.self_attn.k_proj.weight", [hd, 2 * d], 0.2)
    t.random(f"{m}.self_attn.v_proj.weight", [hd, 2 * d], 0.2)
    t.zeros(f"{m}.self_attn.o_proj.weight", [d, hd])
    t.fill(f"{m}.post_attention_layernorm.weight", [d], 1.0)
    root = math.sqrt(d)
    act = root / (1 + math.exp(-root)) * root  # silu(gate) · up at the active unit
    t.matrix(f"{m}.mlp.gate_proj.weight", d, d, {(x, x): 1.0 for x in range(CYCLE)})
    t.matrix(f"{m}.mlp.up_proj.weight", d, d, {(x, x): 1.0 for x in range(CYCLE)})
    down = {}
    for x in range(CYCLE):
        down[(next_draft(x, defect), x)] = 1.0 / act
        down[(x, x)] = -1.0 / act
    t.matrix(f"{m}.mlp.down_proj.weight", d, d, down)
    t.fill("norm.weight", [d], 1.0)
    head = {(i, u): ramp(i, u) for i in range(draft_vocab) for u in range(d)}
    for i in range(draft_vocab):
        head[(i, CYCLE - 1 - i)] = 4.0
    t.matrix("lm_head.weight", draft_vocab, d, head)
    t.put("d2t", [draft_vocab], [CYCLE - 1 - 2 * i for i in range(draft_vocab)], dtype="I64")
    t.put("t2d", [V], [x < CYCLE for x in range(V)], dtype="BOOL")
    t.write(os.path.join(out, "model.safetensors"))


# ---------------------------------------------------------------------------------------------
# prompts, expectations, the transformers check
# ---------------------------------------------------------------------------------------------

def continuation(prompt):
    """The target's greedy continuation of `prompt`: MAX_NEW_TOKENS successors of its last word."""
    last = int(prompt.split()[-1][1:])
    return [succ(last, i + 1) for i in range(MAX_NEW_TOKENS)]


def expected_rounds(prompt, block, defect):
    """Tokens committed by each round of the greedy loop over `prompt` (the rule of the module
    doc): a round at anchor y_a accepts the drafts before the first wrong one, the draft at a + k
    being wrong for the defect drafters exactly when y_(a+k−1) is in DEFECTS, and commits them
    and the bonus, within the budget (the prefill's token is not counted)."""
    ys = continuation(prompt) + [succ(continuation(prompt)[-1], i + 1) for i in range(block)]
    counted, i, rounds = MAX_NEW_TOKENS - 1, 0, []
    while i < counted:
        accepted = 0
        while accepted < block - 1 and not (defect and in_defects(ys[i + accepted])):
            accepted += 1
        rounds.append(min(accepted + 1, counted - i))
        i += rounds[-1]
    return rounds


def write_fixtures(out):
    os.makedirs(out, exist_ok=True)
    write_qwen3(os.path.join(out, "qwen3"))
    for defect in (False, True):
        suffix = "-defect" if defect else ""
        write_qwen35(os.path.join(out, "qwen35" + suffix), defect)
        write_dflash(os.path.join(out, "dflash" + suffix), defect)
        write_dflash2(os.path.join(out, "dflash2" + suffix), defect)
        write_eagle3(os.path.join(out, "eagle3" + suffix), defect)
    with open(os.path.join(out, "prompts.jsonl"), "w") as f:
        for pid, text in PROMPTS:
            f.write(json.dumps({"id": pid, "prompt": text}) + "\n")
    sqrt_h = math.sqrt(H)
    # Top-1 minus top-2 logit, the ramp's largest entry counted against the top-1.
    margins = {
        "target": bf16(HEAD) * sqrt_h - RAMP * sqrt_h,
        "dflash": min(dflash_margin(False), dflash_margin(True)),
        "dflash2_selector": 100.0 - RAMP * sqrt_h,
        "eagle3": 4.0 * 8 - RAMP * 8,  # its LM head's 4 over the normed state 8·e_x
        "mtp": bf16(HEAD) * sqrt_h - RAMP * sqrt_h,
    }
    assert min(margins.values()) > 30, margins
    manifest_cases = []
    for name, family, target, drafter, block, defect in cases():
        per_prompt = {}
        for pid, text in PROMPTS:
            rounds = expected_rounds(text, block, defect)
            per_prompt[pid] = {"rounds": len(rounds), "round_tokens": rounds,
                               "tau": (MAX_NEW_TOKENS - 1) / len(rounds)}
        taus = [v["tau"] for v in per_prompt.values()]
        manifest_cases.append({"case": name, "family": family, "target": target, "drafter": drafter,
                               "block": block, "defect": defect, "prompts": per_prompt,
                               "tau_macro": sum(taus) / len(taus)})
    write_json(os.path.join(out, "manifest.json"), {
        "what": "known-answer fixtures of tools/golden/make_successor_fixtures.py (see its docstring)",
        "max_new_tokens": MAX_NEW_TOKENS,
        "prompts": [{"id": pid, "prompt": text, "continuation": " ".join(f"w{i}" for i in continuation(text))}
                    for pid, text in PROMPTS],
        "cases": manifest_cases,
        "margins": margins,
    })
    return manifest_cases, margins


def check_hf(out, device):
    """Load both targets with transformers and check the greedy next token at every position of
    prompt + continuation (the prompt's own positions included): the successor, with its margin."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    worst = {}
    for name in ("qwen3", "qwen35"):
        model = AutoModelForCausalLM.from_pretrained(os.path.join(out, name), dtype=dtype).to(device).eval()
        worst[name] = math.inf
        for pid, text in PROMPTS:
            ids = [int(w[1:]) for w in text.split()] + continuation(text)
            with torch.no_grad():
                logits = model(torch.tensor([ids], device=device)).logits[0].float()
            top = logits.topk(2, dim=-1)
            for j in range(len(ids) - 1):
                want = succ(ids[j])
                got = int(top.indices[j, 0])
                if got != want:
                    raise SystemExit(f"check-hf {name} {device}: {pid} position {j}: next token {got}, expected {want}")
            worst[name] = min(worst[name], float((top.values[:, 0] - top.values[:, 1]).min()))
        print(f"check-hf {name} ({device}, {dtype}): every next token the successor, smallest margin {worst[name]:.3f}")
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--check-hf", choices=["cpu", "cuda"], help="also check both targets with transformers on this device")
    args = ap.parse_args()
    manifest_cases, margins = write_fixtures(args.out)
    print(f"fixtures in {args.out}; logit margins " + ", ".join(f"{k} {v:.2f}" for k, v in margins.items()))
    for c in manifest_cases:
        rounds = " ".join(f"{pid} {v['rounds']} rounds τ {v['tau']:.4f}" for pid, v in c["prompts"].items())
        print(f"  {c['case']:15} B {c['block']}: {rounds}")
    if args.check_hf:
        check_hf(args.out, args.check_hf)


if __name__ == "__main__":
    main()
