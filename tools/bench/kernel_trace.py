#!/usr/bin/env python3
"""Kernel sequences from a trace made by tools/bench/kernel_trace.sh.

    python3 tools/bench/kernel_trace.py TRACE.txt around NAME [--nth N] [--before 14] [--after 30]
    python3 tools/bench/kernel_trace.py TRACE.txt durations NAME
    python3 tools/bench/kernel_trace.py TRACE.txt gaps - [--top 25] [--min-us 50]
    python3 tools/bench/kernel_trace.py TRACE.txt kernels - [--top 25]

`around` prints the kernels (start offset, duration, gap since the previous one ended, name)
around the N-th launch of the first kernel whose name starts with NAME: one decode step's layer,
say. `durations` prints every launch of NAME in order, 20 per line, in microseconds: how a
kernel's time moves through a benchmark's phases (steps at batch 1..64, greedy batched, alone).
`gaps` finds where the GPU sat idle: the total busy and idle time between the first and the last
record, idle time by gap size, and the largest gaps with the records on either side (a host-side
wait shows as a long gap after a device-to-host copy). `kernels` sums the GPU time by record name
(cuBLAS's GEMMs folded into `gemm`): where the busy time goes.
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
    ap.add_argument("what", choices=["around", "durations", "gaps", "kernels"])
    ap.add_argument("name")
    ap.add_argument("--nth", type=int, default=0)
    ap.add_argument("--before", type=int, default=14)
    ap.add_argument("--after", type=int, default=30)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--min-us", type=float, default=50.0)
    a = ap.parse_args()
    k = read(a.trace)
    if a.what == "gaps":
        gaps(k, a.top, a.min_us)
        return
    if a.what == "kernels":
        kernels(k, a.top)
        return
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


def short(name):
    """A record's name with cuBLAS's kernel names folded (nvjet_*/cutlass*/sm90_* -> gemm)."""
    if name.startswith(("nvjet", "cutlass", "sm90_", "sm80_", "ampere_")) or "gemm" in name.lower():
        return "gemm"
    if "splitKreduce" in name:
        return "splitK-reduce"
    return name[:40]


def kernels(k, top):
    """GPU time by record name (GEMMs folded), largest first, with the share of the busy sum."""
    tot = {}
    for s, e, n in k:
        t, c = tot.get(short(n), (0, 0))
        tot[short(n)] = (t + e - s, c + 1)
    busy = sum(t for t, _ in tot.values())
    print(f"summed record time {busy / 1e9:.3f} s (overlapping records counted twice)")
    for n, (t, c) in sorted(tot.items(), key=lambda x: -x[1][0])[:top]:
        print(f"  {t / 1e9:8.3f} s {100 * t / busy:5.1f} % {c:8d} {t / c / 1e3:10.1f} us  {n}")


def gaps(k, top, min_us):
    """Idle time between records (overlapping records merged), by size; the largest gaps; the
    idle time summed by the pair of records around it (which transitions hold the idle)."""
    if not k:
        raise SystemExit("no records")
    busy, idle, end, found, prev = 0, 0, k[0][0], [], k[0][2]
    found_all = []
    bins = {10: 0, 100: 0, 1000: 0, 10000: 0, float("inf"): 0}
    pairs = {}
    for i, (s, e, n) in enumerate(k):
        if s > end:
            g = s - end
            idle += g
            for b in bins:
                if g / 1e3 < b:
                    bins[b] += g
                    break
            if g / 1e3 >= min_us:
                found.append((g, i, prev))
            found_all.append((g, i, prev))
            key = (short(prev), short(n))
            t, c = pairs.get(key, (0, 0))
            pairs[key] = (t + g, c + 1)
        busy += max(0, e - max(s, end))
        if e >= end:
            end, prev = e, n
    span = end - k[0][0]
    print(f"span {span / 1e9:.3f} s, busy {busy / 1e9:.3f} s ({100 * busy / span:.1f} %), idle {idle / 1e9:.3f} s")
    lo = 0
    for b, t in bins.items():
        print(f"  gaps {lo:>6} .. {b:>6} us: {t / 1e9:8.3f} s")
        lo = b
    print(f"idle by transition (top {top}): seconds, count, mean us, after -> before")
    for (a, b), (t, c) in sorted(pairs.items(), key=lambda x: -x[1][0])[:top]:
        print(f"  {t / 1e9:8.3f} s {c:8d} {t / c / 1e3:10.1f}  {a} -> {b}")
    # The worst transitions in detail: what ran next (the next three records name the code path
    # the host was about to start) and how the gaps spread.
    for (a, b), _ in sorted(pairs.items(), key=lambda x: -x[1][0])[:3]:
        sig = {}
        sizes = []
        for g, i, p in found_all:
            if (short(p), short(k[i][2])) != (a, b):
                continue
            sizes.append(g)
            key = " | ".join(short(x[2]) for x in k[i:i + 3])
            t, c = sig.get(key, (0, 0))
            sig[key] = (t + g, c + 1)
        if not sizes:
            continue
        sizes.sort()
        q = lambda f: sizes[min(len(sizes) - 1, int(f * len(sizes)))] / 1e3
        print(f"{a} -> {b}: {len(sizes)} gaps, us p10 {q(0.1):.0f} p50 {q(0.5):.0f} p90 {q(0.9):.0f} max {q(1.0):.0f}; by what ran next:")
        for key, (t, c) in sorted(sig.items(), key=lambda x: -x[1][0])[:6]:
            print(f"  {t / 1e9:8.3f} s {c:6d} {t / c / 1e3:9.1f} us  {key}")
    print(f"largest gaps (>= {min_us} us):")
    for g, i, p in sorted(found, reverse=True)[:top]:
        print(f"  {g / 1e3:10.1f} us at {(k[i][0] - k[0][0]) / 1e9:8.3f} s  after {p[:50]}  before {k[i][2][:50]}")

if __name__ == "__main__":
    main()
