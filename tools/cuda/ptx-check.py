#!/usr/bin/env python3
"""Compile crates/cuda/src/*.cu with NVRTC exactly as nvrtc.rs does (compute_90, --std=c++17), then
assemble the PTX with ptxas for sm_90 and print each kernel's registers, spills and shared memory.

Needs no GPU: NVRTC and ptxas come from the PyPI wheels nvidia-cuda-nvrtc / nvidia-cuda-nvcc (13.0):
    pip download --no-deps -d /tmp/nvw 'nvidia-cuda-nvrtc==13.0.*' 'nvidia-cuda-nvcc==13.0.*'
    mkdir -p /opt/nvrtc && for w in /tmp/nvw/*.whl; do python3 -m zipfile -e $w /opt/nvrtc; done
    chmod +x /opt/nvrtc/nvidia/cu13/bin/*      # zipfile drops the executable bits
Usage: python3 tools/cuda/ptx-check.py [--root /opt/nvrtc] [--arch 90] [--sass KERNEL ...]

--sass KERNEL: also disassemble KERNEL (cuobjdump and nvdisasm from the PyPI wheels nvidia-cuda-cuobjdump /
nvidia-cuda-nvdisasm, 13.2 or later, unpacked under --root the same way) and print, per loop that holds mma
instructions (the four smallest: the innermost), its static instruction count and the most frequent opcodes: how
this project found that the attention kernels spent a third of each tile on address arithmetic (docs/benchmarks/history/cuda-notes-2026-11-30.md).
--sass-out DIR keeps the disassembly there. --ptx-out FILE keeps the PTX (compare two builds with cmp or diff).
--lines KERNEL: prints KERNEL's instruction count, then the source lines that the most of its instructions come from
(--top N of them, default 25): where a kernel's code goes, e.g. index arithmetic repeated per store. Static counts
(each instruction once), not executed ones: a loop body counts once. The program is then compiled with line
information (which leaves the machine code as it is; the PTX of --ptx-out then carries it too). Needs nvdisasm, as
--sass does.
"""
import argparse, ctypes, os, pathlib, re, subprocess, sys, tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--root", default=os.environ.get("NVRTC_ROOT", "/opt/nvrtc"))
ap.add_argument("--arch", default="90")
ap.add_argument("--quiet", action="store_true", help="only errors, spills and the kernel count")
ap.add_argument("--sass", nargs="*", default=[], help="kernels to disassemble and summarise (loops with mma)")
ap.add_argument("--sass-out", help="folder for the disassembly (default: a temporary folder)")
ap.add_argument("--lines", nargs="*", default=[], help="kernels whose instructions to attribute to source lines")
ap.add_argument("--top", type=int, default=25, help="source lines printed per --lines kernel")
ap.add_argument("--ptx-out", help="write the PTX there too: two builds' PTX compared show whether a source change that "
                "should not change the code (a helper factored out) did not")
a = ap.parse_args()
lib = pathlib.Path(a.root) / "nvidia/cu13/lib/libnvrtc.so.13"
if str(lib.parent) not in os.environ.get("LD_LIBRARY_PATH", ""):
    # libnvrtc dlopens its builtins library by name.
    os.environ["LD_LIBRARY_PATH"] = f"{lib.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"
    os.execv(sys.executable, [sys.executable] + sys.argv)
ptxas = pathlib.Path(a.root) / "nvidia/cu13/bin/ptxas"
if not lib.is_file() or not ptxas.is_file():
    sys.exit(f"no NVRTC / ptxas under {a.root}: see this script's docstring for the two wheels")
repo = pathlib.Path(__file__).resolve().parents[2]
# The same order as nvrtc.rs's KERNELS_CU.
order = [l.split('"')[1] for l in (repo / "crates/cuda/src/nvrtc.rs").read_text().splitlines()
         if "include_str!(" in l and ".cu\"" in l]
src = "".join((repo / "crates/cuda/src" / f).read_text() for f in order)
nv = ctypes.CDLL(str(lib))
prog = ctypes.c_void_p()
assert nv.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"onepass_kernels.cu", 0, None, None) == 0
# Line information (for --lines) adds no instruction: one compile serves every report.
opts = [f"--gpu-architecture=compute_{a.arch}".encode(), b"--std=c++17"] + ([b"-lineinfo"] if a.lines else [])
arr = (ctypes.c_char_p * len(opts))(*opts)
rc = nv.nvrtcCompileProgram(prog, len(opts), arr)
n = ctypes.c_size_t()
nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
log = ctypes.create_string_buffer(n.value)
nv.nvrtcGetProgramLog(prog, log)
if log.value.strip():
    print(log.value.decode())
if rc != 0:
    sys.exit(f"NVRTC failed ({rc})")
nv.nvrtcGetPTXSize(prog, ctypes.byref(n))
ptx = ctypes.create_string_buffer(n.value)
nv.nvrtcGetPTX(prog, ptx)
if a.ptx_out:
    pathlib.Path(a.ptx_out).write_bytes(ptx.value)
# The assembled program, kept to the end for --sass and --lines.
work = tempfile.TemporaryDirectory()
ptx_file, cubin = pathlib.Path(work.name) / "k.ptx", pathlib.Path(work.name) / "k.cubin"
ptx_file.write_bytes(ptx.value)
r = subprocess.run([str(ptxas), f"-arch=sm_{a.arch}", "-v"] + (["-lineinfo"] if a.lines else [])
                   + [str(ptx_file), "-o", str(cubin)], capture_output=True, text=True)
out = r.stderr + r.stdout
if r.returncode != 0:
    print(out)
    sys.exit("ptxas failed")
kern, bad = None, False
count = 0
for line in out.splitlines():
    m = re.search(r"Compiling entry function '(\w+)'", line)
    if m:
        kern = m.group(1); count += 1
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and (int(m.group(2)) or int(m.group(3))):
        print(f"SPILL {kern}: {line.strip()}"); bad = True
    m = re.search(r"Used (\d+) registers", line)
    if m and not a.quiet:
        print(f"{kern:28s} {line.split('info    : ')[-1].strip()}")
print(f"{count} kernels assembled for sm_{a.arch}" + (" (spills above)" if bad else ""))


def loops(sass):
    """(instructions, mma count, top opcodes) of each backward-branch loop of a disassembly that holds mma."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    found = []
    for at, text in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if not m or int(m.group(1), 16) >= at:
            continue
        body = [t for x, t in ins if int(m.group(1), 16) <= x <= at]
        mma = sum("MMA" in t for t in body)
        if mma:
            ops = {}
            for t in body:
                op = re.sub(r"^@!?U?P\w+ ", "", t).split()[0].split(".")[0]
                ops[op] = ops.get(op, 0) + 1
            top = sorted(ops.items(), key=lambda kv: -kv[1])[:8]
            found.append((len(body), mma, top))
    return len(ins), found


if a.sass:
    bindir = pathlib.Path(a.root) / "nvidia/cu13/bin"
    if not (bindir / "cuobjdump").is_file() or not (bindir / "nvdisasm").is_file():
        sys.exit(f"--sass needs cuobjdump and nvdisasm under {bindir}: see this script's docstring")
    env = dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '')}")
    outdir = pathlib.Path(a.sass_out or tempfile.mkdtemp())
    outdir.mkdir(parents=True, exist_ok=True)
    for k in a.sass:
        r = subprocess.run([str(bindir / "cuobjdump"), "-sass", "-fun", k, str(cubin)], capture_output=True,
                           text=True, env=env)
        if r.returncode != 0 or "Function" not in r.stdout:
            print(f"{k}: no such kernel or no disassembly ({r.stderr.strip()[:200]})")
            continue
        (outdir / f"{k}.sass").write_text(r.stdout)
        total, found = loops(r.stdout)
        print(f"{k}: {total} instructions ({outdir / (k + '.sass')})")
        for n, mma, top in sorted(found)[:4]:  # the innermost (smallest) loops first
            print(f"  loop of {n} instructions, {mma} mma: " + ", ".join(f"{o} {c}" for o, c in top))


if a.lines:
    import collections
    bindir = pathlib.Path(a.root) / "nvidia/cu13/bin"
    if not (bindir / "nvdisasm").is_file():
        sys.exit(f"--lines needs nvdisasm under {bindir}: see this script's docstring")
    # Where each .cu file starts in the concatenated source (NVRTC numbers the lines of the whole program).
    starts, at = [], 0
    for f in order:
        starts.append((at, f))
        at += (repo / "crates/cuda/src" / f).read_text().count("\n")
    lines = src.splitlines()

    def where(n):
        for first, f in reversed(starts):
            if n - 1 >= first:
                return f"{f}:{n - first}"
        return "?"

    dis = subprocess.run([str(bindir / "nvdisasm"), "-g", "-c", str(cubin)], capture_output=True, text=True,
                         check=True).stdout
    for k in a.lines:
        count, line, inside = collections.Counter(), None, False
        for l in dis.splitlines():
            m = re.match(r"\s*\.text\.(\w+):", l)
            if m:
                inside, line = m.group(1) == k, None
                continue
            if not inside:
                continue
            m = re.search(r'//## File "[^"]+", line (\d+)', l)
            if m:
                line = int(m.group(1))
            elif re.match(r"\s+/\*[0-9a-f]+\*/", l):
                count[line] += 1
        total = sum(count.values())
        if not total:
            print(f"{k}: no such kernel")
            continue
        print(f"{k}: {total} instructions; by source line (the innermost inlined one):")
        for ln, c in count.most_common(a.top):
            text = lines[ln - 1].strip()[:80] if ln and ln <= len(lines) else ""
            print(f"  {c:6d}  {where(ln) if ln else '?':24s} {text}")
