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


# ---- _build_and_load: the JIT builds one process at a time, and a lock left by a killed build ----


@pytest.fixture
def ext_dir(tmp_path, monkeypatch):
    """``TORCH_EXTENSIONS_DIR`` in tmp_path, and ``cpp_extension.load`` replaced by a fake that keeps torch's
    protocol (``torch/utils/cpp_extension.py`` ``_jit_compile``): create ``lock`` exclusively, build, remove it;
    a process that cannot create it polls until it is gone (``FileBaton.wait``), here with a limit (20 s; the third
    item, a one-element list, sets it)."""
    import os
    import time

    from torch.utils import cpp_extension
    from torch.utils.file_baton import FileBaton

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    built, limit = [], [20.0]

    def fake_load(name, build_directory, **kwargs):
        baton = FileBaton(os.path.join(build_directory, "lock"))
        if baton.try_acquire():
            try:
                with open(os.path.join(build_directory, f"{name}.so"), "w") as f:
                    f.write("built")
                built.append(name)
            finally:
                baton.release()
        else:
            t0 = time.time()
            while os.path.exists(baton.lock_file_path):
                if time.time() - t0 > limit[0]:
                    raise TimeoutError(f"waited {limit[0]} s on a lock file (torch waits forever)")
                time.sleep(0.05)

    monkeypatch.setattr(cpp_extension, "load", fake_load)
    return tmp_path, built, limit


def test_build_removes_a_lock_left_by_a_killed_build(ext_dir, caplog):
    """A torch ``lock`` file with no live builder (a build killed by SIGTERM leaves it) no longer hangs the next
    start: it is removed with one warning naming it, and the extension builds (saying so first)."""
    from torch.utils import cpp_extension

    tmp, built, _ = ext_dir
    d = cpp_extension._get_build_directory("vllm_specla_test_jit", verbose=False)
    assert d.startswith(str(tmp))
    open(f"{d}/lock", "w").close()
    with caplog.at_level(logging.WARNING, logger="vllm.specla"):
        _cpp._build_and_load("vllm_specla_test_jit", sources=[])
    assert built == ["vllm_specla_test_jit"]
    msgs = [r.getMessage() for r in caplog.records]
    assert any("removing" in m and f"{d}/lock" in m and "interrupted build" in m for m in msgs), msgs
    assert any("building vllm_specla_test_jit" in m for m in msgs), msgs
    # built and unlocked: the next load neither warns nor builds
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vllm.specla"):
        _cpp._build_and_load("vllm_specla_test_jit", sources=[])
    assert built == ["vllm_specla_test_jit"] * 2  # (the fake "builds" whenever it holds the lock)
    assert caplog.records == []


def test_build_waits_for_a_live_builder_and_keeps_its_lock(ext_dir, caplog, monkeypatch):
    """While another process builds (holding the flock, its torch ``lock`` file present), a second one waits
    (one warning once the wait passes the quiet time), does not remove that process's lock, and goes on once it is
    done."""
    import subprocess
    import sys
    import time

    from torch.utils import cpp_extension

    tmp, built, _ = ext_dir
    monkeypatch.setattr(_cpp, "_BUILD_QUIET_WAIT_S", 0.5)
    d = cpp_extension._get_build_directory("vllm_specla_test_jit", verbose=False)
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, sys, time
fl = open({d!r} + "/{_cpp._BUILD_FLOCK}", "a")
fcntl.flock(fl, fcntl.LOCK_EX)
open({d!r} + "/lock", "w").close()
print("holding", flush=True)
time.sleep(2.0)
open({d!r} + "/vllm_specla_test_jit.so", "w").write("built by the other")
os.remove({d!r} + "/lock")
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        t0 = time.time()
        with caplog.at_level(logging.WARNING, logger="vllm.specla"):
            _cpp._build_and_load("vllm_specla_test_jit", sources=[])
        waited = time.time() - t0
    finally:
        holder.wait(timeout=30)
    assert holder.returncode == 0
    assert waited > 1.0
    msgs = [r.getMessage() for r in caplog.records]
    assert any("waiting for another process building or loading vllm_specla_test_jit" in m for m in msgs), msgs
    assert not any("removing" in m or "vllm_specla: building" in m for m in msgs), msgs


def test_cuda_and_cpu_builds_go_through_the_lock(monkeypatch):
    """Both JIT builds (the CPU extension and the CUDA kernels) call ``_build_and_load``."""
    calls = []
    monkeypatch.setattr(_cpp, "_build_and_load", lambda name, **kw: calls.append((name, sorted(kw))))
    _cpp._jit_load()
    _cpp._jit_cuda("vllm_specla_gemm_jit", ["skinny_gemm.cu"], False)
    assert [c[0] for c in calls] == ["vllm_specla_C_jit", "vllm_specla_gemm_jit"]
    assert all("sources" in kw for _, kw in calls)


def test_build_without_flock_support_uses_torchs_lock_only(ext_dir, monkeypatch, caplog):
    """Where the file system refuses ``flock`` (ENOLCK) the build still runs, under torch's own lock only (the one
    warning: "building"); a lock file found then is left alone (it may be a live builder's), with a warning naming it."""
    import errno
    import fcntl

    from torch.utils import cpp_extension

    tmp, built, limit = ext_dir
    real = fcntl.flock

    def no_flock(f, op):
        if op & fcntl.LOCK_EX:
            raise OSError(errno.ENOLCK, "No locks available")
        return real(f, op)

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with caplog.at_level(logging.WARNING, logger="vllm.specla"):
        _cpp._build_and_load("vllm_specla_test_jit", sources=[])
    assert built == ["vllm_specla_test_jit"]
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["vllm_specla: building vllm_specla_test_jit"]
    d = cpp_extension._get_build_directory("vllm_specla_test_jit", verbose=False)
    open(f"{d}/lock", "w").close()
    limit[0] = 1.0
    with caplog.at_level(logging.WARNING, logger="vllm.specla"), pytest.raises(TimeoutError):
        _cpp._build_and_load("vllm_specla_test_jit", sources=[])  # torch's wait (the fake's limit): kept
    msgs = [r.getMessage() for r in caplog.records]
    assert any("no file lock" in m and f"{d}/lock" in m for m in msgs), msgs


def _hold_flock(d: str, seconds: float):
    """A process holding the build directory's flock for ``seconds`` (no torch lock file: a cached load)."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, time
fd = os.open({d!r} + "/{_cpp._BUILD_FLOCK}", os.O_RDONLY | os.O_CREAT, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
print("holding", flush=True)
time.sleep({seconds})
"""], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "holding"
    return p


def test_a_short_wait_for_a_cached_load_is_quiet(ext_dir, caplog):
    """Another process holding the flock briefly (loading a cached build, as tensor-parallel ranks starting
    together do) is waited for without a warning."""
    from torch.utils import cpp_extension

    tmp, built, _ = ext_dir
    d = cpp_extension._get_build_directory("vllm_specla_test_jit", verbose=False)
    open(f"{d}/vllm_specla_test_jit.so", "w").close()
    holder = _hold_flock(d, 0.5)
    try:
        with caplog.at_level(logging.WARNING, logger="vllm.specla"):
            _cpp._build_and_load("vllm_specla_test_jit", sources=[])
    finally:
        holder.wait(timeout=30)
    assert caplog.records == []


def test_an_interrupted_builds_running_tools_are_waited_for(ext_dir, caplog):
    """A Python parent killed while its ``ninja`` still compiles leaves torch's lock and processes working in the
    build directory: the next start waits for them (one warning naming them), then removes the lock and builds,
    instead of running a second build beside them."""
    import subprocess
    import sys
    import threading
    import time

    from torch.utils import cpp_extension

    tmp, built, _ = ext_dir
    d = cpp_extension._get_build_directory("vllm_specla_test_jit", verbose=False)
    open(f"{d}/lock", "w").close()
    # a process working in the build directory (as ninja and its compilers do) until its stdin closes
    tool = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"], cwd=d,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert tool.stdout.readline().strip() == "up"
        assert [pid for pid, _ in _cpp._processes_in(d)] == [tool.pid]
        timer = threading.Timer(1.5, tool.stdin.close)
        timer.start()
        t0 = time.time()
        with caplog.at_level(logging.WARNING, logger="vllm.specla"):
            _cpp._build_and_load("vllm_specla_test_jit", sources=[])
        waited = time.time() - t0
        timer.join()
    finally:
        if tool.poll() is None:
            tool.kill()
        tool.wait(timeout=30)
    assert waited > 1.0  # (the tool lived >= 1.5 s after the call began)
    assert built == ["vllm_specla_test_jit"]
    msgs = [r.getMessage() for r in caplog.records]
    assert any("processes still run" in m and str(tool.pid) in m for m in msgs), msgs
    assert any("removing" in m for m in msgs), msgs
    assert _cpp._processes_in(d) == []


def test_the_building_warning_also_covers_edited_sources(ext_dir, caplog, tmp_path):
    """The "building" warning shows where the build exists but a source or a header beside it is newer (an
    upgrade, an edit), and not where everything is up to date."""
    import os
    import time


    tmp, built, _ = ext_dir
    src = tmp_path / "k.cu"
    src.write_text("// kernel")
    _cpp._build_and_load("vllm_specla_test_jit", sources=[str(src)])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vllm.specla"):
        _cpp._build_and_load("vllm_specla_test_jit", sources=[str(src)])
    assert caplog.records == []
    for edited in (src, tmp_path / "k.cuh"):  # the source, then a header beside it
        edited.write_text("// edited")
        later = time.time() + 10
        os.utime(edited, (later, later))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="vllm.specla"):
            _cpp._build_and_load("vllm_specla_test_jit", sources=[str(src)])
        assert any("building vllm_specla_test_jit" in r.getMessage() for r in caplog.records), edited
        earlier = time.time() - 100  # (older than the rebuilt .so again: only the next edit is newer)
        os.utime(edited, (earlier, earlier))
