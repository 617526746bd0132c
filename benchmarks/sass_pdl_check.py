#!/usr/bin/env python
"""The programmatic-dependent-launch contract in the SASS of the JIT-built CUDA extensions (run on the GPU machine).

Under PDL a kernel may start while its predecessor still runs; before ``griddepcontrol.wait`` (``ACQBULK`` in SASS)
it may read only model weights (``ops/pdl.py``). ptxas may move read-only-path loads (``ld.global.nc``, ``__ldg``,
``const __restrict__``) across the wait, so the source order proves nothing: this script disassembles the built
extensions (``cuobjdump -sass``) and lists, per kernel, the global loads issued before the first ``ACQBULK``.

* ``vllm_specla_gemm_jit*`` (the skinny GEMM): only ``L1::no_allocate`` weight loads (``.NA``) may come first, and
  each kernel must issue some (its first weight batch; ``csrc/cuda/nvrtc_check.py --sass`` checks the same on an
  NVRTC build without a GPU).
* ``vllm_specla_cuda_jit`` (the chain-verify kernels, ``csrc/cuda/chain_verify*.cu``): they call ``pdl_enter()``
  first and read no weights, so no global load may come first.

Prints one line per kernel with loads before the wait and a summary; exits 1 when a kernel breaks its rule.
Builds what is missing first (``--build``: ``_cpp.load_cuda()`` / ``load_cuda_gemm()``)::

    python benchmarks/sass_pdl_check.py --build
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "csrc", "cuda"))
import nvrtc_check  # noqa: E402


def cuobjdump_to_listing(text: str) -> str:
    """``cuobjdump -sass`` output in the ``.text.NAME:`` form that ``nvrtc_check.sass_pre_wait_loads`` reads."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*Function\s*:\s*(\S+)", line)
        out.append(f".text.{m.group(1)}:" if m else line)
    return "\n".join(out)


def rule_violations(loads: dict[str, tuple[list[str], int]], gemm: bool) -> set[str]:
    """The kernels of ``loads`` (``nvrtc_check.sass_pre_wait_loads``: name -> (load ops before the wait, loads)) that
    break their extension's rule: the skinny GEMM's (``gemm``) may load only weights (``L1::no_allocate``) before the
    wait and must load some (a kernel with none lost its pre-wait weight batch, as the ``.nc`` form of sessions 15-34
    did); the chain kernels may load nothing before it."""
    if gemm:
        return set(nvrtc_check.pdl_violations(loads)) | {f for f, (pre, _) in loads.items() if not pre}
    return {f for f, (pre, _) in loads.items() if pre}


def extension_dirs() -> list[str]:
    """Where torch's JIT builds live (``TORCH_EXTENSIONS_DIR`` or torch's default)."""
    from torch.utils.cpp_extension import _get_build_directory  # noqa: PLC0415

    base = os.path.dirname(_get_build_directory("vllm_specla_probe", verbose=False))
    return sorted(glob.glob(os.path.join(base, "vllm_specla_*")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", action="store_true", help="build the CUDA extensions first (needs nvcc and a GPU)")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    args = ap.parse_args()
    if args.build:
        sys.path.insert(0, ROOT)
        from vllm_specla.ops import _cpp  # noqa: PLC0415

        print("chain kernels built:", _cpp.load_cuda(), "| skinny GEMM built:", _cpp.load_cuda_gemm(), flush=True)
    bad = 0
    seen = 0
    for d in extension_dirs():
        for so in sorted(glob.glob(os.path.join(d, "*.so"))):
            r = subprocess.run([args.cuobjdump, "-sass", so], capture_output=True, text=True)
            if r.returncode and "does not contain device code" in r.stderr:
                continue  # a host-only build (VLLM_SPECLA_CPP_JIT's C++ CPU ops): nothing to check
            if r.returncode:
                print(f"{so}: cuobjdump failed: {r.stderr.strip()[:200]}")
                bad += 1
                continue
            loads = nvrtc_check.sass_pre_wait_loads(cuobjdump_to_listing(r.stdout))
            gemm = "gemm" in os.path.basename(d)
            viol = rule_violations(loads, gemm)
            n_pre = sum(1 for pre, _ in loads.values() if pre)
            print(f"{os.path.basename(d)}/{os.path.basename(so)}: {len(loads)} kernels, {n_pre} with loads before the "
                  f"wait, {len(viol)} breaking the rule ({'weights only, at least one' if gemm else 'none'})")
            for fn, (pre, total) in sorted(loads.items()):
                if pre or fn in viol:
                    tag = "VIOLATION" if fn in viol else "ok"
                    print(f"   {tag:9s} {len(pre):3d} of {total:3d} loads before the wait ({', '.join(sorted(set(pre)))})"
                          f"  {nvrtc_check._demangle(fn)[:140]}")
            bad += len(viol)
            seen += len(loads)
    if not seen:
        print("no built vllm_specla CUDA extension found (run with --build)")
        return 1
    print(f"{seen} kernels checked, {bad} breaking the PDL contract")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
