"""Loader of the C++ CPU ops (``csrc/``): ``torch.ops.vllm_specla.<name>``.

``setup.py`` builds the extension ``vllm_specla._C`` when torch and a C++ compiler are present at
install time (the Makefile installs with ``--no-build-isolation``). Importing it registers the
ops; this module wraps them with the keyword signatures of the torch references and registers
fake (meta) kernels so they trace under ``torch.compile``.

* :data:`AVAILABLE` – True when the ops are registered (the dispatchers in ``chain_verify.py`` /
  ``recover.py`` / ``tree_verify.py`` then use them for CPU tensors, else the plain-torch
  references; ``tree_verify`` takes any non-chain tree or forest);
* :data:`LOAD_ERROR` – why not, when not;
* ``VLLM_SPECLA_DISABLE_CPP=1`` – never use the C++ ops (references everywhere);
* ``VLLM_SPECLA_CPP_JIT=1`` – if the built extension is missing, compile ``csrc/`` now with
  ``torch.utils.cpp_extension.load`` (about 1-2 min, cached under ``TORCH_EXTENSIONS_DIR``);
* ``VLLM_SPECLA_CPP_OPS=chain_verify,recover`` – use the C++ ops only for these names (debug);
* ``VLLM_SPECLA_CPP_CHECK=1`` – debug: every call also runs the torch reference on copies of the
  rows' slots and raises ``RuntimeError`` if any output or mutated slot differs (slow).

The CUDA ops are JIT-built on first use: :func:`load_cuda` (the CUDA chain verify, registered for the
schemas above) and :func:`load_cuda_gemm` (the skinny GEMM of batch-1 verify windows, its own schema;
no fake kernel: the decode runtime calls it eagerly or under CUDA-graph capture, not ``torch.compile``).
:func:`load_cuda_kernels` builds both where CUDA is available, and the decode runtime, the core engine and
the vLLM GPU worker call it, so they are the default (``VLLM_SPECLA_CUDA_KERNELS=0`` turns that off).
"""

from __future__ import annotations

import glob
import logging
import os
import sys

import torch

AVAILABLE = False
LOAD_ERROR: str | None = None
CUDA_LOADED = False  # set by load_cuda(): the CUDA chain_verify is registered for CUDA tensors
CHECK = os.environ.get("VLLM_SPECLA_CPP_CHECK", "0") not in ("", "0")
_OPS = ("chain_verify", "tree_verify", "recover", "conv_verify", "conv_commit")
_ENABLED = {n.strip() for n in os.environ.get("VLLM_SPECLA_CPP_OPS", ",".join(_OPS)).split(",") if n.strip()}


def _csrc_dir() -> str:
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "csrc")


def _jit_load() -> None:
    src = _csrc_dir()
    sources = [os.path.join(src, "torch_bindings.cpp")] + sorted(glob.glob(os.path.join(src, "cpu", "*.cpp")))
    if not os.path.isfile(sources[0]):
        raise ImportError(f"no C++ sources at {src}")
    _build_and_load("vllm_specla_C_jit", sources=sources, extra_cflags=["-O3", "-fopenmp", "-fno-trapping-math"],
                    extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)


_BUILD_FLOCK = "vllm_specla_build.flock"
_BUILD_QUIET_WAIT_S = 3.0  # a wait for another process's flock shorter than this logs nothing (a cached load)


def _processes_in(directory: str) -> list[tuple[int, str]]:
    """``(pid, name)`` of this host's processes other than this one whose working directory is ``directory``
    (torch runs ``ninja`` there and its compilers inherit it; any process counts, whatever its name). Empty
    where ``/proc`` cannot be read (another user's processes are not seen)."""
    real, found = os.path.realpath(directory), []
    for entry in glob.glob("/proc/[0-9]*/cwd"):
        try:
            pid = int(entry.split("/")[2])
            if pid == os.getpid() or os.path.realpath(os.readlink(entry)) != real:
                continue
            with open(f"/proc/{pid}/comm") as f:
                found.append((pid, f.read().strip()))
        except (OSError, ValueError):  # (gone, or another user's process)
            continue
    return found


def _needs_build(build_dir: str, name: str, sources: list[str]) -> bool:
    """Whether ``load`` will compile, as far as file times tell: no ``<name>.so`` yet, or a source or a header
    (``*.h`` / ``*.cuh`` / ``*.hpp`` beside a source) newer than it. Flag changes are not seen."""
    try:
        built = os.path.getmtime(os.path.join(build_dir, f"{name}.so"))
    except OSError:
        return True
    files = set(sources)
    for d in {os.path.dirname(src) for src in sources}:
        for ext in ("h", "cuh", "hpp"):
            files.update(glob.glob(os.path.join(d, f"*.{ext}")))
    return any(os.path.getmtime(f) > built for f in files if os.path.exists(f))


def _build_and_load(name: str, **kwargs) -> None:
    """``torch.utils.cpp_extension.load(name=name, **kwargs)`` in torch's default build directory for ``name``
    (``$TORCH_EXTENSIONS_DIR/<name>``, else ``~/.cache/torch_extensions/<pyXY>_<cuXYZ or cpu>/<name>``), builds
    one process at a time.

    torch marks a build in progress with a file ``lock`` in that directory and makes every other process
    wait until the file is gone (``torch/utils/file_baton.py``, polled without a limit). A process killed
    while building (a timeout's SIGTERM, ``kill``, a container stop; an exception removes it) leaves that
    file behind, and every later start then waits on it forever without a message: the first GPU runs of
    session 45 hung that way (benchmarks/RESULTS.md). So the build here runs under an ``fcntl`` lock on
    ``vllm_specla_build.flock`` in the same directory, which the kernel releases when its holder dies (on NFS,
    where Linux emulates it with byte-range locks, it holds across hosts). With it held no other of these
    processes builds, so a torch ``lock`` file found is left over: it is removed (one warning naming it) once no
    process of this host works in that directory any more (a Python parent killed alone leaves its ``ninja`` and
    compilers running there: waited for, one warning naming them). Not covered: a cache shared by hosts whose
    ``flock`` is node-local (``local_lock=flock`` NFS mounts), where a build killed on one host while its compilers
    run on would be rebuilt beside them. A process that waits more than a few seconds for another one's flock says
    so once; a build that has to compile (:func:`_needs_build`) says so once per extension first, as it takes
    minutes. Where the file system refuses ``flock``, torch's own lock alone serializes, as before (a warning
    names a ``lock`` file present then, as torch will wait on it).

    Raises:
        OSError: the build directory or its lock file cannot be created or opened, or a left-over ``lock`` file
            cannot be removed (another user's, in a shared cache).
        whatever ``load`` raises (compiler errors, a missing ``nvcc``, ...).
    """
    import time  # noqa: PLC0415

    from torch.utils import cpp_extension  # noqa: PLC0415

    try:
        import fcntl  # noqa: PLC0415
    except ImportError:  # (not POSIX: torch's own lock only)
        fcntl = None
    build_dir = cpp_extension._get_build_directory(name, verbose=False)
    stale = os.path.join(build_dir, "lock")
    fd = None
    if fcntl is not None:
        path = os.path.join(build_dir, _BUILD_FLOCK)
        try:  # (NFS's flock emulation needs a descriptor open for writing)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:  # (another user's file in a shared cache: flock works on a read-only one locally)
            fd = os.open(path, os.O_RDONLY)
    try:
        locked = False
        if fd is not None:
            try:
                deadline = time.monotonic() + _BUILD_QUIET_WAIT_S
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            _log.warning("vllm_specla: waiting for another process building or loading %s in %s",
                                         name, build_dir)
                            fcntl.flock(fd, fcntl.LOCK_EX)
                            break
                        time.sleep(0.05)
                locked = True
            except OSError:  # (a file system without flock: torch's own lock only)
                pass
        if locked:
            warned = False
            while os.path.exists(stale):
                running = _processes_in(build_dir)
                if not running:
                    _log.warning("vllm_specla: removing %s, left by an interrupted build of %s", stale, name)
                    try:
                        os.remove(stale)
                    except FileNotFoundError:
                        pass
                    break
                if not warned:
                    _log.warning("vllm_specla: %s is held by an interrupted build of %s whose processes still run "
                                 "in %s (%s); waiting for them", stale, name, build_dir,
                                 ", ".join(f"{pid} {comm}" for pid, comm in running))
                    warned = True
                time.sleep(1.0)
        elif os.path.exists(stale):
            _log.warning("vllm_specla: no file lock in %s; torch waits until %s is gone (remove it if no build of "
                         "%s runs)", build_dir, stale, name)
        if _needs_build(build_dir, name, kwargs.get("sources", [])):
            cuda = any(str(f).endswith(".cu") for f in kwargs.get("sources", []))  # (the C++ CPU ops: under a minute)
            _log.warning("vllm_specla: building %s (%s; cached in %s)", name,
                         "minutes for the CUDA kernels with nvcc" if cuda else "the C++ CPU ops with the host compiler",
                         build_dir)
        cpp_extension.load(name=name, build_directory=build_dir, **kwargs)
    finally:
        if fd is not None:
            os.close(fd)  # (releases the flock)


def load_cuda(verbose: bool = False) -> bool:
    """JIT-build ``csrc/cuda/`` (a CUDA ``chain_verify``: v3, state tile in registers, V tiled,
    fused deferred commit, one batched warp reduction per token, next token prefetched; and the UT
    form of ``chain_verify_ut.cu``, the window as one chunk with 2T independent fp32 products per
    state tile, used for verify / SpecLA-step windows at >= 192 (row, head) pairs) and register it
    for CUDA tensors of ``torch.ops.vllm_specla.chain_verify``.

    Run on the H200 (tests/test_csrc.py, benchmarks/bench_csrc_cuda.py, RESULTS.md). Once loaded,
    the public dispatcher (``ops/chain_verify.py``) uses it per shape where it measured faster than
    Triton (verify / SpecLA-step windows at more than 16 (row, head) pairs). Needs CUDA torch, nvcc and the
    CPU extension loaded first (it defines the op schemas). Returns False when CUDA is absent.
    Small batches (at most 16 (row, head) pairs, K = 128 / 256 on the 16-byte path) run a second
    kernel, the row-group layout: each value row owns 32 / BV adjacent lanes (8 rows x 4 lanes for
    BV = 8, 4 x 8 for BV = 4) that split its keys, so a token's ``M k``, ``M q``, norms and ``k.q``
    are mostly in-thread sums plus 2-3 xor-shuffle levels, and ``v~`` / ``o`` are computed
    redundantly by the row's lanes (no broadcasts); the next token's q / k are copied to shared
    memory (cp.async) while one computes. At batch 1 the per-token dependent chain is the time,
    and v3's 5-level reduce-scatter plus broadcasts is longer (chain_verify.cu header).
    Tuning overrides read at each call: ``VLLM_SPECLA_CUDA_BV=4|8`` (value rows per warp; 0 or unset:
    automatic), ``VLLM_SPECLA_CUDA_REGCAP=0`` (no register caps), ``VLLM_SPECLA_CUDA_RG_PREFETCH=0|1`` (the
    row-group prefetch ring never / always) and
    ``VLLM_SPECLA_CUDA_LAYOUT=rowgroup|rowgroup8|rowgroup16|rowgroup32|rs|ut|sb`` (warp layout: row group with
    32 / BV, 8, 16 or 32 lanes per row, v3's reduce-scatter, the UT form (strict: an error where it does not
    apply) or the small-batch lean kernel; ``auto`` or unset: automatic), ``VLLM_SPECLA_CUDA_UT=0|1`` (the UT form never / for every verify or step window
    it takes, in the automatic layout), ``VLLM_SPECLA_CUDA_UT_NW=1`` (1 warp per CTA instead of 4),
    ``VLLM_SPECLA_CUDA_UT_TPC=n`` (value tiles per CTA; else the wave cost model) and
    ``VLLM_SPECLA_CUDA_UT_VAR=1..3`` (its build variant: per-thread cp.async refills, TMA refills,
    TMA with 16 lanes per value row; unset or empty: 2 or 3 by the cost model where the sm_90 code
    runs);
    ``VLLM_SPECLA_CUDA_UT_P5=0|1|2`` its phase 4 / 5 form for A/B runs (0: the previous phase 5, 1: v~
    in registers, 2: plus one batched reduce-scatter of the products; unset: 1 or 2 by the shuffle
    count, where built: K = 256, windows <= 8; all bit-identical) and
    ``VLLM_SPECLA_CUDA_UT_ROWCOPY=1`` one TMA copy per state row in its stage refills (default: one
    per warp tile).
    ``VLLM_SPECLA_CUDA_LAYOUT=sb`` forces the small-batch lean kernel (bf16 inputs), which the automatic layout
    uses for small-batch verify / step windows (``csrc/cuda/chain_verify.cu``, ``sb_auto``); every kernel launches
    with programmatic dependent launch on sm_90+ unless ``VLLM_SPECLA_PDL=0`` (read per call). Each of these
    variables takes only the values listed or its default spelled out (e.g. ``VLLM_SPECLA_CUDA_REGCAP=1``,
    ``VLLM_SPECLA_CUDA_LAYOUT=auto``; empty = unset); any other value raises ``RuntimeError`` naming the variable
    and its values at the call, before the kernel launches (the input conversions may run first; they write no
    user tensor; ``csrc/cuda/torch_binding_cuda.cpp``, env_choice / env_word / env_count).
    ``VLLM_SPECLA_CUDA_LINEINFO=1`` at build time adds ``-lineinfo`` (source lines in Nsight Compute).
    """
    if not AVAILABLE:
        raise RuntimeError(f"the C++ CPU extension (op schemas) is not loaded: {LOAD_ERROR} (pip install builds it; "
                           f"or set VLLM_SPECLA_CPP_JIT=1 to compile it at import)")
    if not torch.cuda.is_available():
        return False
    _jit_cuda("vllm_specla_cuda_jit", ["chain_verify.cu", "chain_verify_ut.cu", "torch_binding_cuda.cpp"], verbose)
    global CUDA_LOADED
    CUDA_LOADED = True
    return True


def _jit_cuda(name: str, files: list[str], verbose: bool) -> None:
    """``torch.utils.cpp_extension.load`` of ``csrc/cuda/<files>`` as extension ``name`` (-O3;
    ``VLLM_SPECLA_CUDA_LINEINFO=1`` adds ``-lineinfo``), registering its ops."""
    lineinfo = os.environ.get("VLLM_SPECLA_CUDA_LINEINFO", "0") not in ("", "0")
    _build_and_load(name, sources=[os.path.join(_csrc_dir(), "cuda", f) for f in files], extra_cflags=["-O3"],
                    extra_cuda_cflags=["-O3"] + (["-lineinfo"] if lineinfo else []),
                    is_python_module=False, verbose=verbose)


CUDA_KERNELS_ENV = "VLLM_SPECLA_CUDA_KERNELS"
CUDA_KERNELS_CHOICES = ("auto", "1", "0")
_log = logging.getLogger("vllm.specla")


def cuda_kernels_mode() -> str:
    """``VLLM_SPECLA_CUDA_KERNELS`` (read at each call): ``"auto"`` (unset or empty), ``"1"`` or ``"0"``.

    Raises:
        ValueError: any other value, naming the variable and its values.
    """
    mode = (os.environ.get(CUDA_KERNELS_ENV) or "auto").strip().lower()
    if mode not in CUDA_KERNELS_CHOICES:
        raise ValueError(f"{CUDA_KERNELS_ENV}={os.environ.get(CUDA_KERNELS_ENV)!r}: must be 'auto' (build the CUDA "
                         f"kernels where CUDA is available, else fall back to Triton / cuBLAS with a warning), '1' "
                         f"(build them or raise) or '0' (never: Triton / cuBLAS)")
    return mode


def _ensure_cpu_extension() -> None:
    """The C++ CPU extension (the op schemas the CUDA chain verify registers under), JIT-built now if it did not
    import (a source checkout without ``pip install``), unless ``VLLM_SPECLA_DISABLE_CPP=1``.

    Raises:
        RuntimeError: it cannot be loaded or built (the message carries the cause).
    """
    global AVAILABLE, LOAD_ERROR
    if AVAILABLE:
        return
    if os.environ.get("VLLM_SPECLA_DISABLE_CPP", "0") not in ("", "0"):
        raise RuntimeError("the C++ CPU extension (op schemas) is disabled by VLLM_SPECLA_DISABLE_CPP")
    try:
        _jit_load()
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"the C++ CPU extension (op schemas) is not loaded ({LOAD_ERROR}) and its JIT build "
                           f"failed: {e}") from None
    if not _registered():
        raise RuntimeError("the C++ CPU extension was built but torch.ops.vllm_specla ops are missing")
    _register_fakes()
    AVAILABLE, LOAD_ERROR = True, None


_CUDA_KERNEL_ERRORS: dict[str, str] = {}  # load_cuda_kernels(): a kernel's failed build, tried once per process


def load_cuda_kernels() -> dict[str, bool]:
    """Build (JIT, first use only: cached under ``TORCH_EXTENSIONS_DIR``) and register the CUDA csrc kernels the
    GPU paths run by default: the chain verify (:func:`load_cuda`; its op schemas come from the C++ CPU extension,
    JIT-built too when a source checkout lacks it) and the skinny GEMM (:func:`load_cuda_gemm`).

    Called by the decode runtime (``runtime/decode.py`` ``DecodeRuntime``), the core engine
    (``runtime/engine.py`` ``SpecLAEngine``) and the vLLM GPU worker when they run on CUDA, so the measured
    fastest kernels are the default: on the H200, SpecLA K = 4 steps at batch 64 / 256 took 0.82-0.86x the
    Triton chain kernels' time with the CUDA chain verify, at batch 16 0.96x (K = 4) / 0.95x (K = 7), at batch 1
    the same (benchmarks/RESULTS.md "Session 44"); the skinny GEMM runs the batch-1 verify windows' GEMMs
    (session 15). Once loaded, the dispatchers pick them per shape (``ops/chain_verify.py`` ``_use_cuda_csrc``,
    ``ops/fused.py`` ``linear``). A kernel switched off (``chain_verify.USE_CUDA_CSRC`` /
    ``VLLM_SPECLA_CUDA_CSRC=0``, ``fused.USE_SKINNY_GEMM`` / ``VLLM_SPECLA_SKINNY_GEMM=0``) is not built.

    ``VLLM_SPECLA_CUDA_KERNELS`` (:func:`cuda_kernels_mode`, read at each call): ``auto`` (default) logs one
    warning where a build fails (no ``nvcc``, no C++ compiler, ...) and the Triton / cuBLAS kernels run instead
    (lossless either way; slower); a failed build is not retried in the process. ``1`` raises instead (also for a
    build that failed earlier under ``auto``); ``0`` builds nothing. Without CUDA nothing is built in any mode.
    The first build takes about 2-2.5 minutes (``nvcc``; an H100 machine with 16 cores, session 45: under 2 min
    for the chain verify, ~45 s for the skinny GEMM), with one warning per extension built; later processes load
    the cached build (:func:`_build_and_load`: one builder at a time, a lock left by a killed build removed).

    Returns:
        ``{"chain_verify": bool, "skinny_gemm": bool}``: which of the two are registered now.

    Raises:
        RuntimeError: mode ``1`` and a build failed (the message carries the cause).
        ValueError: a bad ``VLLM_SPECLA_CUDA_KERNELS`` value.
    """
    from vllm_specla.ops import chain_verify, fused  # noqa: PLC0415  (they import this module)

    mode = cuda_kernels_mode()
    wanted = {"chain_verify": chain_verify.USE_CUDA_CSRC, "skinny_gemm": fused.USE_SKINNY_GEMM}
    if mode != "0" and torch.cuda.is_available():

        def build_chain_verify() -> bool:
            _ensure_cpu_extension()
            return load_cuda()

        new_errors = []
        for name, build, loaded in (("chain_verify", build_chain_verify, CUDA_LOADED),
                                    ("skinny_gemm", load_cuda_gemm, GEMM_LOADED)):
            if loaded or not wanted[name] or name in _CUDA_KERNEL_ERRORS:
                continue
            try:
                build()
            except Exception as e:  # noqa: BLE001  (nvcc missing, compile error, no CPU extension, ...)
                last = str(e).strip().splitlines()[-1] if str(e).strip() else repr(e)  # (a build log's last line)
                _CUDA_KERNEL_ERRORS[name] = f"{name}: {type(e).__name__}: {last}"
                new_errors.append(_CUDA_KERNEL_ERRORS[name])
        failed = [_CUDA_KERNEL_ERRORS[n] for n in wanted if wanted[n] and n in _CUDA_KERNEL_ERRORS]
        if failed and mode == "1":
            raise RuntimeError(f"{CUDA_KERNELS_ENV}=1 but the CUDA kernels did not build: {'; '.join(failed)}")
        if new_errors:
            _log.warning("vllm_specla: the CUDA csrc kernels did not build, running the Triton / cuBLAS kernels "
                         "instead (lossless, slower: at batch 16+ without the chain verify, at batch 1 without the "
                         "skinny GEMM; set %s=0 to silence): %s", CUDA_KERNELS_ENV, "; ".join(new_errors))
    return {"chain_verify": CUDA_LOADED, "skinny_gemm": GEMM_LOADED}


# skinny_gemm's default prefetch size: the best on the step's GEMMs (RESULTS.md session 17; ops/fused.py
# SKINNY_PREFETCH_BYTES starts from it)
SKINNY_PREFETCH_DEFAULT_BYTES = 4 << 20
GEMM_LOADED = False  # set by load_cuda_gemm(): torch.ops.vllm_specla.skinny_gemm is registered for CUDA tensors


def load_cuda_gemm(verbose: bool = False) -> bool:
    """JIT-build ``csrc/cuda/skinny_gemm.cu`` (the tensor-core skinny GEMM for 1-16 token rows:
    the weight as the MMA's A operand, loaded 16 bytes at a time straight into fragment registers,
    read once for all rows) and register ``torch.ops.vllm_specla.skinny_gemm`` for CUDA tensors.

    Independent of the CPU extension (the file carries its own schema). Once loaded,
    ``ops/fused.py`` ``linear`` (and the fused prologue forms after their norm / SwiGLU kernels) run
    the bf16 / fp16 GEMMs of 2-8 rows (``fused.SKINNY_MAX_M``) that the row GEMV does not take on it
    instead of cuBLAS (``fused.USE_SKINNY_GEMM``): a batch-1 verify window of K <= 7 draft tokens.
    Needs CUDA torch and nvcc (about 30-60 s, cached under ``TORCH_EXTENSIONS_DIR``). Returns False
    when CUDA is absent. Measured: benchmarks/RESULTS.md, session 15.
    """
    if not torch.cuda.is_available():
        return False
    global GEMM_LOADED
    _jit_cuda("vllm_specla_gemm_jit", ["skinny_gemm.cu"], verbose)
    GEMM_LOADED = True
    return True


_SKINNY_CONFIGS = {(w, u) for w in (4, 8, 16) for u in (4, 8)} | {(0, 0)}


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of two 2-D strided tensors (first to last element) intersect."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False

    def span(t):
        lo = t.data_ptr()
        return lo, lo + ((t.shape[0] - 1) * t.stride(0) + (t.shape[1] - 1) * t.stride(1) + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def skinny_problem(x, w, residual=None, out=None, warps=0, unroll=0, prefetch=None, prefetch_bytes=0) -> str | None:
    """Why the skinny GEMM cannot take these operands (a message naming the argument), or None when
    it can, devices aside (the CUDA check is :func:`_skinny_check`'s). The one list of the kernel's
    conditions: ``fused._skinny_takes`` asks it before dispatching (falling back to cuBLAS), and
    :func:`_skinny_check` raises its answer. The op's own checks are a backstop only: a failed
    ``TORCH_CHECK`` inside the JIT-built op crashed the process on the H200 (segmentation fault,
    s15b) instead of raising, so nothing reaches it unchecked."""
    for name, t in (("x", x), ("w", w), ("residual", residual), ("out", out)):
        if not isinstance(t, torch.Tensor) and (t is not None or name in ("x", "w")):
            return (f"{name} must be a torch.Tensor{'' if name in ('x', 'w') else ' or None'}, "
                    f"got {type(t).__name__}")
    for name, v in (("warps", warps), ("unroll", unroll)):
        if isinstance(v, bool) or not isinstance(v, int):
            return f"{name} must be an int, got {v!r}"
    if x.dim() != 2 or w.dim() != 2:
        return f"x [M, K] and w [N, K] must be 2-D, got {tuple(x.shape)} and {tuple(w.shape)}"
    if w.dtype not in (torch.bfloat16, torch.float16) or x.dtype != w.dtype:
        return f"x and w must share one dtype, bfloat16 or float16; got {x.dtype} and {w.dtype}"
    M, K = x.shape
    N = w.shape[0]
    if not 1 <= M <= 16:
        return f"x must have 1..16 rows, got {M}"
    if w.shape[1] != K or N < 1 or N > (1 << 31) - 16:
        return f"w must be [N, {K}] with 1 <= N <= 2^31 - 16, got {tuple(w.shape)}"
    if K < 8 or K % 8 or K >= 1 << 30 or x.stride(-1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        return (f"x needs K % 8 == 0 with 8 <= K < 2^30 (K = {K}) and dense, 16-byte aligned rows "
                f"(strides {x.stride()})")
    if not w.is_contiguous() or w.data_ptr() % 16:
        return "w must be contiguous and 16-byte aligned"
    if x.device != w.device:
        return f"x and w must be on one device, got {x.device} and {w.device}"
    for name, t in (("residual", residual), ("out", out)):
        if t is not None and (t.shape != (M, N) or t.dtype != w.dtype or t.device != w.device or t.stride(-1) != 1
                              or (M > 1 and t.stride(0) < N)):
            return (f"{name} must be [{M}, {N}] {w.dtype} on {w.device} with dense, non-overlapping rows, "
                    f"got {tuple(t.shape)} {t.dtype} on {t.device}, strides {t.stride()}")
    if out is not None:  # rows are written while other CTAs still read x / w / the residual
        if _overlap(out, x):
            return "out must not overlap x"
        if _overlap(out, w):
            return "out must not overlap w"
        if residual is not None and _overlap(out, residual) and not (
                out.data_ptr() == residual.data_ptr() and out.stride() == residual.stride()):
            return "out must be the residual itself (in place) or not overlap it"
    if prefetch is None and prefetch_bytes not in (None, 0):
        return f"prefetch_bytes needs a prefetch tensor, got prefetch_bytes={prefetch_bytes!r} without one"
    if prefetch is not None:
        if not isinstance(prefetch, torch.Tensor):
            return f"prefetch must be a torch.Tensor or None, got {type(prefetch).__name__}"
        nb = prefetch.numel() * prefetch.element_size()
        if prefetch.device != w.device or not prefetch.is_contiguous() or prefetch.data_ptr() % 16:
            return f"prefetch must be a contiguous, 16-byte aligned tensor on {w.device}"
        if isinstance(prefetch_bytes, bool) or not isinstance(prefetch_bytes, int) or not (
                0 <= prefetch_bytes <= nb and prefetch_bytes % 16 == 0):
            return f"prefetch_bytes must be a multiple of 16 in 0..{nb} (the prefetch tensor's bytes), got {prefetch_bytes!r}"
    if (warps, unroll) not in _SKINNY_CONFIGS:
        return f"(warps, unroll) must be (4|8|16, 4|8) or (0, 0) for the automatic choice, got ({warps!r}, {unroll!r})"
    return None


def _skinny_check(x, w, residual, out, warps, unroll, prefetch=None, prefetch_bytes=0) -> None:
    """``ValueError`` ("skinny_gemm: " + :func:`skinny_problem`'s message) for inputs outside the
    kernel's contract; last, tensors that are not on a CUDA device."""
    msg = skinny_problem(x, w, residual, out, warps, unroll, prefetch, prefetch_bytes)
    if msg is not None:
        raise ValueError(f"skinny_gemm: {msg}")
    if not (x.is_cuda and w.is_cuda):  # last, so the CPU tests reach the checks above
        raise ValueError(f"skinny_gemm: x and w must be CUDA tensors, got {x.device} and {w.device}")


def skinny_gemm(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor | None = None,
                out: torch.Tensor | None = None, warps: int = 0, unroll: int = 0, pdl: bool | None = None,
                prefetch: torch.Tensor | None = None, prefetch_bytes: int | None = None) -> torch.Tensor:
    """``x [M, K] @ w[N, K].T (+ residual [M, N])`` -> ``out [M, N]`` (new, or the given one: pass
    ``out=residual`` to add in place) on the CUDA skinny GEMM of :func:`load_cuda_gemm`.

    ``x`` / ``w`` / ``residual`` / ``out``: one dtype, bfloat16 or float16; ``1 <= M <= 16``;
    ``K % 8 == 0``; ``w`` contiguous; ``x`` rows dense and 16-byte aligned. fp32 accumulation, one
    rounding (``residual`` added in fp32 first, as cuBLAS ``addmm`` with beta = 1); deterministic.
    ``warps`` / ``unroll``: the CTA's warps (4 / 8 / 16, splitting K) and 32-wide k chunks per load
    batch (4 / 8); 0 / 0 = automatic (8 / 8, with 1-8 rows accumulated in two MMA chains: 2.7-4.5 %
    faster than the explicit (8, 8), RESULTS.md "Session 30"). ``pdl``: launch with programmatic dependent launch
    (default: ``ops/pdl.py``; with PDL the kernel reads ``w`` before the previous kernel on the
    stream has finished, so ``w`` must be constant weights, not written by earlier kernels of the
    step). Overlaps are judged by each tensor's first-to-last element span, so disjoint column
    slices of one buffer count as overlapping. ``prefetch``: the next GEMM's weight (any contiguous,
    16-byte aligned tensor on the device); the CTAs of about the last wave issue an L2 prefetch of its
    first ``prefetch_bytes`` (default: min(its bytes, 4 MiB), rounded down to 16) as they finish, so
    the next stream starts from L2 (sm_90+; ignored below). It targets a fixed ~3.6 us per GEMM
    (RESULTS.md session 16). 4 MiB measured best on the step's GEMMs: 0.3-3 % faster; 16 MiB and more were
    slower than none (session 17). The decode runtime passes it (``fused.linear(prefetch=)``).
    Raises ``ValueError`` naming the argument on other inputs.
    Reference: ``ops/fused.py`` ``linear_ref``; design and measurements: ``csrc/cuda/skinny_gemm.cu``,
    benchmarks/RESULTS.md session 15."""
    from vllm_specla.ops import pdl as _pdl  # noqa: PLC0415

    if pdl is not None and not isinstance(pdl, bool):
        raise ValueError(f"skinny_gemm: pdl must be None (ops/pdl.py decides) or a bool, got {pdl!r}")
    if prefetch is not None and prefetch_bytes is None and isinstance(prefetch, torch.Tensor):
        prefetch_bytes = min(prefetch.numel() * prefetch.element_size(), SKINNY_PREFETCH_DEFAULT_BYTES) // 16 * 16
    prefetch_bytes = 0 if prefetch_bytes is None else prefetch_bytes
    _skinny_check(x, w, residual, out, warps, unroll, prefetch, prefetch_bytes)
    if out is None:
        out = torch.empty(x.shape[0], w.shape[0], dtype=w.dtype, device=w.device)
    torch.ops.vllm_specla.skinny_gemm(x, w, residual, out, int(warps), int(unroll),
                                      _pdl.enabled(x) if pdl is None else bool(pdl), prefetch, int(prefetch_bytes))
    return out


_SKINNY_FP8_CONFIGS = {(4, 4), (8, 4), (16, 4), (8, 8), (0, 0)}


def skinny_gemm_fp8(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, residual: torch.Tensor | None = None,
                    out: torch.Tensor | None = None, warps: int = 0, unroll: int = 0,
                    pdl: bool | None = None) -> torch.Tensor:
    """``(x [M, K] @ w[N, K].float().T) * w_scale (+ residual)`` -> bf16 ``out [M, N]`` on the CUDA skinny
    GEMM's float8 form (``csrc/cuda/skinny_gemm_kernels.cuh`` ``skinny_gemm_fp8_kernel``, built by
    :func:`load_cuda_gemm`): ``x`` bfloat16, ``1 <= M <= 8``, rows dense and 16-byte aligned; ``w``
    ``torch.float8_e4m3fn``, contiguous, ``K % 16 == 0``; ``w_scale [N]`` float32 (one scale per weight row,
    ``fused.quantize_fp8``); ``residual`` / ``out`` bfloat16 (``out=residual`` adds in place). The weights
    widen exactly to f16, the activations to f16 times 2^-8; f16 MMAs with fp32 accumulation, the row
    scale (times 2^8) and the residual in fp32, one rounding: ``fused.Fp8Weight.ref_linear``'s values up to
    those roundings and the summation order. ``warps`` / ``unroll``: (4 | 8 | 16, 4), (8, 8), or 0 / 0
    (automatic: 8 / 4). ``pdl``: as :func:`skinny_gemm` (``w`` must be constant weights).
    Raises ``ValueError`` naming the argument on other inputs. Prepared in session 28 for the drafter's
    absorb pass with float8 weights (RESULTS.md "Session 28"); measured in session 29 (RESULTS.md "Session 29")."""
    from vllm_specla.ops import pdl as _pdl  # noqa: PLC0415

    def bad(msg):
        raise ValueError(f"skinny_gemm_fp8: {msg}")

    if not all(isinstance(t, torch.Tensor) for t in (x, w, w_scale)):
        bad("x, w and w_scale must be tensors")
    if x.dim() != 2 or w.dim() != 2 or x.dtype != torch.bfloat16 or w.dtype != torch.float8_e4m3fn:
        bad(f"need x [M, K] bfloat16 and w [N, K] float8_e4m3fn, got x {tuple(x.shape)} {x.dtype}, "
            f"w {tuple(w.shape)} {w.dtype}")
    M, K = x.shape
    N = w.shape[0]
    if not 1 <= M <= 8 or w.shape[1] != K or K < 16 or K % 16:
        bad(f"need 1 <= M <= 8 rows and K % 16 == 0 shared by x and w, got x {tuple(x.shape)}, w {tuple(w.shape)}")
    if not w.is_contiguous() or x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16 or w.data_ptr() % 16:
        bad("w must be contiguous and 16-byte aligned, x rows dense and 16-byte aligned")
    if w_scale.shape != (N,) or w_scale.dtype != torch.float32 or not w_scale.is_contiguous():
        bad(f"w_scale must be contiguous float32 [N] = [{N}], got {tuple(w_scale.shape)} {w_scale.dtype}")
    for name, t in (("residual", residual), ("out", out)):
        if t is not None and (t.shape != (M, N) or t.dtype != torch.bfloat16 or t.stride(1) != 1):
            bad(f"{name} must be bfloat16 [M, N] = [{M}, {N}] with a dense last dim, got {tuple(t.shape)} {t.dtype}")
    if (warps, unroll) not in _SKINNY_FP8_CONFIGS:
        bad(f"(warps, unroll) must be (4|8|16, 4), (8, 8) or (0, 0) for the automatic choice, got ({warps!r}, {unroll!r})")
    if pdl is not None and not isinstance(pdl, bool):
        bad(f"pdl must be None (ops/pdl.py decides) or a bool, got {pdl!r}")
    if not (x.is_cuda and w.is_cuda and w_scale.is_cuda):
        bad(f"x, w and w_scale must be CUDA tensors, got {x.device}, {w.device}, {w_scale.device}")
    if out is None:
        out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    torch.ops.vllm_specla.skinny_gemm_fp8(x, w, w_scale, residual, out, int(warps), int(unroll),
                                          _pdl.enabled(x) if pdl is None else bool(pdl))
    return out


def _registered() -> bool:
    ns = getattr(torch.ops, "vllm_specla", None)
    try:
        return ns is not None and all(hasattr(ns, name) for name in _OPS)
    except Exception:  # noqa: BLE001
        return False


def _load() -> None:
    global AVAILABLE, LOAD_ERROR
    if os.environ.get("VLLM_SPECLA_DISABLE_CPP", "0") not in ("", "0"):
        LOAD_ERROR = "disabled by VLLM_SPECLA_DISABLE_CPP"
        return
    try:
        import vllm_specla._C  # noqa: F401, PLC0415  (runs the TORCH_LIBRARY registrations)
    except (ImportError, OSError) as e:  # not built, or built against another torch
        LOAD_ERROR = f"vllm_specla._C not importable ({e})"
        if os.environ.get("VLLM_SPECLA_CPP_JIT", "0") not in ("", "0"):
            try:
                _jit_load()
                LOAD_ERROR = None
            except Exception as e2:  # noqa: BLE001
                LOAD_ERROR += f"; JIT build failed ({e2})"
                return
        else:
            return
    if not _registered():
        LOAD_ERROR = "extension loaded but torch.ops.vllm_specla ops are missing"
        return
    _register_fakes()
    AVAILABLE = True
    LOAD_ERROR = None


def _register_fakes() -> None:
    def _o(v):
        return v.new_empty(v.shape, dtype=torch.float32)

    fakes = {
        "vllm_specla::chain_verify": lambda q, k, v, *a, **kw: _o(v),
        "vllm_specla::tree_verify": lambda q, k, v, *a, **kw: _o(v),
        "vllm_specla::conv_verify": lambda x, *a, **kw: x.new_empty(x.shape, dtype=torch.float32),
        "vllm_specla::recover": lambda *a, **kw: None,
        "vllm_specla::conv_commit": lambda *a, **kw: None,
    }
    for name, fn in fakes.items():
        try:
            torch.library.register_fake(name)(fn)
        except RuntimeError:  # already registered (module reloaded)
            pass


def use(op: str, *tensors) -> bool:
    """True when the C++ op ``op`` is built (and enabled) and every given tensor (None skipped) is
    on the CPU: the dispatchers' test."""
    return AVAILABLE and op in _ENABLED and all(t is None or t.device.type == "cpu" for t in tensors)


def _checked(name: str, ref, cpp_call, slots, mutated: dict, ref_call):
    """Debug mode: run ``cpp_call()``; run ``ref_call(sub, local_slots)`` on copies of the rows
    ``slots`` of every slot-indexed tensor in ``mutated`` (slots renumbered 0..R-1, so the possibly
    huge slot pools are never cloned); raise if any output or mutated row differs."""
    idx = slots.long()
    subs = {k: v[idx].clone() for k, v in mutated.items() if v is not None}
    out_ref = ref_call(subs, torch.arange(idx.numel(), device=idx.device))
    out = cpp_call()
    bad = []
    if out is not None and not torch.allclose(out, out_ref, atol=1e-4, rtol=1e-3, equal_nan=True):
        bad.append(f"output max|diff| {float((out - out_ref).abs().nan_to_num().max()):.3g}")
    for k, c in subs.items():
        t = mutated[k][idx]
        if not torch.allclose(t.float(), c.float(), atol=1e-4, rtol=1e-3, equal_nan=True):
            bad.append(f"{k} max|diff| {float((t.float() - c.float()).abs().nan_to_num().max()):.3g}")
    if bad:
        shapes = {k: (tuple(v.shape), v.stride(), v.dtype) for k, v in mutated.items() if v is not None}
        msg = f"vllm_specla C++ {name} differs from {ref.__name__}: {bad}; {shapes}"
        print(msg, file=sys.stderr, flush=True)
        raise RuntimeError(msg)
    return out


# ---- wrappers with the references' keyword signatures ---------------------------------------


def chain_verify(q, k, v, g, beta, *, scale, state, slots, cu_seqlens, bank_k=None, bank_v=None, bank_g=None,
                 write_bank=None, pending_len=None, read_bank=None, write_final_state=False,
                 use_qk_l2norm=True) -> torch.Tensor:
    """C++ :func:`~vllm_specla.ops.reference.chain_verify_ref` (same arguments and result)."""
    if CHECK:
        from vllm_specla.ops.reference import chain_verify_ref as ref  # noqa: PLC0415

        kw = dict(scale=scale, cu_seqlens=cu_seqlens, write_bank=write_bank, pending_len=pending_len,
                  read_bank=read_bank, write_final_state=write_final_state, use_qk_l2norm=use_qk_l2norm)
        muts = dict(state=state, bank_k=bank_k, bank_v=bank_v, bank_g=bank_g)
        return _checked("chain_verify", ref, lambda: _chain_verify(q, k, v, g, beta, slots=slots, **kw, **muts), slots,
                        muts, lambda c, ls: ref(q, k, v, g, beta, slots=ls, **kw, **{m: c.get(m) for m in muts}))
    return _chain_verify(q, k, v, g, beta, scale=scale, state=state, slots=slots, cu_seqlens=cu_seqlens,
                         bank_k=bank_k, bank_v=bank_v, bank_g=bank_g, write_bank=write_bank, pending_len=pending_len,
                         read_bank=read_bank, write_final_state=write_final_state, use_qk_l2norm=use_qk_l2norm)


# The host-side window check of the CUDA wrapper (check_windows); False skips it (and its host sync)
# outside graph capture too, as triton_chain.CHECK_BOUNDS does for the Triton kernels.
CHECK_WINDOWS = True


def check_windows(cu_seqlens: torch.Tensor, tmax: int) -> None:
    """``ValueError`` (the reference's) if a row of ``cu_seqlens`` ``[R+1]`` is longer than the factor
    bank's ``tmax`` positions. The CUDA kernels cannot raise, and the UT form computes at most ``tmax``
    tokens of a recorded window; this reads ``cu_seqlens`` on the host (a sync for a GPU tensor), so it
    is skipped during CUDA-graph capture, where the dispatcher's bank sizes bound the windows (as
    ``triton_chain._bounds_check``)."""
    if cu_seqlens.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    if cu_seqlens.numel() > 1:
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        if longest > tmax:
            raise ValueError(f"window of {longest} tokens exceeds the factor bank (Tmax={tmax})")


def _chain_verify(q, k, v, g, beta, *, scale, state, slots, cu_seqlens, bank_k, bank_v, bank_g, write_bank,
                  pending_len, read_bank, write_final_state, use_qk_l2norm):
    if CHECK_WINDOWS and q.is_cuda and write_bank is not None and bank_k is not None:
        check_windows(cu_seqlens, bank_k.shape[2])
    return torch.ops.vllm_specla.chain_verify(q, k, v, g, beta, float(scale), state, slots, cu_seqlens, bank_k, bank_v,
                                              bank_g, write_bank, pending_len, read_bank, bool(write_final_state),
                                              bool(use_qk_l2norm))


def tree_verify(q, k, v, g, beta, *, scale, state, slots, cu_seqlens, parents, bank_k=None, bank_v=None,
                bank_g=None, write_bank=None, pending_len=None, read_bank=None, use_qk_l2norm=True,
                node_states=None) -> torch.Tensor:
    """C++ :func:`~vllm_specla.ops.tree_reference.tree_verify_sequential_ref` (``node_states`` unsupported)."""
    if node_states is not None:
        raise ValueError("the C++ tree_verify does not return node states; use tree_verify_sequential_ref")
    if not isinstance(parents, torch.Tensor):
        parents = torch.tensor(list(parents), dtype=torch.int64)
    if CHECK:
        from vllm_specla.ops.tree_reference import tree_verify_sequential_ref as ref  # noqa: PLC0415

        kw = dict(scale=scale, cu_seqlens=cu_seqlens, parents=parents, write_bank=write_bank,
                  pending_len=pending_len, read_bank=read_bank, use_qk_l2norm=use_qk_l2norm)
        muts = dict(state=state, bank_k=bank_k, bank_v=bank_v, bank_g=bank_g)
        return _checked("tree_verify", ref, lambda: _tree_verify(q, k, v, g, beta, slots=slots, **kw, **muts), slots,
                        muts, lambda c, ls: ref(q, k, v, g, beta, slots=ls, **kw, **{m: c.get(m) for m in muts}))
    return _tree_verify(q, k, v, g, beta, scale=scale, state=state, slots=slots, cu_seqlens=cu_seqlens,
                        parents=parents, bank_k=bank_k, bank_v=bank_v, bank_g=bank_g, write_bank=write_bank,
                        pending_len=pending_len, read_bank=read_bank, use_qk_l2norm=use_qk_l2norm)


def _tree_verify(q, k, v, g, beta, *, scale, state, slots, cu_seqlens, parents, bank_k, bank_v, bank_g, write_bank,
                 pending_len, read_bank, use_qk_l2norm):
    return torch.ops.vllm_specla.tree_verify(q, k, v, g, beta, float(scale), state, slots, cu_seqlens, parents,
                                             bank_k, bank_v, bank_g, write_bank, pending_len, read_bank,
                                             bool(use_qk_l2norm))


def recover(state, slots, bank_k, bank_v, bank_g, bank_idx, num_accepted) -> None:
    """C++ :func:`~vllm_specla.ops.reference.recover_ref` (in place)."""
    if CHECK:
        from vllm_specla.ops.reference import recover_ref as ref  # noqa: PLC0415

        _checked("recover", ref, lambda: torch.ops.vllm_specla.recover(state, slots, bank_k, bank_v, bank_g, bank_idx,
                                                                       num_accepted),
                 slots, dict(state=state, bank_k=bank_k, bank_v=bank_v, bank_g=bank_g),
                 lambda c, ls: ref(c["state"], ls, c["bank_k"], c["bank_v"], c["bank_g"], bank_idx, num_accepted))
        return
    torch.ops.vllm_specla.recover(state, slots, bank_k, bank_v, bank_g, bank_idx, num_accepted)


def conv_verify(x, weight, cu_seqlens, conv_state, slots, *, bank_x=None, write_bank=None, pending_len=None,
                read_bank=None, write_final_state=False) -> torch.Tensor:
    """C++ :func:`~vllm_specla.ops.reference.conv_verify_ref` (same arguments and result)."""
    if CHECK:
        from vllm_specla.ops.reference import conv_verify_ref as ref  # noqa: PLC0415

        kw = dict(write_bank=write_bank, pending_len=pending_len, read_bank=read_bank,
                  write_final_state=write_final_state)
        return _checked("conv_verify", ref,
                        lambda: torch.ops.vllm_specla.conv_verify(x, weight, cu_seqlens, conv_state, slots, bank_x,
                                                                  write_bank, pending_len, read_bank,
                                                                  bool(write_final_state)),
                        slots, dict(conv_state=conv_state, bank_x=bank_x),
                        lambda c, ls: ref(x, weight, cu_seqlens, c["conv_state"], ls, bank_x=c.get("bank_x"), **kw))
    return torch.ops.vllm_specla.conv_verify(x, weight, cu_seqlens, conv_state, slots, bank_x, write_bank,
                                             pending_len, read_bank, bool(write_final_state))


def conv_commit(conv_state, slots, bank_x, bank_idx, num_accepted) -> None:
    """C++ :func:`~vllm_specla.ops.reference.conv_commit_ref` (in place)."""
    if CHECK:
        from vllm_specla.ops.reference import conv_commit_ref as ref  # noqa: PLC0415

        _checked("conv_commit", ref,
                 lambda: torch.ops.vllm_specla.conv_commit(conv_state, slots, bank_x, bank_idx, num_accepted),
                 slots, dict(conv_state=conv_state, bank_x=bank_x),
                 lambda c, ls: ref(c["conv_state"], ls, c["bank_x"], bank_idx, num_accepted))
        return
    torch.ops.vllm_specla.conv_commit(conv_state, slots, bank_x, bank_idx, num_accepted)


_load()
