import sys, subprocess, ctypes, re
sys.path.insert(0, "tools")
import check_kernels as ck
T = "/root/.cache/draftlens/kernel-tools"
lib = ctypes.CDLL(T + "/libnvrtc.so.12")
out_dir = sys.argv[1]
import os; os.makedirs(out_dir, exist_ok=True)
for mod in sys.argv[2:]:
    src = ck.module_source(mod)
    ptx = ck.nvrtc_ptx(lib, src, mod, 90)
    open(f"/tmp/{mod}.ptx", "wb").write(ptx if isinstance(ptx, bytes) else ptx.encode())
    subprocess.run([T + "/ptxas", "-arch=sm_90", f"/tmp/{mod}.ptx", "-o", f"/tmp/{mod}.cubin"], check=True)
    out = subprocess.run(["/tmp/nvd/nvidia/cu13/bin/nvdisasm", "-c", f"/tmp/{mod}.cubin"], capture_output=True, text=True)
    # split per function
    cur = None; funcs = {}
    for line in out.stdout.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m: cur = m.group(1); funcs[cur] = []; continue
        if cur: funcs[cur].append(re.sub(r"/\*[0-9a-f]{4}\*/", "", line))
    for f, lines in funcs.items():
        open(f"{out_dir}/{mod}.{f}.sass", "w").write("\n".join(lines))
    print(mod, len(funcs), "functions")
