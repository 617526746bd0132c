"""The decode runtime's per-step bookkeeping after the verify in one launch: greedy acceptance of the
draft chain, emission of the accepted tokens and the bonus token, the counters, the deferred commit's
bank swap and the drafter's absorb window (``runtime/decode.py`` ``DecodeRuntime._step``).

Why: written as torch ops, this bookkeeping is ~35 small kernels per SpecLA step (the acceptance of
``core/acceptance.py`` ``greedy_accept_chain`` alone is 14) and ~8 per AR step. Inside a CUDA graph
each still costs a launch and a drain (torch kernels do not take programmatic dependent launch), a
few percent of a batch-1 step (benchmarks/RESULTS.md, session 24). :func:`accept_advance` does it
all in one Triton program on CUDA; :func:`accept_advance_ref` is the same in torch ops (the CPU path
and the test oracle). The acceptance rule is ``greedy_accept_chain``'s (ALGORITHMS.md §9, greedy):
``a`` = the longest prefix with ``draft_{i+1} == argmax_i``, the bonus token ``argmax_a``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_specla.core.acceptance import greedy_accept_chain


@dataclass
class AcceptBuffers:
    """The device tensors one step updates (all int64, ``[B]`` unless noted; see ``DecodeRuntime``).

    out ``[B, Lout]``: emitted tokens (column ``Lout - 1``: the dump of positions past capacity);
    n: tokens emitted per row; window ``[B, T]``: ``[last token, drafts]`` (its column 0 gets the
    bonus token). Spec mode only (None in AR mode): a: accepted drafts (output); nxt ``[B, T]``:
    the drafter's absorb window (output); acc_sum ``[]``; acc_log ``[LOG, B]``; step_i ``[1]``;
    pending_len, read_bank, write_bank, valid_len; flat_a (optional): ``row * T + a``, the accepted
    position as a flat index of ``[B, T]``: the snapshot to roll back to (snapshot mode) and the row of
    the drafter's absorb features to draft from.
    """

    out: torch.Tensor
    n: torch.Tensor
    window: torch.Tensor
    a: torch.Tensor | None = None
    nxt: torch.Tensor | None = None
    acc_sum: torch.Tensor | None = None
    acc_log: torch.Tensor | None = None
    step_i: torch.Tensor | None = None
    pending_len: torch.Tensor | None = None
    read_bank: torch.Tensor | None = None
    write_bank: torch.Tensor | None = None
    valid_len: torch.Tensor | None = None
    flat_a: torch.Tensor | None = None

    @property
    def spec(self) -> bool:
        return self.a is not None


def accept_advance_ref(am: torch.Tensor, buf: AcceptBuffers) -> None:
    """One step's bookkeeping in torch ops, from the target's greedy tokens ``am [B, T]`` int64
    (``argmax`` after each window position) and the window in ``buf.window``.

    AR mode (``buf.a`` None, ``T = 1``): emit ``am[:, 0]``, ``n += 1``, ``window[:, 0] = am[:, 0]``.
    Spec mode: ``a`` = accepted drafts, ``bonus = am[a]``; emit ``am[:, :a + 1]`` at ``n``
    (positions past ``Lout - 1`` clamp to the dump column), ``n += a + 1``; ``acc_sum += sum(a)``,
    ``acc_log[step_i % LOG] = a``, ``step_i += 1``; ``pending_len = valid_len = a + 1``; swap
    ``read_bank`` / ``write_bank``; ``flat_a = row * T + a`` (when given); ``nxt`` = the
    window's drafts then the bonus token, with ``nxt[a] = bonus`` (entries past ``a`` are padding:
    ``valid_len`` masks them); ``window[:, 0] = bonus``. In place; returns nothing."""
    B, T = am.shape
    out, n, window = buf.out, buf.n, buf.window
    Lout = out.shape[1]
    col = torch.arange(T, device=am.device)
    if not buf.spec:
        a = torch.zeros(B, dtype=torch.long, device=am.device)
    else:
        full = torch.full((B,), T - 1, dtype=torch.long, device=am.device)
        a = greedy_accept_chain(window[:, 1:], full, am)[1] - 1  # the project's one acceptance rule
    bonus = am.gather(1, a[:, None])[:, 0]
    keep = col[None, :] <= a[:, None]
    pos = torch.where(keep, n[:, None] + col[None, :], Lout - 1).clamp(max=Lout - 1)
    out.scatter_(1, pos, torch.where(keep, am, out.gather(1, pos)))  # rejected positions: rewrite what is there
    n += a + 1
    if buf.spec:
        buf.a.copy_(a)
        buf.acc_sum += a.sum()
        buf.acc_log.index_copy_(0, buf.step_i % buf.acc_log.shape[0], a[None])
        buf.step_i += 1
        buf.pending_len.copy_(a + 1)
        buf.valid_len.copy_(a + 1)
        rb = buf.read_bank.clone()
        buf.read_bank.copy_(buf.write_bank)
        buf.write_bank.copy_(rb)
        if buf.flat_a is not None:
            buf.flat_a.copy_(torch.arange(B, device=am.device) * T + a)
        nxt = torch.cat([window[:, 1:], bonus[:, None]], 1)
        buf.nxt.copy_(torch.where(col[None, :] == a[:, None], bonus[:, None], nxt))
    window[:, 0] = bonus


def _kernel():
    import triton  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415

    @triton.jit
    def _accept_advance_kernel(am, window, out, n, a_out, nxt, acc_sum, acc_log, step_i, pending, rbank, wbank,
                               valid, flat, B, T, Lout, LOG, s_am, s_w, s_o, s_nx,
                               TP: tl.constexpr, BB: tl.constexpr, SPEC: tl.constexpr, FLAT: tl.constexpr):
        # one program: B rows in blocks of BB, the window's T <= TP positions in registers
        cols = tl.arange(0, TP)
        step = 0
        if SPEC:
            step = tl.load(step_i)
        tot = tl.zeros([BB], dtype=tl.int64)
        for b0 in range(0, B, BB):
            rows = b0 + tl.arange(0, BB)
            rm = rows < B
            r64 = rows.to(tl.int64)
            mt = rm[:, None] & (cols[None, :] < T)
            amv = tl.load(am + r64[:, None] * s_am + cols[None, :], mask=mt, other=0)
            if SPEC:
                md = rm[:, None] & (cols[None, :] < T - 1)
                dv = tl.load(window + r64[:, None] * s_w + cols[None, :] + 1, mask=md, other=0)
                # a = the first position whose draft misses (T - 1 = K when all match)
                miss = tl.where(md & (dv == amv), TP, cols[None, :])
                a = tl.min(miss, 1)
            else:
                a = tl.zeros([BB], dtype=tl.int32)
            bonus = tl.sum(tl.where(cols[None, :] == a[:, None], amv, 0), 1)
            nb = tl.load(n + rows, mask=rm, other=0)
            keep = mt & (cols[None, :] <= a[:, None])
            pos = tl.minimum(nb[:, None] + cols[None, :], Lout - 1)
            tl.store(out + r64[:, None] * s_o + pos, amv, mask=keep)
            a64 = a.to(tl.int64)
            tl.store(n + rows, nb + a64 + 1, mask=rm)
            if SPEC:
                tl.store(a_out + rows, a64, mask=rm)
                tot += tl.where(rm, a64, 0)
                tl.store(acc_log + (step % LOG) * B + rows, a64, mask=rm)
                tl.store(pending + rows, a64 + 1, mask=rm)
                tl.store(valid + rows, a64 + 1, mask=rm)
                rb = tl.load(rbank + rows, mask=rm, other=0)
                wb = tl.load(wbank + rows, mask=rm, other=0)
                tl.store(rbank + rows, wb, mask=rm)
                tl.store(wbank + rows, rb, mask=rm)
                if FLAT:
                    tl.store(flat + rows, r64 * T + a64, mask=rm)
                nx = tl.where((cols[None, :] == a[:, None]) | (cols[None, :] == T - 1), bonus[:, None], dv)
                tl.store(nxt + r64[:, None] * s_nx + cols[None, :], nx, mask=mt)
            tl.store(window + r64 * s_w, bonus, mask=rm)
        if SPEC:
            tl.store(acc_sum, tl.load(acc_sum) + tl.sum(tot, 0))
            tl.store(step_i, step + 1)

    return _accept_advance_kernel


_KERNEL = None
ACCEPT_MAX_T = 64  # window positions the kernel holds in registers (TP <= 64)
# The Triton kernel on CUDA (off: the torch form everywhere; benchmarks/bench_e2e.py --accept-kernel torch)
USE_TRITON_ACCEPT = True


def _on_gpu(t: torch.Tensor) -> bool:
    """Whether ``t`` is where the Triton kernel runs (a seam: tests point it at CPU tensors under the
    interpreter)."""
    return t.is_cuda


def accept(am: torch.Tensor, buf: AcceptBuffers) -> None:
    """The step's bookkeeping (:func:`accept_advance_ref`'s contract): the Triton kernel
    (:func:`accept_advance`) on CUDA with :data:`USE_TRITON_ACCEPT` and ``T <= ACCEPT_MAX_T``, the torch
    form otherwise (longer windows too)."""
    if USE_TRITON_ACCEPT and _on_gpu(am) and am.shape[1] <= ACCEPT_MAX_T:
        accept_advance(am, buf)
    else:
        accept_advance_ref(am, buf)


def accept_advance(am: torch.Tensor, buf: AcceptBuffers) -> None:
    """:func:`accept_advance_ref` in one Triton launch (CUDA tensors; same results, except that the
    dump column of ``out`` gets no writes for rejected positions). ``am`` ``[B, T]`` int64 with a dense
    last dim, ``T <= 64``; every buffer int64 on ``am``'s device with a dense last dim (``acc_log``
    contiguous ``[LOG >= 1, B]``, ``acc_sum`` / ``step_i`` one element). Precondition, not checked (it
    would need a host sync): ``0 <= n``.

    Raises:
        ValueError: a buffer of another dtype / shape, or ``T`` outside ``1..64``.
    """
    global _KERNEL
    B, T = am.shape
    spec = buf.spec
    if not 1 <= T <= 64 or (not spec and T != 1):
        raise ValueError(f"accept_advance: the window must have 1..64 positions (1 in AR mode), got {T}")
    named = [("am", am), ("out", buf.out), ("n", buf.n), ("window", buf.window)]
    if spec:
        named += [(f, getattr(buf, f)) for f in ("a", "nxt", "acc_sum", "acc_log", "step_i", "pending_len",
                                                  "read_bank", "write_bank", "valid_len")]
        if buf.flat_a is not None:
            named.append(("flat_a", buf.flat_a))
    for name, t in named:
        if (not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.device != am.device
                or (t.dim() and t.stride(-1) != 1)):
            raise ValueError(f"accept_advance: {name} must be an int64 tensor on {am.device} with a dense last dim")
    for name, t, shape in [("out", buf.out, (B, buf.out.shape[-1])), ("n", buf.n, (B,)), ("window", buf.window, (B, T))]:
        if tuple(t.shape) != shape:
            raise ValueError(f"accept_advance: {name} must be {list(shape)}, got {list(t.shape)}")
    if buf.out.dim() != 2 or buf.out.shape[1] < 1:
        raise ValueError(f"accept_advance: out must be [{B}, Lout >= 1], got {list(buf.out.shape)}")
    if spec:
        for name in ("a", "pending_len", "read_bank", "write_bank", "valid_len") + (("flat_a",) if buf.flat_a is not None else ()):
            t = getattr(buf, name)
            if tuple(t.shape) != (B,):
                raise ValueError(f"accept_advance: {name} must be [{B}], got {list(t.shape)}")
        if (tuple(buf.nxt.shape) != (B, T) or buf.acc_log.dim() != 2 or buf.acc_log.shape[0] < 1
                or buf.acc_log.shape[1] != B or not buf.acc_log.is_contiguous()):
            raise ValueError(f"accept_advance: nxt must be [{B}, {T}] and acc_log a contiguous [LOG >= 1, {B}]")
        for name in ("acc_sum", "step_i"):
            if getattr(buf, name).numel() != 1:
                raise ValueError(f"accept_advance: {name} must hold one element, got {list(getattr(buf, name).shape)}")
    if B == 0:
        return
    if _KERNEL is None:
        _KERNEL = _kernel()
    import triton  # noqa: PLC0415

    z = buf.n  # a placeholder for the pointers AR mode does not read
    TP = max(2, triton.next_power_of_2(T))
    BB = max(16, min(128, triton.next_power_of_2(B)))
    _KERNEL[(1,)](am, buf.window, buf.out, buf.n, buf.a if spec else z, buf.nxt if spec else buf.window,
                  buf.acc_sum if spec else z, buf.acc_log if spec else z, buf.step_i if spec else z,
                  buf.pending_len if spec else z, buf.read_bank if spec else z, buf.write_bank if spec else z,
                  buf.valid_len if spec else z, buf.flat_a if buf.flat_a is not None else z,
                  B, T, buf.out.shape[1], buf.acc_log.shape[0] if spec else 1, am.stride(0), buf.window.stride(0),
                  buf.out.stride(0), buf.nxt.stride(0) if spec else 0,
                  TP=TP, BB=BB, SPEC=spec, FLAT=buf.flat_a is not None, num_warps=4)


# ------------------------------------------------------------------ acceptance-controlled drafts
def control_drafts_ref(trace: torch.Tensor, n: torch.Tensor, alpha: torch.Tensor, window: torch.Tensor,
                       vocab_size: int) -> None:
    """The acceptance-controlled drafter's chain (``DecodeRuntime(alpha=, trace=)``, issue 6): draft
    position ``k = 1..K`` of row ``b`` becomes the target's greedy token ``true = trace[b, min(n[b] + k - 1,
    L - 1)]`` with probability ``alpha``, else ``(true + 1) % vocab_size`` (never the target's token), i.i.d.
    per position, written into ``window[:, 1:]`` (``[B, 1 + K]`` int64). ``trace [B, L]`` int64 is the
    AR run's output; ``n [B]`` int64 the tokens emitted so far; ``alpha`` a one-element float tensor
    (on the device, so it changes without a re-capture). Coins from ``torch.rand`` (the default
    generator). In place; returns nothing."""
    B, T = window.shape
    K, L = T - 1, trace.shape[1]
    idx = (n[:, None] + torch.arange(K, device=n.device)[None, :]).clamp(max=L - 1)
    true = trace.gather(1, idx)
    coin = torch.rand(B, K, device=n.device) < alpha
    window[:, 1:].copy_(torch.where(coin, true, (true + 1) % vocab_size))


def _control_kernel():
    import triton  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415

    @triton.jit
    def _control_drafts_kernel(trace, n, alpha, step_i, window, B, K, L, V, s_t, s_w, seed,
                               BB: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # reads only its predecessors' results (ops/triton_fused.py pdl_enter)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        rows = tl.program_id(0) * BB + tl.arange(0, BB)
        k = tl.arange(0, BK)
        m = (rows < B)[:, None] & (k < K)[None, :]
        r64 = rows.to(tl.int64)
        nb = tl.load(n + rows, mask=rows < B, other=0)
        idx = tl.minimum(nb[:, None] + k[None, :], L - 1)
        true = tl.load(trace + r64[:, None] * s_t + idx, mask=m, other=0)
        # a fresh Philox counter per step and position: the step count (advanced by accept_advance)
        off = ((tl.load(step_i) * B + r64[:, None]) * K + k[None, :]) % 2147483647
        coin = tl.rand(seed, off.to(tl.int32)) < tl.load(alpha)
        tl.store(window + r64[:, None] * s_w + 1 + k[None, :], tl.where(coin, true, (true + 1) % V), mask=m)

    return _control_drafts_kernel


_CONTROL_KERNEL = None
# The Triton kernel on CUDA (off: the torch form; benchmarks/bench_e2e.py --glue-kernels torch)
USE_TRITON_CONTROL = True
CONTROL_SEED = 0x5EC1A  # control_drafts' default Philox key (its counter is the step and the position)


def control_drafts(trace: torch.Tensor, n: torch.Tensor, alpha: torch.Tensor, step_i: torch.Tensor,
                   window: torch.Tensor, vocab_size: int, seed: int = CONTROL_SEED) -> None:
    """:func:`control_drafts_ref`'s contract; on CUDA with :data:`USE_TRITON_CONTROL` one Triton launch
    (programmatic dependent launch on sm90+) in place of its ~10 torch kernels, the coins from Triton's
    Philox (``tl.rand``) keyed by ``seed`` (an int in ``[0, 2**31)``; ``DecodeRuntime`` draws one from
    torch's generator when it is built) with the counter ``(step_i * B + b) * K + k`` (``step_i``:
    one-element int64, the step count that :func:`accept_advance` advances), so each step draws fresh
    coins inside a CUDA graph and a run repeats its coins for the same seed. Another stream of coins
    than ``torch.rand``'s: the same law, not the same draws.

    Raises:
        ValueError: ``window`` not ``[B, 1 + K]`` int64, ``trace`` not ``[B, L >= 1]`` int64, ``n`` not
            ``[B]`` int64, ``alpha`` not a one-element float tensor, ``step_i`` not a one-element int64
            tensor, ``vocab_size < 1``, ``seed`` outside ``[0, 2**31)``, tensors on different devices, or
            (the Triton path) a strided last dim of ``window`` / ``trace`` or a strided ``n``.
    """
    global _CONTROL_KERNEL
    if not isinstance(window, torch.Tensor) or window.dim() != 2:
        raise ValueError(f"control_drafts: window must be a [B, 1 + K] int64 tensor, got "
                         f"{tuple(window.shape) if isinstance(window, torch.Tensor) else type(window).__name__}")
    B, T = window.shape
    if (window.dtype != torch.int64 or trace.dtype != torch.int64 or n.dtype != torch.int64 or T < 2
            or trace.dim() != 2 or trace.shape[0] != B or trace.shape[1] < 1 or tuple(n.shape) != (B,)):
        raise ValueError(f"control_drafts: need window [B, 1 + K >= 2], trace [B, L >= 1] and n [B] int64 (B = {B}); "
                         f"got window {tuple(window.shape)} {window.dtype}, trace {tuple(trace.shape)} {trace.dtype}, "
                         f"n {tuple(n.shape)} {n.dtype}")
    if not isinstance(alpha, torch.Tensor) or alpha.numel() != 1 or not alpha.dtype.is_floating_point:
        raise ValueError(f"control_drafts: alpha must be a one-element float tensor (on the device, so it changes "
                         f"without a re-capture), got {alpha!r}")
    if not isinstance(step_i, torch.Tensor) or step_i.numel() != 1 or step_i.dtype != torch.int64:
        raise ValueError(f"control_drafts: step_i must be a one-element int64 tensor, got {step_i!r}")
    if vocab_size < 1 or not 0 <= seed < 2**31:
        raise ValueError(f"control_drafts: vocab_size must be >= 1 and seed in [0, 2**31), got {vocab_size}, {seed}")
    if len({t.device for t in (trace, n, alpha, window, step_i)}) != 1:
        raise ValueError("control_drafts: trace, n, alpha, step_i and window must be on one device")
    if not (USE_TRITON_CONTROL and _on_gpu(window)):
        control_drafts_ref(trace, n, alpha, window, vocab_size)
        return
    for name, ok in (("window", window.stride(1) == 1), ("trace", trace.stride(1) == 1), ("n", n.is_contiguous())):
        if not ok:
            raise ValueError(f"control_drafts: {name} needs a dense last dim (n: contiguous) on the Triton path")
    if B == 0:
        return
    if _CONTROL_KERNEL is None:
        _CONTROL_KERNEL = _control_kernel()
    import triton  # noqa: PLC0415

    from vllm_specla.ops import pdl as _pdl  # noqa: PLC0415

    K = T - 1
    BB = max(1, min(64, triton.next_power_of_2(B)))
    on = _pdl.enabled(window)
    _CONTROL_KERNEL[(triton.cdiv(B, BB),)](trace, n, alpha, step_i, window, B, K, trace.shape[1], vocab_size,
                                           trace.stride(0), window.stride(0), seed, BB=BB,
                                           BK=max(2, triton.next_power_of_2(K)), PDL=on, num_warps=4,
                                           **_pdl.launch_kw(on))
