"""``csrc/cuda/nvrtc_check.py``: the skinny GEMM's device code compiles for sm_90 with NVRTC + ptxas,
with no register spills, for every instantiation ``skinny_gemm.cu`` launches, and its host code passes
``g++ -fsyntax-only``. The compile tests skip unless the CUDA 12 NVRTC / runtime-header / nvcc / CCCL
wheels are installed (``make setup`` installs them, so CI runs them)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "csrc", "cuda"))
import nvrtc_check  # noqa: E402


def test_kernel_list_matches_the_dispatch():
    """The script instantiates exactly the (warps, unroll) pairs of ``dispatch_cfg``'s SG_CASE list,
    both dtypes, both tile counts, with and without the residual; and of the float8 form's SG8_CASE
    list (one tile), with and without the residual."""
    src = open(os.path.join(ROOT, "csrc", "cuda", "skinny_gemm.cu")).read()
    cases = set(re.findall(r"SG_CASE\((\d+), (\d+)\)", src.split("#undef SG_CASE")[0].split("#define SG_CASE")[1]))
    cases8 = set(re.findall(r"SG8_CASE\((\d+), (\d+)\)",
                            src.split("#undef SG8_CASE")[0].split("#define SG8_CASE")[1]))
    names = nvrtc_check.kernels()
    split = [n for n in names if re.search(r"skinny_gemm_kernel<[^>]+, (true|false), true>$", n)]  # SPLIT
    bf = [n for n in names if "skinny_gemm_kernel<" in n and n not in split]
    f8 = [n for n in names if "skinny_gemm_fp8_kernel<" in n]
    got = {tuple(re.search(r"<[^,]+, \d, (\d+), (\d+),", n).groups()) for n in bf}
    assert got == cases and len(bf) == len(cases) * 2 * 2 * 2
    split_launch = "dispatch_res<{}, 1, 8, 8, true>"  # (its last argument is SPLIT, not the residual)
    assert all(split_launch.format(t) in src for t in ("__nv_bfloat16", "__half"))
    assert len(split) == 4 and all(re.search(r"<[^,]+, 1, 8, 8, (true|false), true>$", n) for n in split)
    got8 = {tuple(re.search(r"<1, (\d+), (\d+),", n).groups()) for n in f8}
    assert got8 == cases8 and len(f8) == len(cases8) * 2 and len(names) == len(bf) + len(split) + len(f8)


def test_ptxas_log_parsing():
    """``check`` finds every entry function and flags spills and stack frames (register arrays put
    in local memory spill nothing but need a stack frame); a kernel without shared memory still gets
    its register count."""
    log = """ptxas info    : Compiling entry function '_Z1aPf' for 'sm_90'
ptxas info    : Function properties for _Z1aPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, 4608 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function '_Z1bPf' for 'sm_90'
ptxas info    : Function properties for _Z1bPf
    288 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, 400 bytes cmem[0]
ptxas info    : Compiling entry function '_Z1cPf' for 'sm_90'
ptxas info    : Function properties for _Z1cPf
    8 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, 9216 bytes smem, 400 bytes cmem[0]
"""
    recs, problems = nvrtc_check.check(log)
    assert [(r["name"], r["regs"], r["smem"], r["stack"], r["spill"]) for r in recs] == [
        ("_Z1aPf", 128, 4608, 0, 0), ("_Z1bPf", 40, 0, 288, 0), ("_Z1cPf", 255, 9216, 8, 12)]
    assert len(problems) == 2 and "288 bytes stack frame" in problems[0] and "12 bytes spilled" in problems[1]


def _have_wheels() -> bool:
    spec = importlib.util.find_spec("nvidia")
    if not spec or not spec.submodule_search_locations:
        return False
    need = (("cuda_nvrtc", "lib", "libnvrtc.so.12"), ("cuda_runtime", "include", "cuda_bf16.h"),
            ("cuda_nvcc", "bin", "ptxas"), ("cuda_cccl", "include", "nv", "target"))
    return all(any(os.path.exists(os.path.join(p, *n)) for p in spec.submodule_search_locations) for n in need)


@pytest.mark.skipif(not _have_wheels(), reason="needs the nvidia-cuda-nvrtc / -runtime / -nvcc cu12 wheels")
def test_device_code_compiles_without_spills():
    """Every instantiation is compiled and reported by ptxas (one register line each), none spills."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONOPTIMIZE"}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "csrc", "cuda", "nvrtc_check.py")], capture_output=True,
                       text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    n = len(nvrtc_check.kernels())
    assert sum(" regs " in line for line in r.stdout.splitlines()) == n
    assert f"{n} kernels compiled for sm_90; 0 with spills" in r.stdout


@pytest.mark.skipif(not _have_wheels() or shutil.which("g++") is None, reason="needs the CUDA 12 wheels and g++")
def test_host_code_syntax_and_a_mutation(tmp_path):
    """``--host``: ``skinny_gemm.cu`` passes ``g++ -fsyntax-only``; a copy whose launch drops a kernel
    argument fails it (the check sees the launcher's argument types)."""
    roots = nvrtc_check._roots(None)
    assert nvrtc_check.host_check(roots) == 0
    src = open(os.path.join(ROOT, "csrc", "cuda", "skinny_gemm.cu")).read()
    bad = src.replace("static_cast<long long>(pf_bytes), pf_first);", "static_cast<long long>(pf_bytes));")
    assert bad != src
    (tmp_path / "skinny_gemm.cu").write_text(bad)
    shutil.copy(os.path.join(ROOT, "csrc", "cuda", "skinny_gemm_kernels.cuh"), tmp_path)
    assert nvrtc_check.host_check(roots, str(tmp_path / "skinny_gemm.cu")) != 0
