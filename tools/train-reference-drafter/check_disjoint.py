#!/usr/bin/env python3
"""Check that training prompt sets are disjoint from draftlens's built-in evaluation sets.

For every training file (JSONL, .gz allowed; rows with `messages` or `prompt`) against every
evaluation set (crates/engine/builtin-prompts/*.jsonl: humaneval, mtbench, gsm8k, mmath), counts:

  exact       training prompts whose text equals an evaluation prompt (whitespace-normalised)
  ngram       training prompts that share at least one word N-gram (default 13, the usual
              contamination test) with an evaluation prompt or its reference completion
  eval_hit    evaluation items that some training prompt shares an N-gram with
  defs        HumanEval only, informational: training prompts defining a function of the same name
              as one defined in a HumanEval prompt (`def add(`), with the names. Generic names
              (`add`, `encode`, `compare`) occur in any library: read the list, it is not a verdict.

Words are lowercase runs of letters and digits, so punctuation, indentation and line breaks do
not hide an overlap. Exits 1 when an exact or N-gram count is non-zero (0: disjoint).

    python3 tools/train-reference-drafter/check_disjoint.py data/device/train_prompts.jsonl \
        data/device/train_prompts_v2.jsonl.gz [--n 13] [--json counts.json]
"""

import argparse
import glob
import gzip
import json
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
WORD = re.compile(r"[a-z0-9]+")
DEF = re.compile(r"\bdef\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def words(text):
    return WORD.findall(text.lower())


def ngrams(text, n):
    w = words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def normalise(text):
    return " ".join(text.split())


def prompt_text(row):
    """The user-visible text of a prompt row: every message's content, or `prompt`."""
    if "messages" in row:
        return "\n".join(m.get("content", "") for m in row["messages"] if isinstance(m.get("content"), str))
    return row.get("prompt", "")


def read_rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"{path}:{n}: not JSON: {e}")


class EvalIndex:
    """The N-grams of every evaluation set (prompts and reference completions), with the items
    each N-gram comes from."""

    def __init__(self, files, n):
        self.n = n
        self.sets = {}
        for path in files:
            name = os.path.basename(path).split(".")[0]
            grams, exact, defs, ids = {}, set(), set(), []
            for i, row in enumerate(read_rows(path)):
                text = prompt_text(row)
                ids.append(row.get("id", f"{name}:{i}"))
                exact.add(normalise(text))
                for g in ngrams(text + "\n" + (row.get("completion") or ""), n):
                    grams.setdefault(g, set()).add(i)
                if name == "humaneval":
                    defs |= set(DEF.findall(text))
            self.sets[name] = {"grams": grams, "exact": exact, "defs": defs, "items": len(ids)}

    def overlaps(self, text):
        """{set name: (exact, eval items sharing an N-gram, HumanEval names defined)} for one prompt."""
        g = ngrams(text, self.n)
        t = normalise(text)
        names = set(DEF.findall(text))
        out = {}
        for name, s in self.sets.items():
            hit = set()
            for x in g:
                hit |= s["grams"].get(x, set())
            out[name] = (t in s["exact"], hit, names & s["defs"])
        return out


def default_eval_files():
    return sorted(glob.glob(os.path.join(ROOT, "crates", "engine", "builtin-prompts", "*.jsonl")))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("train", nargs="+", help="training prompt files (JSONL or JSONL.gz)")
    ap.add_argument("--eval-files", nargs="*", default=None, help="evaluation sets (default: crates/engine/builtin-prompts/*.jsonl)")
    ap.add_argument("--n", type=int, default=13, help="N-gram length in words")
    ap.add_argument("--json", default=None, help="also write the counts here")
    ap.add_argument("--examples", type=int, default=3, help="print up to this many overlapping training prompt ids per set")
    a = ap.parse_args()
    files = a.eval_files or default_eval_files()
    if not files:
        raise SystemExit("check_disjoint.py: no evaluation sets found (crates/engine/builtin-prompts/*.jsonl)")
    idx = EvalIndex(files, a.n)
    report = {"n": a.n, "eval_sets": {k: v["items"] for k, v in idx.sets.items()}, "train": {}}
    bad = 0
    for path in a.train:
        counts = {name: {"exact": 0, "ngram": 0, "eval_hit": set(), "defs": 0, "def_names": set(), "examples": []} for name in idx.sets}
        total = 0
        for row in read_rows(path):
            total += 1
            for name, (exact, hit, defs) in idx.overlaps(prompt_text(row)).items():
                c = counts[name]
                c["exact"] += exact
                c["ngram"] += bool(hit)
                c["eval_hit"] |= hit
                c["defs"] += bool(defs)
                c["def_names"] |= defs
                if (exact or hit) and len(c["examples"]) < a.examples:
                    c["examples"].append(row.get("id"))
        for c in counts.values():
            c["eval_hit"] = len(c["eval_hit"])
            c["def_names"] = sorted(c["def_names"])
            bad += c["exact"] + c["ngram"]
        report["train"][path] = {"prompts": total, "against": counts}
        print(f"{path}: {total} training prompts")
        for name, c in counts.items():
            extra = f"; informational: {c['defs']} define a function named as in a HumanEval prompt {c['def_names']}" if name == "humaneval" else ""
            ex = f"  e.g. {c['examples']}" if c["examples"] else ""
            print(f"  vs {name} ({idx.sets[name]['items']} items): exact {c['exact']}, sharing a {a.n}-gram {c['ngram']} "
                  f"(touching {c['eval_hit']} {name} items){extra}{ex}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    print("disjoint" if bad == 0 else f"NOT disjoint: {bad} overlapping training prompts (counted per evaluation set)")
    sys.exit(0 if bad == 0 else 1)


if __name__ == "__main__":
    main()
