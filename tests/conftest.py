"""Shared fixtures: tiny random GDN checkpoints (fp32) written in fla's format, built once."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from helpers import make_tiny_pair  # noqa: E402

# The GPU test files choose their kernels themselves (the CUDA csrc / skinny GEMM tests load them, the runtime tests
# compare against the Triton / cuBLAS forms): the runtime's default of building and using the CUDA kernels on first
# use (ops/_cpp.py load_cuda_kernels) would otherwise switch them on for every later file of the process. Set
# VLLM_SPECLA_CUDA_KERNELS=auto to run the GPU tests as a user's process runs (benchmarks/RESULTS.md "Session 44").
os.environ.setdefault("VLLM_SPECLA_CUDA_KERNELS", "0")


def pytest_configure(config):
    config.addinivalue_line("markers", "vllm: starts vLLM engines (slow; shared per module)")
    config.addinivalue_line("markers", "gpu: needs CUDA")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """``{"target", "same", "perturbed", "random_eagle", "random_draft"}`` checkpoint dirs."""
    return make_tiny_pair(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)
