"""Compile the skinny GEMM's device code (``csrc/cuda/skinny_gemm_kernels.cuh``) for sm_90 without
nvcc: NVRTC -> PTX -> ptxas, and print each kernel's registers, spills and shared memory; with
``--host``, also check its host code (``skinny_gemm.cu``: launchers, dispatch, op schema) with
``g++ -fsyntax-only`` against torch's and the CUDA wheels' headers.

For the CPU machine, where the JIT build (``ops/_cpp.py`` ``load_cuda_gemm``) cannot run: it catches
template / PTX errors and register spills before a device call is spent on them. It does not check
the host code unless ``--host`` is given. Needs the CUDA 12 wheels of NVRTC, the runtime headers
and ptxas (``--host``: also CCCL, g++ and torch's headers), e.g.::

    pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12 nvidia-cuda-cccl-cu12
    python csrc/cuda/nvrtc_check.py --host

(``--root DIR``: a folder with those wheels unzipped instead of the installed ``nvidia`` package).
Exit status 1 on a compile error, a spill or a stack frame (register arrays in local memory), or
when ptxas does not report every kernel.

``--chain`` checks the chain-verify kernels instead (``chain_verify.cu``, ``chain_verify_ut.cu``: their host code
is hidden from NVRTC by ``__CUDACC_RTC__``): every instantiation their dispatch launches compiles (spills are
noted, not failures), and with ``--sass`` none reads global memory before ``griddepcontrol.wait`` (~2 minutes on 2
cores: the kernels build in one part per core)::

    python csrc/cuda/nvrtc_check.py --chain --sass
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import importlib.util
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def kernels() -> list[str]:
    """The instantiations ``skinny_gemm.cu`` launches (its dispatch_cfg / dispatch_res)."""
    return [f"vllm_specla_skinny::skinny_gemm_kernel<{t}, {nt}, {w}, {u}, {res}>"
            for t, nt, (w, u), res in itertools.product(("__nv_bfloat16", "__half"), (1, 2),
                                                        [(w, u) for w in (4, 8, 16) for u in (4, 8)], ("false", "true"))
            ] + [f"vllm_specla_skinny::skinny_gemm_kernel<{t}, 1, 8, 8, {res}, true>"
                 for t, res in itertools.product(("__nv_bfloat16", "__half"), ("false", "true"))
            ] + [f"vllm_specla_skinny::skinny_gemm_fp8_kernel<1, {w}, {u}, {res}>"
                 for (w, u), res in itertools.product([(4, 4), (8, 4), (16, 4), (8, 8)], ("false", "true"))]


def _roots(root: str | None) -> list[str]:
    if root:  # the folder holding nvidia/, or nvidia/ itself
        return [os.path.join(root, "nvidia"), root]
    spec = importlib.util.find_spec("nvidia")
    return list(spec.submodule_search_locations) if spec and spec.submodule_search_locations else []


def _find(roots: list[str], *rel: str) -> str:
    for r in roots:
        p = os.path.join(r, *rel)
        if os.path.exists(p):
            return p
    raise SystemExit(f"not found: nvidia/{'/'.join(rel)} (searched: {', '.join(roots) or 'no nvidia package'}; "
                     f"pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12, or --root)")


def _nvrtc(rc: int, what: str) -> None:
    if rc != 0:  # (not an assert: python -O would skip it and check nothing)
        raise SystemExit(f"NVRTC {what} failed with status {rc}")


def compile_ptx(lib: ctypes.CDLL, src: str, include: str, names: list[str], arch: str, src_dir: str = HERE) -> str:
    """NVRTC: ``src`` with every kernel of ``names`` instantiated -> PTX (raises SystemExit with the
    log on an error). ``src_dir``: where its includes are."""
    prog = ctypes.c_void_p()
    _nvrtc(lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"skinny_gemm_check.cu", 0, None, None),
           "nvrtcCreateProgram")
    for n in names:
        _nvrtc(lib.nvrtcAddNameExpression(prog, f"&{n}".encode()), f"nvrtcAddNameExpression({n})")
    opts = [f"--gpu-architecture={arch}", f"-I{include}", f"-I{src_dir}", "-std=c++17", "-default-device"]
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
    _nvrtc(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
    ptx = ctypes.create_string_buffer(size.value)
    _nvrtc(lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
    return ptx.value.decode()


def check(ptxas_log: str) -> tuple[list[dict], list[str]]:
    """Parse ``ptxas -v`` output: one record per entry function (name, registers, shared memory,
    stack frame, spill bytes) and the problems (spills or a stack frame: register arrays in local
    memory)."""
    recs, problems = [], []
    for line in ptxas_log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            recs.append(dict(name=m.group(1), regs=None, smem=0, stack=0, spill=0))
            continue
        if not recs:
            continue
        r = recs[-1]
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            r["stack"], r["spill"] = int(m.group(1)), int(m.group(2)) + int(m.group(3))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            r["regs"] = int(m.group(1))
            m = re.search(r"(\d+) bytes smem", line)
            r["smem"] = int(m.group(1)) if m else 0
    for r in recs:
        if r["spill"] or r["stack"]:
            problems.append(f"{_demangle(r['name'])}: {r['spill']} bytes spilled, {r['stack']} bytes stack frame")
    return recs, problems


def nvdisasm() -> str | None:
    """An ``nvdisasm`` binary: on PATH, or the one Triton's wheel ships (the CUDA 12 wheels have none)."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    spec = importlib.util.find_spec("triton")
    if spec and spec.origin:
        p = os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "bin", "nvdisasm")
        if os.path.exists(p):
            return p
    return None


def sass_pre_wait_loads(sass: str) -> dict[str, tuple[list[str], int]]:
    """Per function of an ``nvdisasm -c`` listing: (the opcodes of its global reads before the first ``ACQBULK``,
    its number of global reads). Reads: global / generic loads (``LDG``, ``LD``), ``cp.async`` copies (``LDGSTS``)
    and bulk / TMA copies (``UBLKCP``, ``UTMALDG``). ``ACQBULK`` is ``griddepcontrol.wait``; a kernel without one
    lists every read."""
    out: dict[str, tuple[list[str], int]] = {}
    name = None
    pre: list[str] = []
    total = 0
    seen_wait = False
    for line in sass.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            if name is not None:
                out[name] = (pre, total)
            name, pre, total, seen_wait = m.group(1), [], 0, False
            continue
        if name is None or not re.search(r"/\*[0-9a-f]{4,}\*/", line):
            continue
        op = re.sub(r"^@!?U?P\w+\s+", "", re.sub(r".*?/\*[0-9a-f]{4,}\*/\s*", "", line).strip())
        if op.startswith("ACQBULK"):
            seen_wait = True
        elif re.match(r"(LDG|LD|LDGSTS|UBLKCP|UTMALDG)(\.|\s|$)", op):  # global / generic loads, async and bulk
            # (TMA) copies from global memory (not LDGDEPBAR, LDS, LDC)
            total += 1
            if not seen_wait:
                pre.append(op.split()[0])
    if name is not None:
        out[name] = (pre, total)
    return out


def pdl_violations(loads: dict[str, tuple[list[str], int]]) -> list[str]:
    """The kernels that read anything but the weight stream before ``griddepcontrol.wait``: every weight load
    of the skinny kernels is ``L1::no_allocate`` (``.NA`` in SASS); activations, residuals and scales are not,
    and under PDL the previous kernel may still be writing them (ops/pdl.py's contract)."""
    return [fn for fn, (pre, _) in loads.items() if any(".NA" not in op for op in pre)]


# --host: what nvcc provides to a .cu beyond the CUDA headers, for a syntax-only g++ pass, and stand-ins
# for the cuBLAS / cuSPARSE / cuSOLVER headers that torch's CUDA headers include (only their handle
# types are named there)
_PRELUDE = """#include <cuda_runtime.h>
#include <device_launch_parameters.h>
#include <algorithm>
#define __launch_bounds__(...)
using std::max;
using std::min;
inline void __syncthreads() {}
template <class T>
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes*, T*) { return cudaSuccess; }
"""
_STUBS = {"cusparse.h": "typedef struct cusparseContext* cusparseHandle_t;\n",
          "cublas_v2.h": "typedef struct cublasContext* cublasHandle_t;\ntypedef int cublasStatus_t;\n",
          "cublasLt.h": "typedef struct cublasLtContext* cublasLtHandle_t;\n",
          "cusolverDn.h": "typedef struct cusolverDnContext* cusolverDnHandle_t;\n",
          "cusolver_common.h": "typedef int cusolverStatus_t;\n",
          "c10/cuda/impl/cuda_cmake_macros.h": ""}


def host_check(roots: list[str], src: str | None = None) -> int:
    """``g++ -std=c++17 -fsyntax-only`` of ``skinny_gemm.cu`` (its templates instantiated by the op's
    dispatch), with torch's include paths, the CUDA runtime / nvcc / CCCL wheel headers and
    :data:`_STUBS`. ``src``: another copy of the file (its folder must hold the .cuh too). Returns
    g++'s exit status (its errors printed)."""
    src = src or os.path.join(HERE, "skinny_gemm.cu")
    from torch.utils.cpp_extension import include_paths  # noqa: PLC0415

    inc = [os.path.dirname(_find(roots, "cuda_runtime", "include", "cuda_runtime.h")),
           os.path.dirname(os.path.dirname(_find(roots, "cuda_nvcc", "include", "crt", "host_config.h"))),
           os.path.dirname(os.path.dirname(_find(roots, "cuda_cccl", "include", "nv", "target")))]
    with tempfile.TemporaryDirectory() as d:
        for name, text in _STUBS.items():
            os.makedirs(os.path.dirname(os.path.join(d, name)), exist_ok=True)
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        with open(os.path.join(d, "prelude.h"), "w") as f:
            f.write(_PRELUDE)
        cmd = (["g++", "-std=c++17", "-fsyntax-only", "-x", "c++", "-include", os.path.join(d, "prelude.h")]
               + [f"-I{p}" for p in include_paths()] + [f"-I{d}"] + [f"-I{p}" for p in inc]
               + [f"-I{os.path.dirname(os.path.abspath(src))}", src])
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise SystemExit(f"could not run g++ ({e})")
    if r.returncode:
        print(r.stdout + r.stderr)
    else:
        print("host code (skinny_gemm.cu): g++ -fsyntax-only passed")
    return r.returncode


def ptxas_build(ptxas: str, ptx: str, arch: str, sass: bool) -> tuple[subprocess.CompletedProcess, str | None]:
    """ptxas -v of ``ptx`` for ``arch`` -> (ptxas' result, the ``nvdisasm -c`` listing of the cubin when ``sass``
    and it compiled; ``None`` otherwise). Raises SystemExit when ptxas cannot run."""
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k.ptx")
        with open(p, "w") as f:
            f.write(ptx)
        try:
            r = subprocess.run([ptxas, f"-arch={arch}", "-v", p, "-o", os.path.join(d, "k.cubin")],
                               capture_output=True, text=True, check=False)
        except OSError as e:
            raise SystemExit(f"could not run ptxas at {ptxas} ({e}; unzipped wheels lose the exec bit: chmod +x)")
        listing = None
        if sass and r.returncode == 0:
            dis = nvdisasm()
            if dis is not None:
                listing = subprocess.run([dis, "-c", os.path.join(d, "k.cubin")], capture_output=True, text=True,
                                         check=False).stdout
    return r, listing


def report(log: str, names: list[str], arch: str, spill_tag: str, label: str = "") -> list[str] | None:
    """Print ptxas' per-kernel registers / shared memory, the spills (each line led by ``spill_tag``) and a summary
    line (led by ``label``) -> the spill problems, or None (after saying so) when ptxas did not report a register
    count for each of ``names``."""
    recs, problems = check(log)
    for rec in recs:
        print(f"{rec['regs'] or 0:4d} regs {rec['smem']:6d} B smem  {_demangle(rec['name'])}")
    for prob in problems:
        print(f"{spill_tag} {prob}")
    if len(recs) != len(names) or any(rec["regs"] is None for rec in recs):
        print(f"{label}ptxas reported {len(recs)} entry functions with register counts for {len(names)} kernels")
        return None
    print(f"{label}{len(recs)} kernels compiled for {arch}; {len(problems)} with spills or a stack frame")
    return problems


def chain_kernels() -> list[str]:
    """The kernel instantiations ``chain_verify.cu``'s dispatch can launch (``dispatch_k``: v3 ``dispatch_bv`` with
    its register-capped variants (``min_blocks``), the row-group bodies of ``launch_rg``, the AR bodies, the sb
    kernel), both input dtypes."""
    ns = "vllm_specla::cuda::"
    out = []
    for t in ("float", "__nv_bfloat16"):
        for kpl, vec in [(4, True), (8, True), (16, True), (1, False), (2, False), (4, False), (8, False), (16, False)]:
            v = "true" if vec else "false"
            for bv in ((4, 8) if kpl < 16 else (4,) if vec else (2,)):
                out.append(f"{ns}chain_verify_kernel<{t}, {kpl}, {v}, {bv}>")
                minb = 16 if (not vec and kpl >= 16) else (16 if bv == 8 else 24) if (vec and kpl == 8) else 0
                if minb:
                    out.append(f"{ns}chain_verify_kernel_capped<{t}, {kpl}, {v}, {bv}, {minb}>")
        for k in (128, 256):
            for pf in ("false", "true"):
                for lpr, rpl in [(32, 1), (16, 1), (8, 1), (8, 2), (4, 1)]:
                    if lpr == 32 and k < 256:
                        continue
                    for pw in ((4, 8) if pf == "false" else (8,)):
                        out.append(f"{ns}chain_verify_rg_kernel<{t}, {lpr}, {rpl}, {k // lpr}, {pf}, {pw}>")
            out.append(f"{ns}chain_verify_rg_ar_raw_kernel<{t}, 8, 1, {k // 8}>")
            out += [f"{ns}chain_verify_rg_ar_kernel<{t}, 8, 1, {k // 8}, {rec}>" for rec in ("false", "true")]
    out += [f"{ns}chain_verify_sb_kernel<{rpl}, {kpl}>" for rpl in (1, 2) for kpl in (16, 32)]
    return out


def ut_kernels() -> list[str]:
    """The UT-form kernel instantiations ``chain_verify_ut.cu``'s dispatch can launch (``dispatch_ut`` ->
    ``dispatch_nw``: K 128 / 256, TM 8 / 16, 1 warp (variants 1-3) or 4 (variant 1; 2 and 3 in phase-5 forms 0,
    and 1 / 2 at K = 256, TM = 8), one value tile per CTA or several), both input dtypes."""
    ns = "vllm_specla::cuda::"
    out = []
    for t in ("float", "__nv_bfloat16"):
        for k, tm in itertools.product((256, 128), (8, 16)):
            for one in ("true", "false"):
                out += [f"{ns}chain_verify_ut_kernel<{t}, {k}, {tm}, 1, {one}, {var}, 0>" for var in (1, 2, 3)]
                out.append(f"{ns}chain_verify_ut_kernel<{t}, {k}, {tm}, 4, {one}, 1, 0>")
                out += [f"{ns}chain_verify_ut_kernel<{t}, {k}, {tm}, 4, {one}, {var}, {p5}>" for var in (2, 3)
                        for p5 in ((0, 1, 2) if (k, tm) == (256, 8) else (0,))]
    return out


def chain_main(args, lib, include: str, ptxas: str) -> int:
    """``--chain``: compile ``chain_verify.cu`` and ``chain_verify_ut.cu`` (their device code: ``__CUDACC_RTC__``
    hides the host code) for every kernel of :func:`chain_kernels` / :func:`ut_kernels`; print registers (spills
    noted: they are reported, not failures, since the forced A/B bodies may spill) and, with ``--sass``, the global
    reads before ``griddepcontrol.wait``: these kernels read no weights, so any is a violation (exit 1)."""
    workers = max(1, os.cpu_count() or 1)
    jobs = []
    for src, names in (("chain_verify.cu", chain_kernels()), ("chain_verify_ut.cu", ut_kernels())):
        names = [n for n in names if re.search(args.kernels or "", n)]
        parts = min(workers, len(names))  # (each file's kernels in one part per core: NVRTC's parse is repeated)
        jobs += [(src, names[i::parts]) for i in range(parts)]

    def build(job):  # NVRTC (ctypes: the GIL is released) and ptxas (a process): the parts build in parallel
        src, names = job
        ptx = compile_ptx(lib, f'#include "{src}"\n', include, names, args.arch.replace("sm_", "compute_"),
                          src_dir=args.src_dir)
        return ptxas_build(ptxas, ptx, args.arch, args.sass)

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        built = list(pool.map(build, jobs))
    bad = 0
    for (src, names), (r, listing) in zip(jobs, built):
        if r.returncode:
            print(r.stdout + r.stderr)
            return 1
        if report(r.stdout + r.stderr, names, args.arch, "note: spill", f"{src}: ") is None:
            return 1
        if args.sass:
            if listing is None:
                print("--sass: no nvdisasm found (PATH, Triton's wheel)")
                return 1
            loads = sass_pre_wait_loads(listing)
            if len(loads) != len(names):
                print(f"--sass: {len(loads)} functions in the listing for {len(names)} kernels")
                return 1
            for fn, (pre, total) in sorted(loads.items()):
                flag = "  READS BEFORE THE WAIT" if pre else ""
                print(f"  {len(pre):3d} of {total:3d} global reads before griddepcontrol.wait  {_demangle(fn)}{flag}")
                bad += bool(pre)
    if args.sass:
        print(f"--sass: {bad} kernel(s) read global memory before griddepcontrol.wait")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=None, help="a folder with the nvidia wheels unzipped (default: installed)")
    ap.add_argument("--arch", default="sm_90", help="a real GPU architecture, sm_XY (default sm_90)")
    ap.add_argument("--ptx-out", default=None, help="also write the PTX here")
    ap.add_argument("--host", action="store_true", help="also check skinny_gemm.cu's host code with g++ -fsyntax-only")
    ap.add_argument("--sass", action="store_true",
                    help="also disassemble (nvdisasm) and print each kernel's global reads before griddepcontrol.wait "
                         "(ACQBULK); exit 1 if one reads anything but weights (L1::no_allocate loads) before it, or "
                         "reads nothing before it (--chain: if one reads anything before it)")
    ap.add_argument("--chain", action="store_true",
                    help="check the chain-verify kernels (chain_verify.cu, chain_verify_ut.cu) instead of the skinny "
                         "GEMM: every instantiation their dispatch launches compiles; with --sass none reads global "
                         "memory before griddepcontrol.wait")
    ap.add_argument("--kernels", default=None, metavar="REGEX",
                    help="--chain: only the kernels whose name matches REGEX (Python re.search), e.g. sb_kernel")
    ap.add_argument("--src-dir", default=HERE, help="--chain: the folder with chain_verify*.cu / .cuh (default: this "
                                                    "script's; tests point it at a modified copy)")
    args = ap.parse_args()
    if not re.fullmatch(r"sm_\d+a?", args.arch):
        raise SystemExit(f"--arch must be a real architecture such as sm_90 or sm_80, got {args.arch!r}")
    roots = _roots(args.root)
    lib = ctypes.CDLL(_find(roots, "cuda_nvrtc", "lib", "libnvrtc.so.12"))
    include = os.path.dirname(_find(roots, "cuda_runtime", "include", "cuda_bf16.h"))
    ptxas = _find(roots, "cuda_nvcc", "bin", "ptxas")
    if args.chain:
        if args.host or args.ptx_out:
            raise SystemExit("--chain takes only --root, --arch, --sass, --kernels and --src-dir (--host / "
                             "--ptx-out are the skinny GEMM's)")
        if args.kernels is not None:
            try:
                re.compile(args.kernels)
            except re.error as e:
                raise SystemExit(f"--kernels must be a Python regular expression, got {args.kernels!r}: {e}")
            if not any(re.search(args.kernels, n) for n in chain_kernels() + ut_kernels()):
                raise SystemExit(f"--kernels {args.kernels!r} matches none of the chain-verify kernels")
        return chain_main(args, lib, include, ptxas)
    if args.kernels is not None or args.src_dir != HERE:
        raise SystemExit("--kernels and --src-dir go with --chain")
    names = kernels()
    src = '#include "skinny_gemm_kernels.cuh"\n'
    ptx = compile_ptx(lib, src, include, names, args.arch.replace("sm_", "compute_"))
    if args.ptx_out:
        try:
            with open(args.ptx_out, "w") as f:
                f.write(ptx)
        except OSError as e:
            print(f"--ptx-out: could not write {args.ptx_out!r}: {e}", file=sys.stderr)
    r, listing = ptxas_build(ptxas, ptx, args.arch, args.sass)
    sass_bad = 0
    if args.sass and r.returncode == 0:
        if listing is None:
            print("--sass: no nvdisasm found (PATH, Triton's wheel)")
            sass_bad = 1
        else:
            loads = sass_pre_wait_loads(listing)
            bad = set(pdl_violations(loads))
            for fn, (pre, total) in sorted(loads.items()):
                flag = ("  READS NON-WEIGHT DATA BEFORE THE WAIT" if fn in bad else
                        "  LOADS NO WEIGHTS BEFORE THE WAIT" if not pre else "")
                print(f"  {len(pre):3d} of {total:3d} global loads before griddepcontrol.wait  {_demangle(fn)}{flag}")
                sass_bad += fn in bad or not pre
    if r.returncode:
        print(r.stdout + r.stderr)
        return 1
    problems = report(r.stdout + r.stderr, names, args.arch, "SPILL")
    if problems is None:
        return 1
    host = host_check(roots) if args.host else 0
    if sass_bad:
        print(f"--sass: {sass_bad} kernel(s) read non-weight data or no weights before griddepcontrol.wait")
    return 1 if problems or host or sass_bad else 0


def _demangle(name: str) -> str:
    try:
        return subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip() or name
    except OSError:
        return name


if __name__ == "__main__":
    sys.exit(main())
