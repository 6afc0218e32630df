"""The GPU's measured copy rate, the decode benchmarks' denominator (docs/benchmarks-cuda.md): torch
`copy_` of 2 GiB, read + write, the mean of 20 copies after 3 warm-ups.

usage (GPU machine): python3 tools/bench/copy_rate.py
"""
import time

import torch

x = torch.empty(2**31, dtype=torch.uint8, device="cuda")
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(20):
    y.copy_(x)
torch.cuda.synchronize()
dt = (time.perf_counter() - t) / 20
print(f"copy rate: {2 * x.numel() / dt / 1e9:.0f} GB/s (read + write of 2 GiB, torch copy_)")
