#!/usr/bin/env bash
# Session 20, call 3: the bf16 floor for call 1's MoE parity gap. transformers' own bf16 forward
# against its f32 forward, per layer (bf16_gap.py), on the Qwen3-30B-A3B-shaped random target and,
# for scale, on a dense Qwen3 of the same width and depth; then draftlens parity cpu,cuda on that
# dense model. If transformers' bf16 is as far from f32 on the MoE model as draftlens's CUDA is from
# its f32 CPU reference, the gap is bf16 itself and the dense tolerance does not fit this model.
#   B=target-carry/s20 bash docs/bench-logs/s20-2026-12-06/scripts/call3.sh
set -u
B=${B:-target-carry/s20}
source tools/bench/device_env.sh
export DRAFTLENS_DATA=/tmp/data DRAFTLENS_CACHE=/tmp/cache
python3 tools/bench/make_random_target.py --out /tmp/moe --arch qwen3-30b-a3b-8l --drafters 0 > $O/make-moe.log 2>&1
python3 docs/bench-logs/s20-2026-12-06/scripts/bf16_gap.py /tmp/moe 4 2>&1 | grep -v Warning | tee $O/bf16-gap-moe.txt
python3 - <<'PY' > $O/make-dense.log 2>&1
# A dense Qwen3 as wide and deep as the MoE target, its MLP as wide as the 8 active experts (8 x 768).
import json, os, shutil, torch
from transformers import AutoConfig, AutoModelForCausalLM
cfg = AutoConfig.for_model(model_type="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
    num_hidden_layers=8, num_attention_heads=32, num_key_value_heads=4, head_dim=128, rms_norm_eps=1e-6,
    rope_theta=1e6, max_position_embeddings=40960, tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645)
torch.manual_seed(0)
with torch.device("cuda"):
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
m.save_pretrained("/tmp/dense")
for f in os.listdir("data/tokenizer/qwen3-hf"):
    shutil.copy(os.path.join("data/tokenizer/qwen3-hf", f), "/tmp/dense")
PY
python3 docs/bench-logs/s20-2026-12-06/scripts/bf16_gap.py /tmp/dense 4 2>&1 | grep -v Warning | tee $O/bf16-gap-dense.txt
timeout 200 $B/draftlens parity --target /tmp/dense --backends cpu,cuda --limit 4 --max-new-tokens 32 > $O/parity-dense.out 2>&1
echo "== dense parity rc=$?"; cat $O/parity-dense.out
tar czf $OUT/s20-call3.tgz -C $O .
