#!/usr/bin/env python3
"""The assertions of scripts/llamacpp-e2e.sh over what it wrote in WORK (docs/traces.md §7).

    check.py --work data/llamacpp-e2e --tau-tolerance 0.10 --round-tolerance 0.05

Reads import-{good,bad}-{llamacpp,jsonl}.json (`trace import --json`), diff-{good,bad}.json
(`trace diff --json`) and live.json (`live --json`); prints the numbers and exits 1 naming each
check that fails. Standard library only.
"""

import argparse
import json
import os
import sys


def load(work, name):
    with open(os.path.join(work, name)) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--tau-tolerance", type=float, required=True, help="relative, against live τ")
    ap.add_argument("--round-tolerance", type=float, required=True,
                    help="the share of engine rounds where the reference commits another number of tokens")
    a = ap.parse_args()

    failures = []

    def check(ok, what):
        print(("ok    " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    live = load(a.work, "live.json")
    live_tau = sum(r["new_tokens"] - 1 for r in live) / sum(r["rounds"] for r in live)
    print(f"live (draftlens, reference drafter {len(live)} prompts): τ pooled {live_tau:.4f}")

    tau = {}
    for kind in ["good", "bad"]:
        imp = {fmt: load(a.work, f"import-{kind}-{fmt}.json")["report"] for fmt in ["llamacpp", "jsonl"]}
        lc, nj = imp["llamacpp"], imp["jsonl"]
        tau[kind] = lc["tau_pooled"]
        print(f"llama.cpp {kind}: τ pooled {lc['tau_pooled']:.4f} (macro {lc['tau_macro']:.4f}) over "
              f"{lc['rounds']} rounds, {lc['tokens']} tokens, {lc['requests']} requests, block {lc['block_size']}; "
              f"corrections {[c.get('name', c) if isinstance(c, dict) else c for c in lc['corrections']]}")
        check(lc["prompt_mismatches"] == 0 and nj["prompt_mismatches"] == 0,
              f"{kind}: the server's prompts have draftlens's token counts (chat template)")
        check(lc["rounds"] == nj["rounds"] and lc["tokens"] == nj["tokens"]
              and abs(lc["tau_pooled"] - nj["tau_pooled"]) < 1e-12,
              f"{kind}: --format llamacpp (totals) and --format jsonl (round log) give the same rounds, tokens, τ")

        d = load(a.work, f"diff-{kind}.json")["summary"]
        loss = d["tokens_lost_per_round"]
        iv = loss.get("interval") or {}
        print(f"trace diff {kind}: engine τ {d['engine_tau_pooled']:.4f}, reference τ {d['reference_tau_pooled']:.4f}, "
              f"tokens lost per round {loss['value']:.4f} [{iv.get('lo', float('nan')):.4f}, {iv.get('hi', float('nan')):.4f}] "
              f"({iv.get('method', '-')}), rounds fewer {d['rounds_fewer']} / more {d['rounds_more']} of {d['rounds']}, "
              f"departures {d['departures']} in {d['prompts_departing']} prompts")
        differing = (d["rounds_fewer"] + d["rounds_more"]) / d["rounds"]
        tau_iv = (d["tau_delta"] or {}).get("interval") or {}
        print(f"trace diff {kind}: rounds the reference commits otherwise at the engine's anchor: {differing:.4f}; "
              f"τ reference − engine {d['tau_delta']['value']:+.4f} [{tau_iv.get('lo', float('nan')):+.4f}, "
              f"{tau_iv.get('hi', float('nan')):+.4f}]")
        if kind == "good":
            check(abs(lc["tau_pooled"] - live_tau) <= a.tau_tolerance * live_tau,
                  f"good: |τ llama.cpp − τ live| = {abs(lc['tau_pooled'] - live_tau):.4f} <= "
                  f"{a.tau_tolerance} × τ live = {a.tau_tolerance * live_tau:.4f}")
            check(differing <= a.round_tolerance,
                  f"good: rounds that differ from the reference {differing:.4f} <= {a.round_tolerance}")
            check(tau_iv.get("lo", 0) <= 0 <= tau_iv.get("hi", 0),
                  "good: the 95% interval of τ reference − engine holds 0")
        else:
            check(differing > a.round_tolerance,
                  f"bad: rounds that differ from the reference {differing:.4f} > {a.round_tolerance}")
            check(tau_iv.get("lo", 0) > 0,
                  "bad: the 95% interval of τ reference − engine lies above 0 (the engine loses τ)")
    check(tau["bad"] < tau["good"], "the off-by-one conversion has the lower τ in llama.cpp")

    if failures:
        sys.exit(f"llamacpp-e2e: {len(failures)} check(s) failed: " + "; ".join(failures))


if __name__ == "__main__":
    main()
