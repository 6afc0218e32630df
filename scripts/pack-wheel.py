#!/usr/bin/env python3
"""Pack an already-built ``draftlens`` binary into a wheel, the layout maturin's ``bin`` bindings
produce (pyproject.toml): the binary in ``draftlens-<v>.data/scripts/`` (pip puts it on PATH),
the Python package from ``python/draftlens/`` and the dist-info. Standard library only.

    scripts/pack-wheel.py BINARY OUT_DIR      # prints the wheel's path

Used by scripts/test-wheel.sh so that CI tests the wheel built from the binary ``cargo test``
already built, instead of a second, release build (docs/install.md §1). Release wheels are built
with maturin (``maturin build --release``), which does the same plus its manylinux audit.

The platform tag is ``manylinux_2_<N>_<arch>`` where 2.N is the newest glibc symbol version the
binary needs (what auditwheel computes); CUDA is not linked (it is loaded at run time), so the
binary's only dynamic dependencies are glibc's.
"""

import base64
import hashlib
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def version_of(binary):
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.fullmatch(r"draftlens (\S+)\s*", out)
    if not m:
        sys.exit(f"{binary}: unexpected --version output {out!r}")
    return m.group(1)


def glibc_tag(binary):
    with open(binary, "rb") as f:
        data = f.read()
    versions = [tuple(map(int, v.split(b"."))) for v in re.findall(rb"GLIBC_(2\.[0-9]+)\x00", data)]
    if not versions:
        sys.exit(f"{binary}: no glibc symbol versions found (not a glibc Linux binary?)")
    major, minor = max(versions)
    return f"manylinux_{major}_{minor}_{platform.machine()}"


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def metadata(version):
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    return (
        "Metadata-Version: 2.1\n"
        "Name: draftlens\n"
        f"Version: {version}\n"
        "Summary: Honest evaluation of speculative-decoding drafters (DFlash): the draftlens command-line tool\n"
        "License: Apache-2.0\n"
        "Requires-Python: >=3.8\n"
        # Python metric plugins: the SDK is written by `draftlens plugins new NAME --lang python`
        # (it ships inside the binary); building the component needs componentize-py, pinned as
        # the `plugins` extra (`pip install draftlens[plugins]`), like pyproject.toml says.
        "Provides-Extra: plugins\n"
        'Requires-Dist: componentize-py==0.25.1; extra == "plugins"\n'
        "Description-Content-Type: text/markdown; charset=UTF-8; variant=GFM\n"
        "\n" + readme
    )


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    binary, out_dir = sys.argv[1:]
    version = version_of(binary)
    tag = glibc_tag(binary)
    name = f"draftlens-{version}-py3-none-{tag}.whl"
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)

    # A stripped copy: the test profile keeps line tables, which a wheel does not need.
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "draftlens")
        shutil.copyfile(binary, exe)
        if shutil.which("strip"):
            subprocess.run(["strip", exe], check=True)
        files = [(f"draftlens-{version}.data/scripts/draftlens", open(exe, "rb").read(), 0o755)]
    pkg = os.path.join(ROOT, "python", "draftlens")
    for dirpath, _, names in sorted(os.walk(pkg)):
        for n in sorted(names):
            if n.endswith(".pyc"):
                continue
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, os.path.join(ROOT, "python")).replace(os.sep, "/")
            files.append((rel, open(full, "rb").read(), 0o644))
    info = f"draftlens-{version}.dist-info"
    files.append((f"{info}/METADATA", metadata(version).encode(), 0o644))
    wheel = f"Wheel-Version: 1.0\nGenerator: draftlens scripts/pack-wheel.py\nRoot-Is-Purelib: false\nTag: py3-none-{tag}\n"
    files.append((f"{info}/WHEEL", wheel.encode(), 0o644))
    record = "\n".join(record_line(n, d) for n, d, _ in files) + f"\n{info}/RECORD,,\n"
    files.append((f"{info}/RECORD", record.encode(), 0o644))

    tmp_path = path + ".tmp"
    with zipfile.ZipFile(tmp_path, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        for n, d, mode in files:
            zi = zipfile.ZipInfo(n, date_time=(2026, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = (stat.S_IFREG | mode) << 16
            z.writestr(zi, d)
    os.replace(tmp_path, path)
    print(path)


if __name__ == "__main__":
    main()
