"""A Qwen3.5-MoE checkpoint folder whose weights are a hole in a sparse file: config.json as
published (the composite vision-language config) and a model.safetensors whose header lists every
tensor of the text model under `model.language_model.*` in BF16, and whose data (227 GiB for
Qwen3.5-122B-A10B) take no disk. draftlens opens it from the headers; a command that would read a
weight reads zeros. For the memory refusal on a real GPU (tools/bench/memory_device.sh, docs/loading.md
§5); the CPU test of the same layout is crates/engine/tests/memory_estimate.rs.

usage: python3 tools/bench/sparse_checkpoint.py OUT [--model 122b|35b] [--tokenizer DIR]
"""

import argparse
import json
import os
import shutil

MODELS = {  # hidden, layers, attention heads, GDN value heads, expert width (the published configs)
    "122b": (3072, 48, 32, 64, 1024),
    "35b": (2048, 40, 16, 32, 512),
}


def tensors(hidden, layers, heads, v_heads, width):
    vocab, kv, hd, experts, dk = 248320, 2, 256, 256, 128
    conv, value = 2 * 16 * dk + v_heads * dk, v_heads * dk
    t = {"embed_tokens.weight": [vocab, hidden], "norm.weight": [hidden]}
    for l in range(layers):
        p = f"layers.{l}."
        t[p + "input_layernorm.weight"] = [hidden]
        t[p + "post_attention_layernorm.weight"] = [hidden]
        if (l + 1) % 4 == 0:  # gated attention: each head's query and gate rows in q_proj
            a = p + "self_attn."
            t[a + "q_proj.weight"] = [2 * heads * hd, hidden]
            t[a + "k_proj.weight"] = [kv * hd, hidden]
            t[a + "v_proj.weight"] = [kv * hd, hidden]
            t[a + "o_proj.weight"] = [hidden, heads * hd]
            t[a + "q_norm.weight"] = [hd]
            t[a + "k_norm.weight"] = [hd]
        else:
            g = p + "linear_attn."
            t[g + "in_proj_qkv.weight"] = [conv, hidden]
            t[g + "in_proj_z.weight"] = [value, hidden]
            t[g + "in_proj_b.weight"] = [v_heads, hidden]
            t[g + "in_proj_a.weight"] = [v_heads, hidden]
            t[g + "conv1d.weight"] = [conv, 1, 4]
            t[g + "dt_bias"] = [v_heads]
            t[g + "A_log"] = [v_heads]
            t[g + "norm.weight"] = [dk]
            t[g + "out_proj.weight"] = [hidden, value]
        m = p + "mlp."
        t[m + "gate.weight"] = [experts, hidden]
        for e in ["experts." + str(i) for i in range(experts)] + ["shared_expert"]:
            t[f"{m}{e}.gate_proj.weight"] = [width, hidden]
            t[f"{m}{e}.up_proj.weight"] = [width, hidden]
            t[f"{m}{e}.down_proj.weight"] = [hidden, width]
        t[m + "shared_expert_gate.weight"] = [1, hidden]
    out = {"model.language_model." + k: v for k, v in t.items()}
    out["lm_head.weight"] = [vocab, hidden]
    return out


def config(hidden, layers, heads, v_heads, width):
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": hidden,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": 2,
            "head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_num_key_heads": 16,
            "linear_num_value_heads": v_heads, "moe_intermediate_size": width,
            "shared_expert_intermediate_size": width, "num_experts": 256, "num_experts_per_tok": 8,
            "full_attention_interval": 4, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                                "partial_rotary_factor": 0.25},
        },
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="122b", choices=sorted(MODELS))
    ap.add_argument("--tokenizer", default="data/tokenizer/qwen3-hf")
    a = ap.parse_args()
    dims = MODELS[a.model]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config(*dims), f)
    header, offset = {}, 0
    for name, shape in sorted(tensors(*dims).items()):
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = os.path.join(a.out, "model.safetensors")
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        f.truncate(8 + len(text) + offset)  # the data: a hole
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        src = os.path.join(a.tokenizer, name)
        if os.path.exists(src):
            shutil.copy(src, a.out)
    print(f"{a.out}: {len(header)} tensors, {offset / 2**30:.2f} GiB of BF16 data (sparse)")


if __name__ == "__main__":
    main()
