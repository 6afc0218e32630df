#!/usr/bin/env python3
"""Merge GEMM choices files copied from GPU machines into the ones that ship with the binary.

    python3 tools/bench/ship_gemm_choices.py FILE... [--into crates/engine/src/backend/cuda/gemm_choices_shipped.json]

Each FILE is a `gemm-choices-v1.json` from a device run's kernel cache folder
($DRAFTLENS_KERNEL_CACHE; the device scripts copy it to $OUT). Entries are keyed by machine
(GPU, compute capability, driver, cuBLASLt version) and shape; an entry already shipped is kept
unless a FILE has the same machine and shape (the newer timing wins). The output is sorted, so
shipping the same entries again gives the same bytes (docs/cuda.md, "GEMM modes and tuning").
"""
import argparse
import json
import sys

ap = argparse.ArgumentParser()
ap.add_argument("files", nargs="+")
ap.add_argument("--into", default="crates/engine/src/backend/cuda/gemm_choices_shipped.json")
args = ap.parse_args()


def load(path):
    with open(path) as f:
        doc = json.load(f)
    if doc.get("version") != 1 or not isinstance(doc.get("machines"), dict):
        sys.exit(f"{path}: not a version-1 GEMM choices file")
    return doc["machines"]


shipped = load(args.into)
for path in args.files:
    for machine, entries in load(path).items():
        shipped.setdefault(machine, {}).update(entries)
        print(f"{path}: {machine}: {len(entries)} shapes")
with open(args.into, "w") as f:
    json.dump({"version": 1, "machines": shipped}, f, indent=2, sort_keys=True)
    f.write("\n")
print(f"{args.into}: {sum(len(e) for e in shipped.values())} shapes of {len(shipped)} machines")
