#!/usr/bin/env python3
"""Kernel sequences from a trace made by tools/bench/kernel_trace.sh.

    python3 tools/bench/kernel_trace.py TRACE.txt around NAME [--nth N] [--before 14] [--after 30]
    python3 tools/bench/kernel_trace.py TRACE.txt durations NAME

`around` prints the kernels (start offset, duration, gap since the previous one ended, name)
around the N-th launch of the first kernel whose name starts with NAME: one decode step's layer,
say. `durations` prints every launch of NAME in order, 20 per line, in microseconds: how a
kernel's time moves through a benchmark's phases (steps at batch 1..64, greedy batched, alone).
"""
import argparse
import re

LINE = re.compile(r'^(CONCURRENT_KERNEL|MEMCPY|MEMSET)(?: "(\w+)")? \[ (\d+), (\d+) \](?: duration \d+, "([^"]+)")?')


def read(path):
    out = []
    for line in open(path):
        m = LINE.match(line)
        if not m:
            continue
        kind, copy, start, end, name = m.groups()
        if kind != "CONCURRENT_KERNEL":
            name = kind + (copy or "")
        out.append((int(start), int(end), name or "?"))
    return sorted(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("what", choices=["around", "durations"])
    ap.add_argument("name")
    ap.add_argument("--nth", type=int, default=0)
    ap.add_argument("--before", type=int, default=14)
    ap.add_argument("--after", type=int, default=30)
    a = ap.parse_args()
    k = read(a.trace)
    hits = [i for i, (_, _, n) in enumerate(k) if n.startswith(a.name)]
    if not hits:
        raise SystemExit(f"no launch of {a.name}")
    if a.what == "durations":
        d = [(k[i][1] - k[i][0]) / 1e3 for i in hits]
        for s in range(0, len(d), 20):
            print(" ".join(f"{x:.0f}" for x in d[s:s + 20]))
        return
    i0 = hits[min(a.nth, len(hits) - 1)]
    prev = k[max(i0 - a.before, 0)][0]
    for s, e, n in k[max(i0 - a.before, 0):i0 + a.after]:
        print(f"{(s - k[i0][0]) / 1e3:9.1f} us  {(e - s) / 1e3:7.1f} us  gap {(s - prev) / 1e3:6.1f}  {n[:80]}")
        prev = e


if __name__ == "__main__":
    main()
