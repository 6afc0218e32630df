#!/usr/bin/env python3
"""Pack trained checkpoints into parts that the device tool can return, and return them over
one or more calls.

The device tool returns at most 8 files of at most 16 MiB each, 64 MiB in all, per call; six
multi-layer checkpoints (~14-20 MB each) do not fit one call. So:

  pack TRAIN_DIR PACK_DIR   one tar of every <prefix>-<series>/step-N folder under TRAIN_DIR, the
                            most useful first (each series' last checkpoint, then the middle ones,
                            then the first), split into parts of PART_BYTES; PACK_DIR/manifest.txt
                            lists the parts with their sha256 and the tar's members in order (a
                            prefix of the parts holds a prefix of the members: `cat` what came back,
                            then `tar xf` extracts every complete checkpoint in it)
  send PACK_DIR OUT [--files N] [--bytes B] [--extra FILE ...]
                            copies the manifest, the given extra files and then the next parts not
                            sent yet into OUT, as many as fit N files / B bytes; records what was sent
                            in PACK_DIR/sent.txt, so the next call's `send` continues

    # on the device, after training (tools/train-reference-drafter/run_v2_on_gpu.sh does this)
    python3 pack_out.py pack /tmp/draftlens-train /tmp/draftlens-train/pack
    python3 pack_out.py send /tmp/draftlens-train/pack $OUT --files 8 --bytes 66500000 --extra log.txt
    # here, once every part is back
    cat ckpts.tar.part* > ckpts.tar && sha256sum -c manifest.txt && tar xf ckpts.tar
"""

import argparse
import hashlib
import os
import re
import shutil
import sys
import tarfile

PART_BYTES = 16_000_000  # < 16 MiB (16,777,216), the device tool's limit per file


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checkpoints(train_dir):
    """[(series folder, [step folders sorted by step])] under train_dir."""
    out = []
    for d in sorted(os.listdir(train_dir)):
        full = os.path.join(train_dir, d)
        if not os.path.isdir(full) or d in ("probe", "pack"):
            continue
        steps = [s for s in os.listdir(full) if re.fullmatch(r"step-\d+", s) and os.path.isfile(os.path.join(full, s, "config.json"))]
        if steps:
            out.append((d, sorted(steps, key=lambda s: int(s.split("-")[1]))))
    return out


def priority_order(found):
    """Last checkpoint of every series, then the one before it of every series, and so on; within
    a round, the `reference` series first."""
    found = sorted(found, key=lambda f: ("reference" not in f[0], f[0]))
    order, depth = [], 0
    while True:
        row = [f"{d}/{steps[-1 - depth]}" for d, steps in found if depth < len(steps)]
        if not row:
            return order
        order += row
        depth += 1


def pack(train_dir, pack_dir):
    found = checkpoints(train_dir)
    if not found:
        raise SystemExit(f"pack_out.py: {train_dir}: no <series>/step-N checkpoints")
    os.makedirs(pack_dir, exist_ok=True)
    members = priority_order(found)
    tar_path = os.path.join(pack_dir, "ckpts.tar")
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as t:
        for m in members:
            for name in sorted(os.listdir(os.path.join(train_dir, m))):
                t.add(os.path.join(train_dir, m, name), arcname=f"{m}/{name}", recursive=False)
    parts = []
    with open(tar_path, "rb") as f:
        for i in range(10**6):
            block = f.read(PART_BYTES)
            if not block:
                break
            p = os.path.join(pack_dir, f"ckpts.tar.part{i:02d}")
            with open(p, "wb") as g:
                g.write(block)
            parts.append(p)
    lines = [f"{sha256(tar_path)}  ckpts.tar"] + [f"{sha256(p)}  {os.path.basename(p)}" for p in parts]
    with open(os.path.join(pack_dir, "manifest.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
        f.write("# members, in order: " + " ".join(members) + "\n")
    os.remove(tar_path)
    open(os.path.join(pack_dir, "sent.txt"), "w").close()
    print(f"packed {len(members)} checkpoints ({', '.join(members)}) into {len(parts)} parts in {pack_dir}")


def send(pack_dir, out, max_files, max_bytes, extra):
    os.makedirs(out, exist_ok=True)
    sent = set(open(os.path.join(pack_dir, "sent.txt")).read().split())
    parts = sorted(p for p in os.listdir(pack_dir) if p.startswith("ckpts.tar.part"))
    files, size = 0, 0
    for path in [os.path.join(pack_dir, "manifest.txt")] + [e for e in extra if os.path.isfile(e)]:
        shutil.copy(path, out)
        files += 1
        size += os.path.getsize(path)
    now = []
    for p in parts:
        if p in sent:
            continue
        n = os.path.getsize(os.path.join(pack_dir, p))
        if files + 1 > max_files or size + n > max_bytes:
            break
        shutil.copy(os.path.join(pack_dir, p), out)
        files += 1
        size += n
        now.append(p)
    with open(os.path.join(pack_dir, "sent.txt"), "a") as f:
        f.write("".join(p + "\n" for p in now))
    left = [p for p in parts if p not in sent and p not in now]
    print(f"sent {len(now)} parts ({', '.join(now) or 'none'}), {files} files, {size / 2**20:.1f} MiB; "
          f"{len(left)} parts left{' (' + ', '.join(left) + '): send again in the next call' if left else ''}")
    return left


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("train_dir")
    p.add_argument("pack_dir")
    s = sub.add_parser("send")
    s.add_argument("pack_dir")
    s.add_argument("out")
    s.add_argument("--files", type=int, default=8)
    s.add_argument("--bytes", type=int, default=66_500_000, help="bytes in all (the tool: 64 MiB = 67,108,864)")
    s.add_argument("--extra", nargs="*", default=[])
    a = ap.parse_args()
    if a.cmd == "pack":
        pack(a.train_dir, a.pack_dir)
    else:
        send(a.pack_dir, a.out, a.files, a.bytes, a.extra)
    sys.exit(0)


if __name__ == "__main__":
    main()
