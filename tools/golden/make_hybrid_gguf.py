#!/usr/bin/env python3
"""Write the committed random-weight hybrid golden models as GGUF files, the way llama.cpp's
converter (`convert_hf_to_gguf.py`, classes Qwen3NextModel and Qwen3_5TextModel) writes them, with
an independent writer: gguf-py (`gguf` 0.19.0 on PyPI, the package that converter uses) and numpy;
no draftlens code, no torch. draftlens' GGUF reader is tested against these files
(crates/engine/tests/golden_hybrid_gguf.rs): each must give the golden's hidden states and greedy tokens.

    python3 -m venv /tmp/gguf-venv
    /tmp/gguf-venv/bin/pip install --no-deps --require-hashes -r tools/golden/requirements-gguf.txt
    /tmp/gguf-venv/bin/python tools/golden/make_hybrid_gguf.py --golden tests/fixtures/golden

Inputs: tests/fixtures/golden/{qwen3_5,qwen3_next}/{config.json,model.safetensors} (bf16 weights,
f32 A_log / dt_bias). Outputs next to them: model.gguf.

What the converter does to these architectures (docs/hybrid-models.md, "GGUF"), re-implemented here
from its description:
  - names: gguf-py's tensor name map for MODEL_ARCH.QWEN35 / QWEN3NEXT (`blk.N.attn_qkv`,
    `attn_gate`, `ssm_conv1d`, `ssm_a`, `ssm_dt.bias`, `ssm_beta`, `ssm_alpha`, `ssm_ba`,
    `ssm_norm`, `ssm_out`, `post_attention_norm`, ...); the Qwen3.5 prefix
    `model.language_model.` is dropped, vision tensors and `mtp.*` are not written (the config has
    no MTP layers: mtp_num_hidden_layers is 0).
  - values: `A_log` is stored as ssm_a = -exp(A_log); the zero-centred RMSNorm weights (every
    `*norm.weight` except the GDN's gated `linear_attn.norm.weight`) are stored as 1 + w;
    `conv1d.weight` [C, 1, K] is squeezed to [C, K]; `dt_bias` becomes `ssm_dt.bias`.
  - Qwen3-Next: the grouped `in_proj_qkvz` is split into `attn_qkv` (all q, all k, all v) and
    `attn_gate` (z); `in_proj_ba` is written as is (`ssm_ba`, still grouped [b_g | a_g]).
  - Qwen3.5 with fewer key heads than value heads: value heads are reordered from grouped
    (head g·r + j) to tiled (head j·Hk + g) order in the v rows of `attn_qkv`, the rows of
    `attn_gate`, `ssm_beta`, `ssm_alpha`, the elements of `ssm_a` and `ssm_dt.bias`, the v
    channels of `ssm_conv1d` and the columns of `ssm_out`.
  - dtypes: 1-D tensors, norms and `ssm_conv1d` F32; other weights in the output type (qwen3_5:
    BF16, the converter's default for a bf16 checkpoint, exact; qwen3_next: F16, `--outtype f16`:
    12 of its weights are below f16's normal range and change by at most 3e-8; the script reports
    the count, and refuses any change in BF16).
  - metadata: `{arch}.block_count`, `context_length`, `embedding_length`, `feed_forward_length`,
    `attention.head_count`, `head_count_kv`, `key_length`, `value_length`,
    `layer_norm_rms_epsilon`, `rope.freq_base`, `rope.dimension_count` (= the rotary dims),
    `ssm.conv_kernel`, `ssm.state_size` (dk), `ssm.group_count` (Hk), `ssm.time_step_rank` (Hv),
    `ssm.inner_size` (Hv·dv), `full_attention_interval`; qwen35 also `rope.dimension_sections`;
    qwen3next the expert keys (expert_count 0: this model is dense).
Two departures, both forced: llama.cpp's QWEN3NEXT tensor list has only MoE MLPs, so the dense MLP
of this (num_experts 0) model is written under the dense names `ffn_gate/ffn_up/ffn_down` that
every other architecture uses; and the random models have no tokenizer, so a synthetic byte-level
BPE vocabulary of the model's size is written (256 byte tokens + two-letter merges).
"""
import argparse
import hashlib
import json
import os
import struct

import gguf
import numpy as np

ARCH = {"qwen3_5": gguf.MODEL_ARCH.QWEN35, "qwen3_next": gguf.MODEL_ARCH.QWEN3NEXT}
OUTTYPE = {"qwen3_5": gguf.GGMLQuantizationType.BF16, "qwen3_next": gguf.GGMLQuantizationType.F16}


def read_safetensors(path):
    """name -> f32 numpy array (bf16 widened exactly)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = raw[base + a : base + b]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F32":
            arr = np.frombuffer(buf, dtype="<f4").copy()
        else:
            raise SystemExit(f"{path}: {name}: unexpected dtype {info['dtype']}")
        out[name] = arr.reshape(info["shape"])
    return out


def text_config(cfg):
    if cfg.get("model_type") == "qwen3_5":
        merged = dict(cfg["text_config"])
        for k, v in cfg.items():
            if k not in ("text_config", "vision_config"):
                merged.setdefault(k, v)
        return merged
    return cfg


def attention_interval(c):
    """full_attention_interval, or the period of layer_types (GGUF stores only the interval)."""
    n = c["num_hidden_layers"]
    if "layer_types" not in c:
        return c.get("full_attention_interval", 4)
    for every in range(1, n + 1):
        want = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
        if want == c["layer_types"]:
            return every
    raise SystemExit(f"layer_types {c['layer_types']} is not periodic: GGUF cannot represent it")


def tile_v_heads(x, axis, hk, r, width):
    """Grouped value-head order (head g·r + j) to tiled order (head j·hk + g) along `axis`, each
    head `width` entries wide."""
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    x = x.reshape(hk, r, width, *rest).swapaxes(0, 1).reshape(hk * r * width, *rest)
    return np.moveaxis(x, 0, axis)


def convert_tensors(kind, c, weights):
    """HF tensors -> [(HF-style name for the name map, array)] after the converter's transforms."""
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    r = hv // hk
    reorder = kind == "qwen3_5" and hk != hv
    out = []
    for name, t in weights.items():
        if name.startswith("model.visual.") or name.startswith("mtp."):
            continue
        name = name.replace("model.language_model.", "model.", 1)
        t = t.astype(np.float32)
        if reorder and ".linear_attn." in name:
            if ".in_proj_qkv." in name:
                qk = 2 * hk * dk
                t = np.concatenate([t[:qk], tile_v_heads(t[qk:], 0, hk, r, dv)])
            elif ".in_proj_z." in name:
                t = tile_v_heads(t, 0, hk, r, dv)
            elif ".in_proj_a." in name or ".in_proj_b." in name or name.endswith((".A_log", ".dt_bias")):
                t = tile_v_heads(t, 0, hk, r, 1)
            elif ".conv1d." in name:
                qk = 2 * hk * dk
                t = np.concatenate([t[:qk], tile_v_heads(t[qk:], 0, hk, r, dv)])
            elif ".out_proj." in name:
                t = tile_v_heads(t, 1, hk, r, dv)
        if name.endswith(".A_log"):
            t = -np.exp(t)
        elif name.endswith(".dt_bias"):
            name = name[: -len(".dt_bias")] + ".dt_proj.bias"
        elif ".conv1d." in name:
            t = t.reshape(t.shape[0], t.shape[-1])
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            t = t + np.float32(1.0)
        if name.endswith("in_proj_qkvz.weight"):
            g = t.reshape(hk, 2 * dk + 2 * r * dv, -1)
            q, k, v, z = np.split(g, [dk, 2 * dk, 2 * dk + r * dv], axis=1)
            cols = t.shape[-1]
            qkv = np.concatenate([q.reshape(-1, cols), k.reshape(-1, cols), v.reshape(-1, cols)])
            base = name[: -len("in_proj_qkvz.weight")]
            out.append((base + "in_proj_qkv.weight", qkv))
            out.append((base + "in_proj_z.weight", z.reshape(-1, cols)))
            continue
        out.append((name, t))
    return out


def gguf_name(tmap, name):
    mapped = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
    if mapped is not None:
        return mapped
    # Dense MLP of a Qwen3-Next (see the module doc): the names of every other architecture.
    parts = name.split(".")
    if parts[:2] == ["model", "layers"] and parts[3] == "mlp":
        kind = {"gate_proj": gguf.MODEL_TENSOR.FFN_GATE, "up_proj": gguf.MODEL_TENSOR.FFN_UP,
                "down_proj": gguf.MODEL_TENSOR.FFN_DOWN}[parts[4]]
        return gguf.TENSOR_NAMES[kind].format(bid=int(parts[2])) + "." + parts[-1]
    raise SystemExit(f"no GGUF name for {name}")


def synthetic_vocab(n):
    """gpt2-style byte-level BPE vocabulary of n tokens: 256 byte tokens, then two-letter merges."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    byte_char = dict(zip(bs, (chr(c) for c in cs)))
    tokens = [byte_char[b] for b in range(256)]
    letters = "abcdefghijklmnopqrstuvwxyz"
    merges = []
    for i in range(n - 256):
        a, b = letters[(i // 26) % 26], letters[i % 26]
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    assert len(set(tokens)) == n
    return tokens, merges


def write(kind, golden_dir):
    d = os.path.join(golden_dir, kind)
    with open(os.path.join(d, "config.json")) as f:
        c = text_config(json.load(f))
    weights = read_safetensors(os.path.join(d, "model.safetensors"))
    arch = ARCH[kind]
    n_layer = c["num_hidden_layers"]
    outtype = OUTTYPE[kind]
    w = gguf.GGUFWriter(os.path.join(d, "model.gguf"), gguf.MODEL_ARCH_NAMES[arch])

    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    rope = c.get("rope_parameters") or {}
    partial = c.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.25))
    w.add_name(f"draftlens random {kind}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if outtype == gguf.GGMLQuantizationType.BF16 else gguf.LlamaFileType.MOSTLY_F16)
    w.add_block_count(n_layer)
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(c.get("rope_theta", rope.get("rope_theta")))
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if kind == "qwen3_next":
        w.add_expert_count(c.get("num_experts", 0))
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
    w.add_ssm_state_size(c["linear_key_head_dim"])
    w.add_ssm_group_count(c["linear_num_key_heads"])
    w.add_ssm_time_step_rank(c["linear_num_value_heads"])
    w.add_ssm_inner_size(c["linear_value_head_dim"] * c["linear_num_value_heads"])
    w.add_full_attention_interval(attention_interval(c))
    w.add_rope_dimension_count(int(head_dim * partial))
    if kind == "qwen3_5":
        w.add_rope_dimension_sections(list(rope.get("mrope_section", [11, 11, 10])) + [0])

    tokens, merges = synthetic_vocab(c["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    w.add_token_merges(merges)
    w.add_add_bos_token(False)

    tmap = gguf.get_tensor_name_map(arch, n_layer)
    n_inexact, max_err = 0, 0.0
    for name, t in sorted(convert_tensors(kind, c, weights)):
        gname = gguf_name(tmap, name)
        keep_f32 = t.ndim <= 1 or gname.endswith("_norm.weight") or ".ssm_conv1d." in gname
        if keep_f32:
            w.add_tensor(gname, np.ascontiguousarray(t, dtype=np.float32))
        elif outtype == gguf.GGMLQuantizationType.F16:
            h = t.astype(np.float16)
            err = np.abs(h.astype(np.float32) - t)
            n_inexact += int(np.count_nonzero(err))
            max_err = max(max_err, float(err.max()))
            w.add_tensor(gname, h)
        else:
            q = gguf.quants.quantize(t, outtype)
            back = gguf.quants.dequantize(q, outtype).reshape(t.shape)
            n_inexact += int(np.count_nonzero(back != t))
            w.add_tensor(gname, q, raw_dtype=outtype)
    if n_inexact and outtype != gguf.GGMLQuantizationType.F16:
        raise SystemExit(f"{kind}: {n_inexact} weights do not survive the {outtype.name} conversion")
    # bf16 values below f16's normal range (2^-14) lose bits in f16: expected, and reported.
    print(f"{kind}: {n_inexact} weights changed by the {outtype.name} conversion (max |error| {max_err:.1e})")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    path = os.path.join(d, "model.gguf")
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    print(f"{path}: {os.path.getsize(path)} bytes, sha256 {sha}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", default="tests/fixtures/golden", help="folder with qwen3_5/ and qwen3_next/")
    a = ap.parse_args()
    for kind in ("qwen3_5", "qwen3_next"):
        write(kind, a.golden)


if __name__ == "__main__":
    main()
