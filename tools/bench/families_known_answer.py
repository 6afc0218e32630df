#!/usr/bin/env python3
"""Run the known-answer cases of tools/golden/make_successor_fixtures.py through a draftlens binary
on one backend, and print PASS or FAIL per case with its numbers (docs/live.md §4).

Per case (each family's exact drafter, then its defect drafter), the commands of
crates/cli/tests/cli_families_known_answer.rs, with `--backend BACKEND`:
  run                                   replayed τ (tau_replayed_macro) = the manifest's τ
  run --temperature 1 --sampling-top-k 8  expected τ (tau_sampled_replayed_macro) = the same, within
                                        1e-6 (not DFlash2: refused, docs/dflash2.md §4)
  live (T = 0), live --temperature 1, live --temperature 0.7 --top-k 8 --top-p 0.9
                                        per prompt: rounds = the manifest's, τ = 40 / rounds,
                                        41 new tokens, text = the successor words; at T = 0
                                        lossless (a divergence is printed with its position
                                        and logit margin)
Every command's stdout and stderr are kept in LOGS/<case>.<step>.json / .err.

usage: python3 tools/bench/families_known_answer.py --draftlens BIN --fixtures DIR --backend cuda|cpu
           --logs DIR [--timeout 300]
Exit status 1 when a case fails.
"""
import argparse
import json
import os
import subprocess
import sys

LIVE = [("live-t0", ["--temperature", "0"]), ("live-t1", ["--temperature", "1"]),
        ("live-t0.7", ["--temperature", "0.7", "--top-k", "8", "--top-p", "0.9"])]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draftlens", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--logs", required=True)
    ap.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args()
    os.makedirs(args.logs, exist_ok=True)
    fx = args.fixtures
    manifest = json.load(open(os.path.join(fx, "manifest.json")))
    n_new = manifest["max_new_tokens"]
    prompts = {p["id"]: p["continuation"] for p in manifest["prompts"]}

    def draftlens(case, step, cmd, extra):
        drafter = case["drafter"]
        if not drafter.startswith("target:"):
            drafter = os.path.join(fx, drafter)
        argv = [args.draftlens, "--cache-dir", os.path.join(args.logs, "cache"), "--json", cmd,
                "--backend", args.backend, "--target", os.path.join(fx, case["target"]), "--drafter", drafter,
                "--prompts", os.path.join(fx, "prompts.jsonl"), "--max-new-tokens", str(n_new)] + extra
        base = os.path.join(args.logs, f"{case['case']}.{step}")
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
            out, err, rc = p.stdout, p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out, err, rc = e.stdout or "", (e.stderr or "") + f"\ntimed out after {args.timeout} s", 124
            out, err = (x.decode() if isinstance(x, bytes) else x for x in (out, err))
        open(base + ".json", "w").write(out)
        open(base + ".err", "w").write(" ".join(argv) + "\n" + err)
        if rc != 0:
            return None, f"{step}: exit {rc}: {err.strip().splitlines()[-1] if err.strip() else ''}"
        try:
            return json.loads(out), None
        except json.JSONDecodeError as e:
            return None, f"{step}: stdout is not JSON ({e})"

    failed = 0
    for case in manifest["cases"]:
        problems, notes = [], []
        want = case["tau_macro"]
        runs = [("run", [], "tau_replayed_macro", 1e-9)]
        if case["family"] != "dflash2":
            runs.append(("run-t1", ["--temperature", "1", "--sampling-top-k", "8"], "tau_sampled_replayed_macro", 1e-6))
        for step, extra, metric, tol in runs:
            db = ["--db", os.path.join(args.logs, f"{case['case']}.sqlite")]
            doc, err = draftlens(case, step, "run", db + extra)
            if err:
                problems.append(err)
                continue
            got = doc[0]["metrics"]["native"][metric]["value"]
            notes.append(f"{step} τ {got:.4f}")
            if got is None or abs(got - want) > tol:
                problems.append(f"{step}: {metric} {got}, expected {want}")
        if case["family"] == "eagle3":
            # The dynamic tree (docs/eagle3.md): TOPK 1 is the chain, so its τ is the chain's
            # exactly; a wider tree holds the chain as its first path, so its τ is at least the
            # chain's and at most B (the exact drafter: B).
            b = case["block"]
            for step, shape, lo in [("tree-1", f"1,{b}", want), ("tree-4", f"4,{3 * b}", want)]:
                db = ["--db", os.path.join(args.logs, f"{case['case']}.sqlite")]
                doc, err = draftlens(case, step, "run", db + ["--eagle3-tree", shape])
                if err:
                    problems.append(err)
                    continue
                native = doc[0]["metrics"]["native"]
                got = native["eagle3_tree_tau_replayed_macro"]["value"]
                chain = native["tau_replayed_macro"]["value"]
                notes.append(f"{step} τ {got:.4f}")
                exact = step == "tree-1" or want == b
                if got is None or (abs(got - lo) > 1e-9 if exact else not lo - 1e-9 <= got <= b + 1e-9):
                    problems.append(f"{step} ({shape}): tree τ {got}, expected {'' if exact else '≥ '}{lo}")
                if chain is None or abs(chain - want) > 1e-9:
                    problems.append(f"{step}: the chain's τ beside the tree {chain}, expected {want}")
        for step, extra in LIVE:
            rows, err = draftlens(case, step, "live", extra)
            if err:
                problems.append(err)
                continue
            taus, rounds = [], []
            for r in rows:
                exp = case["prompts"][r["id"]]
                taus.append(r["tau"])
                rounds.append(r["rounds"])
                where = f"{step} {r['id']}"
                if r["rounds"] != exp["rounds"] or abs(r["tau"] - (n_new - 1) / exp["rounds"]) > 1e-9:
                    problems.append(f"{where}: τ {r['tau']} in {r['rounds']} rounds, expected {exp['tau']} in {exp['rounds']}")
                if r["new_tokens"] != n_new:
                    problems.append(f"{where}: {r['new_tokens']} new tokens, expected {n_new}")
                if r["text"] != prompts[r["id"]]:
                    problems.append(f"{where}: output {r['text'][:60]!r}…, expected {prompts[r['id']][:60]!r}…")
                if step == "live-t0" and r["lossless"] is not True:
                    problems.append(f"{where}: diverged from plain greedy decoding: {json.dumps(r.get('divergence'))}")
            if len(rows) != len(prompts):
                problems.append(f"{step}: {len(rows)} prompts, expected {len(prompts)}")
            macro = sum(taus) / len(taus) if taus else float("nan")
            notes.append(f"{step} τ {macro:.4f} (rounds {' '.join(map(str, rounds))})")
        verdict = "FAIL" if problems else "PASS"
        failed += bool(problems)
        print(f"{verdict} {case['case']:15} B {case['block']} expected τ {want:.4f}: " + "; ".join(notes), flush=True)
        for p in problems:
            print(f"     {p}", flush=True)
    total = len(manifest["cases"])
    print(f"{total - failed} of {total} cases passed on --backend {args.backend}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
