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
    pending_len, read_bank, write_bank, valid_len; snap_slots (snapshot mode, else None).
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
    snap_slots: torch.Tensor | None = None

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
    ``read_bank`` / ``write_bank``; ``snap_slots = row * T + a`` (snapshot mode); ``nxt`` = the
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
        if buf.snap_slots is not None:
            buf.snap_slots.copy_(torch.arange(B, device=am.device) * T + a)
        nxt = torch.cat([window[:, 1:], bonus[:, None]], 1)
        buf.nxt.copy_(torch.where(col[None, :] == a[:, None], bonus[:, None], nxt))
    window[:, 0] = bonus


def _kernel():
    import triton  # noqa: PLC0415
    import triton.language as tl  # noqa: PLC0415

    @triton.jit
    def _accept_advance_kernel(am, window, out, n, a_out, nxt, acc_sum, acc_log, step_i, pending, rbank, wbank,
                               valid, snap, B, T, Lout, LOG, s_am, s_w, s_o, s_nx,
                               TP: tl.constexpr, BB: tl.constexpr, SPEC: tl.constexpr, SNAP: tl.constexpr):
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
                if SNAP:
                    tl.store(snap + rows, r64 * T + a64, mask=rm)
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
        if buf.snap_slots is not None:
            named.append(("snap_slots", buf.snap_slots))
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
        for name in ("a", "pending_len", "read_bank", "write_bank", "valid_len") + (("snap_slots",) if buf.snap_slots is not None else ()):
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
                  buf.valid_len if spec else z, buf.snap_slots if buf.snap_slots is not None else z,
                  B, T, buf.out.shape[1], buf.acc_log.shape[0] if spec else 1, am.stride(0), buf.window.stride(0),
                  buf.out.stride(0), buf.nxt.stride(0) if spec else 0,
                  TP=TP, BB=BB, SPEC=spec, SNAP=buf.snap_slots is not None, num_warps=4)
