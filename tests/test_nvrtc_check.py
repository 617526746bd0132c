"""``csrc/cuda/nvrtc_check.py``: the skinny GEMM's device code compiles for sm_90 with NVRTC + ptxas,
with no register spills, for every instantiation ``skinny_gemm.cu`` launches, and its host code passes
``g++ -fsyntax-only``; the chain-verify kernels (``chain_verify*.cu``, ``--chain``) compile and read nothing before
their PDL wait. The compile tests skip unless the CUDA 12 NVRTC / runtime-header / nvcc / CCCL
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


def test_sass_load_parsing():
    """``sass_pre_wait_loads`` splits an ``nvdisasm -c`` listing per function at the first ``ACQBULK``
    (``griddepcontrol.wait``), predicated loads and ``cp.async`` copies (``LDGSTS``) included; ``pdl_violations`` names the functions that load
    anything but ``L1::no_allocate`` weights (``.NA``) before it."""
    listing = """
        .text._Z1aPf:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @!P0 LDG.E.NA.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   ACQBULK ;
        /*0030*/                   LDG.E.128 R8, desc[UR4][R6.64] ;
        .text._Z1bPf:
        /*0000*/                   LDG.E.128.CONSTANT R8, desc[UR4][R6.64] ;
        /*0010*/                   ACQBULK ;
        /*0020*/                   LDG.E.NA.128.CONSTANT R4, desc[UR4][R2.64] ;
        .text._Z1cPf:
        /*0000*/                   LDG.E R2, desc[UR4][R2.64] ;
        .text._Z1dPf:
        /*fff0*/                   LDGSTS.E.128 [R3], desc[UR4][R4.64] ;
        /*10000*/                  LDGDEPBAR ;
        /*10010*/                  LD.E R5, desc[UR4][R6.64] ;
        /*10020*/                  ACQBULK ;
        /*10030*/                  LDS R7, [R3] ;
"""
    loads = nvrtc_check.sass_pre_wait_loads(listing)
    assert loads == {"_Z1aPf": (["LDG.E.NA.128"], 2), "_Z1bPf": (["LDG.E.128.CONSTANT"], 2), "_Z1cPf": (["LDG.E"], 1),
                     "_Z1dPf": (["LDGSTS.E.128", "LD.E"], 2)}  # (async copies count; barriers, shared loads do not;
    # 5-digit offsets)
    assert nvrtc_check.pdl_violations(loads) == ["_Z1bPf", "_Z1cPf", "_Z1dPf"]


@pytest.mark.skipif(not _have_wheels() or nvrtc_check.nvdisasm() is None,
                    reason="needs the CUDA 12 wheels and an nvdisasm (Triton's wheel ships one)")
def test_sass_reads_only_weights_before_the_pdl_wait():
    """No kernel reads activations, residuals or scales before ``griddepcontrol.wait`` in SASS (with x as
    ``const __restrict__`` NVVM used the read-only path, which ptxas moved above the wait), and each issues its first
    weight batch, 2 U loads per lane, before it (coherent loads: the ``.nc`` form was issued after the wait)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONOPTIMIZE"}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "csrc", "cuda", "nvrtc_check.py"), "--sass"],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rows = [re.match(r"\s*(\d+) of\s+(\d+) global loads before griddepcontrol.wait\s+(.*)$", line)
            for line in r.stdout.splitlines()]
    rows = [m for m in rows if m]
    assert len(rows) == len(nvrtc_check.kernels())
    for m in rows:
        pre_n, name = int(m.group(1)), m.group(3)
        u = re.search(r"skinny_gemm(?:_fp8)?_kernel<(?:[^,]+, )?\d+, \d+, (\d+), ", name)
        assert u, name
        assert pre_n == 2 * int(u.group(1)), (pre_n, name)


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


def test_cuobjdump_listing_for_the_gpu_check():
    """``benchmarks/sass_pdl_check.py`` (run on the GPU machine over the JIT-built extensions) reads
    ``cuobjdump -sass`` output through the same parser: ``Function : NAME`` headers, encodings after each op."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import sass_pdl_check  # noqa: PLC0415

    text = """
	code for sm_90
		Function : _Z1kPf
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90"
        /*0040*/                   LDG.E.NA R0, desc[UR4][R2.64] ;         /* 0x0000000402007981 */
                                                                           /* 0x001ea8000c5e1900 */
        /*0060*/                   ACQBULK ;                               /* 0x000000000000782e */
        /*0070*/                   LDG.E R6, desc[UR4][R4.64] ;            /* 0x0000000404067981 */
		Function : _Z1jPf
        /*0000*/              @!P0 LDG.E.CONSTANT R6, desc[UR4][R4.64] ;   /* 0x0000000404067981 */
        /*0010*/                   ACQBULK ;                               /* 0x000000000000782e */
"""
    loads = nvrtc_check.sass_pre_wait_loads(sass_pdl_check.cuobjdump_to_listing(text))
    assert loads == {"_Z1kPf": (["LDG.E.NA"], 2), "_Z1jPf": (["LDG.E.CONSTANT"], 1)}
    assert nvrtc_check.pdl_violations(loads) == ["_Z1jPf"]
    # the rules per extension: the skinny GEMM loads weights only, and some, before the wait; the chain kernels none
    loads["_Z1wPf"] = ([], 3)
    assert sass_pdl_check.rule_violations(loads, gemm=True) == {"_Z1jPf", "_Z1wPf"}
    assert sass_pdl_check.rule_violations(loads, gemm=False) == {"_Z1kPf", "_Z1jPf"}


def _chain_sources() -> str:
    return "".join(open(os.path.join(ROOT, "csrc", "cuda", f)).read() for f in ("chain_verify.cu", "chain_verify_ut.cu"))


def test_chain_kernel_lists_cover_every_launched_kernel():
    """``--chain`` compiles every ``__global__`` template of ``chain_verify*.cu`` that a launch names: each kernel
    template appears in ``chain_kernels()`` / ``ut_kernels()``, no instantiation twice, and each instantiation's
    argument count matches its template's parameter count (NVRTC would reject a wrong one, but a default
    argument could hide a missing one)."""
    src = _chain_sources()
    kernels = {name: params.count(",") + 1 for params, name in
               re.findall(r"template <([^>]*)>\s*__global__ void __launch_bounds__\(.*?\)\s*(\w+)\(", src, re.DOTALL)}
    referenced = set(re.findall(r"\b(chain_verify\w*_kernel\w*)<", src))  # (launches, occupancy queries)
    names = nvrtc_check.chain_kernels() + nvrtc_check.ut_kernels()
    assert len(names) == len(set(names))
    used = {re.search(r"::(\w+)<", n).group(1) for n in names}
    assert set(kernels) == used == referenced, (set(kernels), used, referenced)
    for n in names:
        name, args = re.search(r"::(\w+)<(.*)>$", n).groups()
        assert args.count(",") + 1 == kernels[name], n


@pytest.mark.skipif(not _have_wheels() or nvrtc_check.nvdisasm() is None,
                    reason="needs the CUDA 12 wheels and an nvdisasm (Triton's wheel ships one)")
def test_chain_kernels_read_nothing_before_the_pdl_wait():
    """``--chain --sass``: every chain-verify kernel instantiation (``chain_verify.cu``, ``chain_verify_ut.cu``)
    compiles for sm_90 and issues no global read (loads, ``cp.async``, bulk copies) before ``griddepcontrol.wait``
    in SASS. They read q / k / v / g / beta, banks and the state through ``__ldg`` (``ld.global.nc``) as well, which
    ptxas may move across the wait: this is what the source order cannot show."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONOPTIMIZE"}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "csrc", "cuda", "nvrtc_check.py"), "--chain", "--sass"],
                       capture_output=True, text=True, timeout=900, env=env, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rows = re.findall(r"^\s*(\d+) of\s+(\d+) global reads before griddepcontrol.wait\s+(.*)$", r.stdout, re.MULTILINE)
    assert len(rows) == len(nvrtc_check.chain_kernels()) + len(nvrtc_check.ut_kernels())
    assert all(int(pre) == 0 and int(total) > 0 for pre, total, _ in rows)
    assert "--sass: 0 kernel(s) read global memory before griddepcontrol.wait" in r.stdout


@pytest.mark.skipif(not _have_wheels() or nvrtc_check.nvdisasm() is None,
                    reason="needs the CUDA 12 wheels and an nvdisasm (Triton's wheel ships one)")
def test_chain_check_flags_a_read_before_the_wait(tmp_path):
    """A copy of the sources whose sb kernel reads ``g`` (coherently, which ptxas keeps in source order) before
    ``pdl_enter()`` fails ``--chain --sass`` with each of its instantiations named; the unmodified sb kernels pass."""
    for f in ("chain_verify.cu", "chain_verify_ut.cu", "chain_verify.cuh"):
        shutil.copy(os.path.join(ROOT, "csrc", "cuda", f), tmp_path)
    src = (tmp_path / "chain_verify.cu").read_text()
    head = "__global__ void __launch_bounds__(32) chain_verify_sb_kernel(const ChainVerifyParams p) {\n  pdl_enter();"
    assert head in src
    (tmp_path / "chain_verify.cu").write_text(src.replace(head, head.replace(
        "  pdl_enter();", "  const float g0 = p.g[blockIdx.z];\n  pdl_enter();\n  if (g0 == 12345.f) p.o[0] = g0;")))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONOPTIMIZE"}
    base = [sys.executable, os.path.join(ROOT, "csrc", "cuda", "nvrtc_check.py"), "--chain", "--sass",
            "--kernels", "sb_kernel"]
    good = subprocess.run(base, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert good.returncode == 0, good.stdout[-2000:] + good.stderr[-2000:]
    bad = subprocess.run(base + ["--src-dir", str(tmp_path)], capture_output=True, text=True, timeout=300, env=env, check=False)
    assert bad.returncode == 1, bad.stdout[-2000:] + bad.stderr[-2000:]
    flagged = re.findall(r"^\s*1 of\s+\d+ global reads before griddepcontrol.wait\s+.*chain_verify_sb_kernel<(\d, \d+)>"
                         r".*READS BEFORE THE WAIT$", bad.stdout, re.MULTILINE)
    assert sorted(flagged) == ["1, 16", "1, 32", "2, 16", "2, 32"]
    assert "--sass: 4 kernel(s) read global memory before griddepcontrol.wait" in bad.stdout
