#!/usr/bin/env python3
"""Digest of the runs in a draftlens database, for "behaviour unchanged" checks across builds
(docs/architecture-changes.md): two databases made by two binaries from the same inputs must give
the same digest. Everything a run computed is included (records BLOBs, prompts and their token
ids and texts, metric rows with values to the last bit, the evaluation identity, the run's
settings); what differs by machine or moment is left out (ids, uids, times, timings, paths).

    python3 tools/arch/run_digest.py A.sqlite [B.sqlite]   # with B: compare, name the first difference
"""
import hashlib
import json
import sqlite3
import struct
import sys

RUN_SKIP = {"id", "uid", "created_at", "finished_at", "timings_json", "target_path", "drafter_path"}


def canon(v):
    if isinstance(v, float):
        return "f64:" + struct.pack("<d", v).hex()
    if isinstance(v, bytes):
        return "blob:" + hashlib.sha256(v).hexdigest()
    return v


def strip_paths(config_json):
    """config_json minus values that are file-system paths (they name the data folder)."""
    def walk(x):
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items() if not (isinstance(v, str) and v.startswith("/"))}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x
    return json.dumps(walk(json.loads(config_json)), sort_keys=True)


def items(db):
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    runs = con.execute("SELECT * FROM run ORDER BY id").fetchall()
    for n, run in enumerate(runs):
        rid = run["id"]
        row = {k: canon(run[k]) for k in run.keys() if k not in RUN_SKIP}
        row["config_json"] = strip_paths(run["config_json"])
        yield (f"run#{n}", json.dumps(row, sort_keys=True))
        for t, order in [("run_prompt", "idx"), ("record_chunk", "seq"), ("metric", "source, name, scope"),
                         ("run_eval", "run_id"), ("plugin_failure", "id")]:
            for r in con.execute(f"SELECT * FROM {t} WHERE run_id = ? ORDER BY {order}", (rid,)):
                d = {k: canon(r[k]) for k in r.keys() if k not in ("run_id", "id", "at", "created_at")}
                key = f"run#{n}.{t}." + ".".join(str(d.get(k.strip())) for k in order.split(","))
                yield (key, json.dumps(d, sort_keys=True))


def main():
    a = list(items(sys.argv[1]))
    digest = hashlib.sha256("\n".join(k + "=" + v for k, v in a).encode()).hexdigest()
    print(f"{sys.argv[1]}: {len({k.split('.')[0] for k, _ in a})} runs, {len(a)} rows, digest {digest}")
    if len(sys.argv) > 2:
        b = list(items(sys.argv[2]))
        for (ka, va), (kb, vb) in zip(a, b):
            if (ka, va) != (kb, vb):
                print("first difference:", ka, "\n  A:", va[:400], "\n  B:", vb[:400])
                sys.exit(1)
        if len(a) != len(b):
            print(f"row counts differ: {len(a)} vs {len(b)}")
            sys.exit(1)
        print(f"{sys.argv[2]}: identical ({len(b)} rows)")


if __name__ == "__main__":
    main()
