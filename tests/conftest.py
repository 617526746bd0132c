"""Shared fixtures: tiny random GDN checkpoints (fp32) written in fla's format, built once."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

from helpers import make_tiny_pair  # noqa: E402


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
