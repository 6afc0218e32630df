#!/usr/bin/env python3
"""Compile the CUDA kernels offline (no GPU, no driver) and report each kernel's resources.

Builds every module exactly as `crates/engine/src/backend/cuda/kernels.rs` does (kernels/common.cuh, a
`#line` directive, the module's files in the same order, the same NVRTC options), compiles it to
PTX with NVRTC through ctypes, then runs `ptxas -v` for the real architecture and prints registers,
shared memory and spills per kernel. Spills or a compile error make the exit status non-zero.

Needs only two PyPI wheels, no CUDA installation (docs/cuda.md, "Checking kernels without a GPU"):

    pip download --no-deps nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-nvcc==13.0.88   # libnvrtc, ptxas
    LD_LIBRARY_PATH=DIR python3 tools/check_kernels.py --nvrtc DIR/libnvrtc.so.13 --ptxas DIR/ptxas [--only gdn] [--filter gdn_]

Usage: python3 tools/check_kernels.py [--arch 90] [--only MODULE ...] [--filter SUBSTRING]
                                     [--allow-spill KERNEL ...] [--allow-local KERNEL ...]
CI runs it through scripts/check-kernels.sh, which fetches the two wheels pinned by hash.
"""
import argparse
import ctypes
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS_RS = ROOT / "crates/engine/src/backend/cuda/kernels.rs"


def modules(table_name="const SOURCES:"):
    """Module name -> its files, in the order `SOURCES` in kernels.rs concatenates them (read from
    kernels.rs itself, so that this tool cannot drift from what the backend compiles).
    `const SOURCES_SM90A:` names the modules compiled for sm_90a only (wgmma)."""
    src = KERNELS_RS.read_text()
    table = src[src.index(table_name):]
    table = table[: table.index("];")]
    out, current = {}, None
    # In order: a module's name ("elementwise",) then the files it includes.
    for tok in re.finditer(r'"(\w+)"\s*,|include_str!\("[./]*kernels/([\w.]+)"\)', table):
        if tok.group(1):
            current = tok.group(1)
            out[current] = []
        elif current:
            out[current].append(tok.group(2))
    if not out:
        sys.exit(f"{KERNELS_RS}: no kernel modules found in SOURCES")
    return out


MODULES = modules()
# Modules for Hopper's arch-specific target (kernels.rs SOURCES_SM90A): compiled for 90a, and only
# when --arch is 90.
MODULES_90A = modules("const SOURCES_SM90A:")
MODULES.update(MODULES_90A)


def module_source(name):
    common = (ROOT / "kernels/common.cuh").read_text()
    files = MODULES[name]
    body = (ROOT / "kernels" / files[0]).read_text()
    for f in files[1:]:
        body += f'\n#line 1 "kernels/{f}"\n' + (ROOT / "kernels" / f).read_text()
    return f'{common}\n#line 1 "kernels/{name}.cu"\n{body}'


def nvrtc_ptx(lib, src, name, arch):
    prog = ctypes.c_void_p()
    check = lambda rc, what: rc == 0 or sys.exit(f"kernels/{name}.cu: NVRTC {what} failed ({rc})")
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{name}.cu".encode(), 0, None, None), "create")
    opts = [f"--gpu-architecture=compute_{arch}", "--std=c++17", "-lineinfo"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        print(log.value.decode(errors="replace"))
        return None
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


# A PTX instruction that touches memory other than the kernel's parameters. None may come before
# a kernel's `griddepcontrol.wait` (kernels/common.cuh, dl_grid_begin): every launch may be a
# dependent launch (docs/cuda.md, "Dependent launches"), whose grid starts while the one ahead of it
# is still writing.
MEMORY_OP = re.compile(r"^\s*(@!?%p\d+\s+)?(ld|ldu|st|atom|red|cp|prefetch|tex|tld4|suld|sust|wgmma|"
                       r"ldmatrix|stmatrix|mbarrier|call)\b")


def dependent_launch_errors(ptx, arch):
    """Kernels of `ptx` that touch memory before their griddepcontrol.wait, or have none."""
    if int(arch.rstrip("a")) < 90:
        return []  # no dependent launches below sm_90: dl_grid_begin is empty there
    errors = []
    for chunk in re.split(r"\.entry\s+", ptx)[1:]:
        kernel = re.match(r"\w+", chunk).group(0)
        for line in chunk.splitlines():
            if "griddepcontrol.wait" in line:
                break
            if MEMORY_OP.match(line) and not re.match(r"\s*ld\.param", line):
                errors.append(f"{kernel}: `{line.strip()}` before griddepcontrol.wait (dl_grid_begin)")
                break
        else:
            errors.append(f"{kernel}: no griddepcontrol.wait (dl_grid_begin() must start every kernel)")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="90")
    ap.add_argument("--only", nargs="*", default=list(MODULES))
    ap.add_argument("--filter", default="", help="print only kernels whose name contains this")
    ap.add_argument("--nvrtc", default=os.environ.get("NVRTC_LIB", "libnvrtc.so.13"))
    ap.add_argument("--ptxas", default=os.environ.get("PTXAS", "ptxas"))
    ap.add_argument("--allow-spill", action="append", default=[], metavar="KERNEL",
                    help="a kernel whose spills are known and documented (repeatable)")
    ap.add_argument("--allow-local", action="append", default=[], metavar="KERNEL",
                    help="a kernel whose stack frame (local memory without spills: the GPU's"
                         " `local (spill) memory`) is known and documented (repeatable)")
    a = ap.parse_args()
    lib = ctypes.CDLL(a.nvrtc)
    bad = False
    for name in a.only:
        arch = a.arch
        if name in MODULES_90A:
            if a.arch != "90":
                print(f"kernels/{name}.cu: sm_90a only, skipped for sm_{a.arch}")
                continue
            arch = "90a"
        ptx = nvrtc_ptx(lib, module_source(name), name, arch)
        if ptx is None:
            bad = True
            continue
        for e in dependent_launch_errors(ptx, arch):
            print(f"DEPENDENT LAUNCH kernels/{name}.cu: {e}")
            bad = True
        with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
            f.write(ptx)
            f.flush()
            r = subprocess.run([a.ptxas, f"-arch=sm_{arch}", "-v", f.name, "-o", os.devnull],
                               capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stderr)
            bad = True
            continue
        kernel = None
        for line in r.stderr.splitlines():
            m = re.search(r"Compiling entry function '(\w+)'", line)
            if m:
                kernel = m.group(1)
            spill = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if spill and kernel and (int(spill.group(2)) or int(spill.group(3))):
                known = kernel in a.allow_spill
                print(f"SPILL{' (allowed)' if known else ''} {name}/{kernel}: {line.strip()}")
                bad = bad or not known
            elif spill and kernel and int(spill.group(1)):
                # Local memory without spills (a local array): what the GPU reports as the
                # kernel's local memory, which cuda_attention asserts is 0 for the prefill kernels.
                known = kernel in a.allow_local
                print(f"LOCAL{' (allowed)' if known else ''} {name}/{kernel}: {line.strip()}")
                bad = bad or not known
            used = re.search(r"Used (\d+) registers(.*)", line)
            if used and kernel and a.filter in kernel:
                print(f"{name}/{kernel}: {used.group(1)} registers{used.group(2)}")
        print(f"kernels/{name}.cu: compiled for sm_{arch}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
