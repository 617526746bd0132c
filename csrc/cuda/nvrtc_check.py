"""Compile the skinny GEMM's device code (``csrc/cuda/skinny_gemm_kernels.cuh``) for sm_90 without
nvcc: NVRTC -> PTX -> ptxas, and print each kernel's registers, spills and shared memory.

For the CPU machine, where the JIT build (``ops/_cpp.py`` ``load_cuda_gemm``) cannot run: it catches
template / PTX errors and register spills before a device call is spent on them. It does not check
the host code (``skinny_gemm.cu``'s launchers). Needs the CUDA 12 wheels of NVRTC, the runtime
headers and ptxas, e.g.::

    pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12
    python csrc/cuda/nvrtc_check.py

(``--root DIR``: a folder with those wheels unzipped instead of the installed ``nvidia`` package).
Exit status 1 on a compile error or a spill.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import itertools
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def kernels() -> list[str]:
    """The instantiations ``skinny_gemm.cu`` launches (its dispatch_cfg / dispatch_res)."""
    return [f"vllm_specla_skinny::skinny_gemm_kernel<{t}, {nt}, {w}, {u}, {res}>"
            for t, nt, (w, u), res in itertools.product(("__nv_bfloat16", "__half"), (1, 2),
                                                        [(w, u) for w in (4, 8, 16) for u in (4, 8)], ("false", "true"))]


def _roots(root: str | None) -> list[str]:
    if root:
        return [os.path.join(root, "nvidia")]
    spec = importlib.util.find_spec("nvidia")
    return list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []


def _find(roots: list[str], *rel: str) -> str:
    for r in roots:
        p = os.path.join(r, *rel)
        if os.path.exists(p):
            return p
    raise SystemExit(f"not found: nvidia/{'/'.join(rel)} (pip install nvidia-cuda-nvrtc-cu12 "
                     f"nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12, or --root)")


def compile_ptx(lib: ctypes.CDLL, src: str, include: str, names: list[str], arch: str) -> str:
    """NVRTC: ``src`` with every kernel of ``names`` instantiated -> PTX (raises SystemExit with the
    log on an error)."""
    prog = ctypes.c_void_p()
    chk = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"skinny_gemm_check.cu", 0, None, None)
    assert chk == 0, chk
    for n in names:
        assert lib.nvrtcAddNameExpression(prog, f"&{n}".encode()) == 0, n
    opts = [f"--gpu-architecture={arch}", f"-I{include}", f"-I{HERE}", "-std=c++17", "-default-device"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        raise SystemExit(f"NVRTC failed ({rc}):\n{log.value.decode()}")
    if log.value.strip():
        print(log.value.decode())
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value.decode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=None, help="a folder with the nvidia wheels unzipped (default: installed)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--ptx-out", default=None, help="also write the PTX here")
    args = ap.parse_args()
    roots = _roots(args.root)
    lib = ctypes.CDLL(_find(roots, "cuda_nvrtc", "lib", "libnvrtc.so.12"))
    include = os.path.dirname(_find(roots, "cuda_runtime", "include", "cuda_bf16.h"))
    ptxas = _find(roots, "cuda_nvcc", "bin", "ptxas")
    names = kernels()
    src = '#include "skinny_gemm_kernels.cuh"\n'
    ptx = compile_ptx(lib, src, include, names, args.arch.replace("sm_", "compute_"))
    if args.ptx_out:
        with open(args.ptx_out, "w") as f:
            f.write(ptx)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.ptx")
        with open(p, "w") as f:
            f.write(ptx)
        r = subprocess.run([ptxas, f"-arch={args.arch}", "-v", p, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
    if r.returncode:
        print(r.stderr)
        return 1
    bad = 0
    fn = None
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            fn = m.group(1)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and (int(m.group(1)) or int(m.group(2))):
            bad += 1
            print(f"SPILL {fn}: {line.strip()}")
        m = re.search(r"Used (\d+) registers.*?(\d+) bytes smem", line)
        if m:
            print(f"{int(m.group(1)):4d} regs {int(m.group(2)):6d} B smem  {_demangle(fn)}")
    print(f"{len(names)} kernels compiled for {args.arch}; {bad} with spills")
    return 1 if bad else 0


def _demangle(name: str | None) -> str:
    try:
        return subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip()
    except (OSError, TypeError):
        return str(name)


if __name__ == "__main__":
    sys.exit(main())
