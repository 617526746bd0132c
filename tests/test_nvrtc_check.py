"""``csrc/cuda/nvrtc_check.py``: the skinny GEMM's device code compiles for sm_90 with NVRTC + ptxas,
with no register spills, for every instantiation ``skinny_gemm.cu`` launches. Skipped unless the
CUDA 12 NVRTC / runtime-header / nvcc wheels are installed (``pip install nvidia-cuda-nvrtc-cu12
nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12``); CI does not install them."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "csrc", "cuda"))
import nvrtc_check  # noqa: E402


def test_kernel_list_matches_the_dispatch():
    """The script instantiates exactly the (warps, unroll) pairs of ``dispatch_cfg``'s SG_CASE list,
    both dtypes, both tile counts, with and without the residual."""
    src = open(os.path.join(ROOT, "csrc", "cuda", "skinny_gemm.cu")).read()
    cases = set(re.findall(r"SG_CASE\((\d+), (\d+)\)", src.split("#undef SG_CASE")[0].split("#define SG_CASE")[1]))
    names = nvrtc_check.kernels()
    got = {tuple(re.search(r"<[^,]+, \d, (\d+), (\d+),", n).groups()) for n in names}
    assert got == cases and len(names) == len(cases) * 2 * 2 * 2


def _have_wheels() -> bool:
    spec = importlib.util.find_spec("nvidia")
    if not spec or not spec.submodule_search_locations:
        return False
    return any(os.path.exists(os.path.join(p, "cuda_nvrtc")) and os.path.exists(os.path.join(p, "cuda_nvcc", "bin"))
               for p in spec.submodule_search_locations)


@pytest.mark.skipif(not _have_wheels(), reason="needs the nvidia-cuda-nvrtc / -runtime / -nvcc cu12 wheels")
def test_device_code_compiles_without_spills():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "csrc", "cuda", "nvrtc_check.py")], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"{len(nvrtc_check.kernels())} kernels compiled for sm_90; 0 with spills" in r.stdout
