"""``ops/_cpp.py`` ``load_cuda_kernels``: the CUDA csrc kernels as the GPU paths' default, on the CPU.

The builds themselves run on a GPU (``tests/test_csrc.py -k cuda``, ``tests/test_decode_runtime_gpu.py``); here the
rules around them: the env var's values, no build without CUDA, a failed build falls back with one warning
(``auto``) or raises (``1``), a kept result, and the runtime / engine calling it on CUDA only.
"""

from __future__ import annotations

import logging

import pytest
import torch

from vllm_specla.ops import _cpp


@pytest.fixture
def fresh(monkeypatch):
    """A process where nothing is loaded or tried yet (both kernels switched on, the CPU extension there),
    restored afterwards."""
    from vllm_specla.ops import chain_verify, fused

    monkeypatch.setattr(_cpp, "_CUDA_KERNEL_ERRORS", {})
    monkeypatch.setattr(_cpp, "CUDA_LOADED", False)
    monkeypatch.setattr(_cpp, "GEMM_LOADED", False)
    monkeypatch.setattr(_cpp, "_ensure_cpu_extension", lambda: None)
    monkeypatch.setattr(chain_verify, "USE_CUDA_CSRC", True)
    monkeypatch.setattr(fused, "USE_SKINNY_GEMM", True)
    monkeypatch.delenv(_cpp.CUDA_KERNELS_ENV, raising=False)
    return monkeypatch


def test_no_build_without_cuda(fresh):
    calls = []
    fresh.setattr(torch.cuda, "is_available", lambda: False)
    fresh.setattr(_cpp, "load_cuda", lambda: calls.append("cv"))
    fresh.setattr(_cpp, "load_cuda_gemm", lambda: calls.append("gemm"))
    for mode in ("auto", "1", "0", ""):
        fresh.setenv(_cpp.CUDA_KERNELS_ENV, mode)
        assert _cpp.load_cuda_kernels() == {"chain_verify": False, "skinny_gemm": False}
    assert calls == []


@pytest.mark.parametrize("bad", ["yes", "2", "on", "true"])
def test_bad_env_value_names_the_variable(fresh, bad):
    fresh.setenv(_cpp.CUDA_KERNELS_ENV, bad)
    with pytest.raises(ValueError, match=rf"VLLM_SPECLA_CUDA_KERNELS='{bad}': must be 'auto' .* '1' .* '0'"):
        _cpp.load_cuda_kernels()


def _fake_cuda(fresh, cv_ok: bool, gemm_ok: bool):
    calls = []

    def cv():
        calls.append("cv")
        if not cv_ok:
            raise RuntimeError("error: nvcc not found\n  (long build log)\nnvcc: command not found")
        fresh.setattr(_cpp, "CUDA_LOADED", True)
        return True

    def gemm():
        calls.append("gemm")
        if not gemm_ok:
            raise OSError("ninja: build stopped")
        fresh.setattr(_cpp, "GEMM_LOADED", True)
        return True

    fresh.setattr(torch.cuda, "is_available", lambda: True)
    fresh.setattr(_cpp, "load_cuda", cv)
    fresh.setattr(_cpp, "load_cuda_gemm", gemm)
    return calls


def test_auto_builds_both_once_and_keeps_the_result(fresh):
    calls = _fake_cuda(fresh, True, True)
    assert _cpp.load_cuda_kernels() == {"chain_verify": True, "skinny_gemm": True}
    assert _cpp.load_cuda_kernels() == {"chain_verify": True, "skinny_gemm": True}
    assert calls == ["cv", "gemm"]


def test_auto_falls_back_with_one_warning(fresh, caplog):
    calls = _fake_cuda(fresh, False, True)
    with caplog.at_level(logging.WARNING, logger="vllm.specla"):
        got = _cpp.load_cuda_kernels()
        assert _cpp.load_cuda_kernels() == got  # kept: no second try, no second warning
    assert got == {"chain_verify": False, "skinny_gemm": True}
    assert calls == ["cv", "gemm"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert "Triton / cuBLAS kernels instead" in msg and "chain_verify: RuntimeError: nvcc: command not found" in msg
    assert "VLLM_SPECLA_CUDA_KERNELS=0" in msg


def test_a_failure_under_auto_is_not_retried_but_mode_1_raises_it(fresh):
    calls = _fake_cuda(fresh, False, True)
    assert _cpp.load_cuda_kernels()["chain_verify"] is False
    fresh.setenv(_cpp.CUDA_KERNELS_ENV, "1")
    with pytest.raises(RuntimeError, match=r"chain_verify: RuntimeError: nvcc: command not found"):
        _cpp.load_cuda_kernels()
    assert calls == ["cv", "gemm"]


def test_switched_off_kernels_are_not_built(fresh, caplog):
    """``chain_verify.USE_CUDA_CSRC`` / ``fused.USE_SKINNY_GEMM`` off (``--no-cuda-csrc``, ``--skinny-gemm off``,
    their env vars): no nvcc build, and no warning about a kernel the user turned off, even under mode 1."""
    from vllm_specla.ops import chain_verify, fused

    calls = _fake_cuda(fresh, False, True)
    fresh.setattr(chain_verify, "USE_CUDA_CSRC", False)
    fresh.setenv(_cpp.CUDA_KERNELS_ENV, "1")
    with caplog.at_level(logging.WARNING, logger="vllm.specla"):
        assert _cpp.load_cuda_kernels() == {"chain_verify": False, "skinny_gemm": True}
    assert calls == ["gemm"] and not [r for r in caplog.records if r.levelno == logging.WARNING]
    fresh.setattr(fused, "USE_SKINNY_GEMM", False)
    fresh.setattr(_cpp, "GEMM_LOADED", False)
    assert _cpp.load_cuda_kernels() == {"chain_verify": False, "skinny_gemm": False}
    assert calls == ["gemm"]


def test_the_chain_verify_needs_the_cpu_extension_first(fresh):
    """A source checkout without the C++ CPU extension: it is JIT-built (``_ensure_cpu_extension``) before the CUDA
    chain verify; where that fails the cause is in the warning / mode-1 error."""
    calls = _fake_cuda(fresh, True, True)

    def no_ext():
        calls.append("cpu-ext")
        raise RuntimeError("the C++ CPU extension (op schemas) is not loaded (x) and its JIT build failed: no g++")

    fresh.setattr(_cpp, "_ensure_cpu_extension", no_ext)
    fresh.setenv(_cpp.CUDA_KERNELS_ENV, "1")
    with pytest.raises(RuntimeError, match=r"chain_verify: RuntimeError: .*JIT build failed: no g\+\+"):
        _cpp.load_cuda_kernels()
    assert calls == ["cpu-ext", "gemm"]


def test_mode_1_raises_with_the_cause(fresh):
    _fake_cuda(fresh, True, False)
    fresh.setenv(_cpp.CUDA_KERNELS_ENV, "1")
    with pytest.raises(RuntimeError, match=r"VLLM_SPECLA_CUDA_KERNELS=1 but .* skinny_gemm: OSError: ninja: build stopped"):
        _cpp.load_cuda_kernels()


def test_mode_0_builds_nothing(fresh):
    calls = _fake_cuda(fresh, True, True)
    fresh.setenv(_cpp.CUDA_KERNELS_ENV, "0")
    assert _cpp.load_cuda_kernels() == {"chain_verify": False, "skinny_gemm": False}
    assert calls == []


def test_the_cpu_runtime_and_engine_do_not_build(fresh, tiny_dir):
    """On CPU tensors neither the decode runtime nor the engine asks for the CUDA kernels."""
    from vllm_specla.models.gdn import load_fla_checkpoint
    from vllm_specla.runtime.decode import DecodeRuntime
    from vllm_specla.runtime.engine import SpecLAEngine
    from vllm_specla.runtime.fused_model import FusedTarget

    calls = []
    fresh.setattr(_cpp, "load_cuda_kernels", lambda: calls.append(1))
    tm = load_fla_checkpoint(tiny_dir["target"])
    DecodeRuntime(FusedTarget(tm, torch.float32, "cpu"), 1, "ar")
    SpecLAEngine(tm, max_batch=2)
    assert calls == []


def test_decode_runtime_asks_for_them_on_cuda(fresh, tiny_dir):
    """The runtime's hook: a target whose embedding says CUDA makes DecodeRuntime call load_cuda_kernels before
    anything else (the stand-in hook stops it there: this CPU machine has no CUDA)."""
    from vllm_specla.models.gdn import load_fla_checkpoint
    from vllm_specla.runtime.decode import DecodeRuntime
    from vllm_specla.runtime.fused_model import FusedTarget

    class Stop(Exception):
        pass

    def hook():
        raise Stop

    fresh.setattr(_cpp, "load_cuda_kernels", hook)
    tgt = FusedTarget(load_fla_checkpoint(tiny_dir["target"]), torch.float32, "cpu")

    class _Dev:
        type = "cuda"

    class _Embed:
        device = _Dev()

    tgt.embed = _Embed()
    with pytest.raises(Stop):
        DecodeRuntime(tgt, 1, "ar")


def test_engine_asks_for_them_on_cuda(fresh):
    """The core engine's hook: a target whose parameters are on CUDA makes SpecLAEngine call load_cuda_kernels
    before it allocates state slots (a stand-in target; the stand-in hook stops it there)."""
    from types import SimpleNamespace

    from vllm_specla.runtime.engine import SpecLAEngine

    class Stop(Exception):
        pass

    def hook():
        raise Stop

    class Target:
        config = SimpleNamespace(vocab_size=100)

        def parameters(self):
            yield SimpleNamespace(device=torch.device("cuda"))

    fresh.setattr(_cpp, "load_cuda_kernels", hook)
    with pytest.raises(Stop):
        SpecLAEngine(Target(), max_batch=2)
