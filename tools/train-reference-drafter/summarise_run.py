#!/usr/bin/env python3
"""Stage times and the replayed-tau table of a device run, into its log and results.json under KEY
(run_v2, run_v3): python3 summarise_run.py RESULTS_JSON LOG START_EPOCH KEY"""
import json, re, sys, time
path, log, start, key = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
try:
    r = json.load(open(path))
except (OSError, ValueError) as e:
    sys.exit(f"no results.json to summarise: {e}")
stages = [(int(m.group(1)), m.group(2)) for m in re.finditer(r"\[stage (\d+) s\] (.*)", open(log).read())]
table = {}
for s, ser in r.get("series", {}).items():
    for ck, v in ser["checkpoints"].items():
        table[f"{s}/{ck}"] = {k: round(e["replayed_tau_macro"], 3) for k, e in v["gpu_eval"].items() if "@" not in k}
r[key] = {"stage_marks_s": stages, "train_py_stages_s": r.get("stages"), "steps": r.get("steps"),
               "train_data": {k: r.get("train_data", {}).get(k) for k in ("sequences", "continuation_tokens", "tap_rows", "sources")},
               "replayed_tau_macro": table, "wall_s": round(time.time() - start)}
json.dump(r, open(path, "w"), indent=1)
print("replayed tau (macro) per checkpoint, trainer's evaluation:")
for name, row in table.items():
    print(f"  {name:32s} " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
print(f"train.py stages (s): {r.get('stages')}")
