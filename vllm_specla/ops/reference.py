"""Plain-torch reference versions of every SpecLA op.

These run on any device (the CPU path of vLLM-CPU and of CI) and are the oracle the Triton
kernels are tested against. Shapes and layouts follow ``vllm_specla/ops/__init__.py``; the math
follows ALGORITHMS.md (§1 recurrence, §2 factors and DeltaConstruct, §3 chain verify,
§4 tree conv) which in turn follows fla 0.6.0 ``fla/ops/gated_delta_rule/naive.py`` and
``fla/layers/gated_deltanet.py``.

All recurrent math is done in float32 whatever the input dtype; outputs are float32 (callers
cast). States and factor banks are float32 and are updated in place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2NORM_EPS = 1e-6  # fla's l2norm eps (use_qk_l2norm_in_kernel=True)


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim, in float32 (fla ``l2norm`` convention)."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gdn_gating_ref(
    A_log: torch.Tensor,
    a: torch.Tensor,
    dt_bias: torch.Tensor,
    b: torch.Tensor,
    allow_neg_eigval: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log decay and write strength of the gated delta rule (ALGORITHMS.md §1).

    Args:
        A_log: ``[HV]``; a, b: ``[N, HV]`` (a_proj / b_proj outputs); dt_bias: ``[HV]``.
    Returns:
        ``g [N, HV]`` float32, ``g = -exp(A_log) * softplus(a + dt_bias)`` (softplus beta 1,
        threshold 20, as fla/vLLM) and ``beta [N, HV]`` float32 ``= sigmoid(b)`` (x2 when
        ``allow_neg_eigval``).
    """
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float(), beta=1.0, threshold=20.0)
    beta = b.float().sigmoid()
    if allow_neg_eigval:
        beta = beta * 2.0
    return g, beta


def _expand_heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    """``[..., H, D] -> [..., HV, D]`` for grouped value heads (value head hv uses key head hv // (HV/H))."""
    h = x.shape[-2]
    return x if h == hv else x.repeat_interleave(hv // h, dim=-2)


def _rows(cu_seqlens: torch.Tensor, num_tokens: int | None = None) -> list[tuple[int, int]]:
    """``[(start, end)]`` per row of ``cu_seqlens [R+1]``; raises ValueError unless it is non-decreasing within
    ``[0, num_tokens]`` (the C++ ops' check, ``csrc/cpu/gdn_verify.cpp``)."""
    b = cu_seqlens.tolist()
    if b and (b[0] < 0 or any(x > y for x, y in zip(b, b[1:])) or (num_tokens is not None and b[-1] > num_tokens)):
        hi = num_tokens if num_tokens is not None else "N"
        shown = b if len(b) <= 9 else b[:8] + ["..."]
        raise ValueError(f"cu_seqlens must be non-decreasing within [0, {hi}], got {shown}")
    return [(b[i], b[i + 1]) for i in range(len(b) - 1)]


def _row_ints(name: str, t: torch.Tensor | None, num_rows: int, lo: int | None, hi: int) -> list[int] | None:
    """The first ``num_rows`` entries of a per-row int argument as a list (None stays None); raises ValueError naming
    ``name`` unless it has that many, each in ``[lo, hi)`` (slots: ``[0, num_slots)`` -- a padding slot ``-1``
    would index the last slot; bank indices ``[0, 2)``; ``lo`` None: no lower bound)."""
    if t is None:
        return None
    vals = t.reshape(-1).tolist() if isinstance(t, torch.Tensor) else [int(x) for x in t]  # (a list works too)
    if len(vals) < num_rows:
        raise ValueError(f"{name} must have an entry for each of the {num_rows} rows, got {len(vals)}")
    vals = vals[:num_rows]  # (entries past the rows are not used)
    bad = [x for x in vals if not ((lo is None or lo <= x) and x < hi)]
    if bad:
        allowed = f"<= {hi - 1}" if lo is None else f"in [{lo}, {hi - 1}]"
        raise ValueError(f"{name} must be {allowed}, got {bad[0]}")
    return vals


def _check_row_args(num_rows: int, slots, num_slots: int, bank: torch.Tensor | None, pending_len=None, read_bank=None,
                    write_bank=None) -> tuple[list[int], list[int]]:
    """The per-row arguments of the verify references (chain, conv, tree): one slot in ``[0, num_slots)`` per row,
    bank indices 0 / 1 (``write_bank`` on every row, ``read_bank`` on the rows with a pending count > 0, as the
    C++ ops check them), a read bank and the factor banks (``bank``: ``bank_k`` or ``bank_x``, ``[S, 2, Tmax, ...]``;
    None when any of them is missing) where a pending count is > 0 or a ``write_bank`` is given. Returns
    ``(slots, pending)`` as lists, the pending counts clamped to ``[0, Tmax]`` (all 0 without ``pending_len``).
    Raises ValueError naming the argument."""
    slots_l = _row_ints("slots", slots, num_rows, 0, num_slots)
    raw = _row_ints("pending_len", pending_len, num_rows, None, 2**63) or [0] * num_rows
    if any(p > 0 for p in raw) and (read_bank is None or bank is None):
        raise ValueError("pending_len > 0 needs read_bank and the factor banks")
    if write_bank is not None and bank is None:
        raise ValueError("write_bank needs the factor banks")
    # pending counts clamp to [0, Tmax] (the Triton kernels' contract, tests/test_kernels_gpu.py; the C++ op refuses
    # counts above Tmax)
    pend = [min(max(p, 0), bank.shape[2]) for p in raw] if bank is not None else [0] * num_rows
    if any(pend):
        rb = _row_ints("read_bank", read_bank, num_rows, None, 2**63)
        used = [b for b, p in zip(rb, pend) if p > 0]
        _row_ints("read_bank", used, len(used), 0, 2)
    _row_ints("write_bank", write_bank, num_rows, 0, 2)
    return slots_l, pend


def check_f32_state(state: torch.Tensor, name: str = "state") -> None:
    """The recurrent state (and the factor banks) are float32 in every backend: the C++ ops refuse another dtype
    with this RuntimeError (torch's own ops raise RuntimeError for a tensor of the wrong dtype), the Triton kernels
    assert it; the references refuse it the same way instead of computing in another precision."""
    if state.dtype != torch.float32:
        raise RuntimeError(f"{name} must be float32, got {state.dtype}")


# --------------------------------------------------------------------------------------------
# Gated delta rule: per-token recurrence (oracle) and chunked UT form (prefill)
# --------------------------------------------------------------------------------------------


def recurrent_gated_delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token gated delta rule over varlen rows (ALGORITHMS.md §1, [V, K] form).

    ``M_t = e^{g_t} M_{t-1};  v~_t = beta_t (v_t - M_t k_t);  M_t += v~_t k_t^T;  o_t = M_t q_t``.

    Args:
        q, k: ``[N, H, K]``; v: ``[N, HV, V]``; g, beta: ``[N, HV]``; scale: q scale (1/sqrt(K)).
        cu_seqlens: ``[R+1]`` int row bounds; initial_state: ``[R, HV, V, K]`` or None (zeros).
    Returns:
        ``o [N, HV, V]`` float32 and ``final_state [R, HV, V, K]`` float32.
    """
    HV, V = v.shape[-2:]
    K = k.shape[-1]
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = _expand_heads(q.float(), HV) * scale
    k = _expand_heads(k.float(), HV)
    v, g, beta = v.float(), g.float(), beta.float()
    rows = _rows(cu_seqlens)
    o = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    final = torch.zeros(len(rows), HV, V, K, dtype=torch.float32, device=v.device)
    for r, (s, e) in enumerate(rows):
        M = initial_state[r].float().clone() if initial_state is not None else final[r]
        for t in range(s, e):
            M = M * g[t].exp()[:, None, None]
            vt = beta[t][:, None] * (v[t] - torch.einsum("hvk,hk->hv", M, k[t]))
            M = M + vt[:, :, None] * k[t][:, None, :]
            o[t] = torch.einsum("hvk,hk->hv", M, q[t])
        final[r] = M
    return o, final


def chunk_gated_delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
    use_qk_l2norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked (UT / WY) form of the gated delta rule for prefill, varlen rows.

    Per chunk of ``C`` tokens with in-chunk cumulative decay ``G`` (ALGORITHMS.md §4 with a chain
    topology): ``A = strict_tril(beta_t (k_t.k_u) e^{G_t-G_u})``, ``T = (I+A)^-1``,
    ``V~ = T(beta V) - T((e^G beta) K) S``, ``O = (e^G Q) S + (tril(Q K^T) * D) V~``,
    ``S' = e^{G_C} S + (K e^{G_C-G})^T V~`` with ``S = M^T`` in [K, V] form.

    Same arguments and returns as :func:`recurrent_gated_delta_rule_ref`.
    """
    HV, V = v.shape[-2:]
    K = k.shape[-1]
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = _expand_heads(q.float(), HV) * scale
    k = _expand_heads(k.float(), HV)
    v, g, beta = v.float(), g.float(), beta.float()
    rows = _rows(cu_seqlens)
    o = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    final = torch.empty(len(rows), HV, V, K, dtype=torch.float32, device=v.device)
    for r, (s, e) in enumerate(rows):
        # S in [K, V] form per head: [HV, K, V]
        if initial_state is not None:
            S = initial_state[r].float().transpose(-1, -2).clone()
        else:
            S = torch.zeros(HV, K, V, dtype=torch.float32, device=v.device)
        for cs in range(s, e, chunk_size):
            ce = min(cs + chunk_size, e)
            C = ce - cs
            Q = q[cs:ce].transpose(0, 1)  # [HV, C, K]
            Kc = k[cs:ce].transpose(0, 1)
            Vc = v[cs:ce].transpose(0, 1)  # [HV, C, V]
            G = g[cs:ce].transpose(0, 1).cumsum(-1)  # [HV, C]
            B = beta[cs:ce].transpose(0, 1)  # [HV, C]
            causal = torch.ones(C, C, dtype=torch.bool, device=v.device).tril()
            diff = (G[:, :, None] - G[:, None, :]).masked_fill(~causal, float("-inf"))
            D = diff.exp()  # [HV, C, C], zero above the diagonal
            A = (B[:, :, None] * (Kc @ Kc.transpose(-1, -2)) * D).tril(-1)
            eye = torch.eye(C, dtype=torch.float32, device=v.device).expand(HV, C, C)
            T = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
            Vt = T @ (B[..., None] * Vc) - T @ ((G.exp() * B)[..., None] * Kc) @ S
            O = (G.exp()[..., None] * Q) @ S + ((Q @ Kc.transpose(-1, -2)) * D) @ Vt
            o[cs:ce] = O.transpose(0, 1)
            GC = G[:, -1:]
            S = GC.exp()[..., None] * S + (Kc * (GC - G).exp()[..., None]).transpose(-1, -2) @ Vt
        final[r] = S.transpose(-1, -2)
    return o, final


# --------------------------------------------------------------------------------------------
# SpecLA: chain verify with factors, DeltaConstruct recovery (ALGORITHMS.md §2, §3, §6)
# --------------------------------------------------------------------------------------------


def _apply_pending_(
    M: torch.Tensor, bk: torch.Tensor, bv: torch.Tensor, bg: torch.Tensor, HV: int
) -> torch.Tensor:
    """Serial flush form of DeltaConstruct: ``acc = e^{g_u} acc + v~_u k_u^T`` for u in order."""
    kk = _expand_heads(bk, HV)
    for u in range(bk.shape[0]):
        M = M * bg[u].exp()[:, None, None] + bv[u][:, :, None] * kk[u][:, None, :]
    return M


def check_out_slots(out_slots: torch.Tensor, num_rows: int, write_final_state: bool, *banks) -> None:
    """The ``out_slots`` contract of the public ``chain_verify`` / ``conv_verify`` (arguments and
    shapes only, no host sync): with ``write_final_state``, no factor bank / write bank / pending
    factors (``banks``: those arguments, all None), one out slot per row.

    Raises:
        ValueError: naming the field that breaks the contract.
    """
    if not write_final_state:
        raise ValueError("out_slots needs write_final_state=True (the state after the window goes there)")
    if any(b is not None for b in banks):
        raise ValueError("out_slots: factor banks, write_bank and pending_len must be None (banks are indexed "
                         "by the read slot)")
    if out_slots.numel() < num_rows:
        raise ValueError(f"out_slots ({out_slots.numel()}) must cover the {num_rows} rows of cu_seqlens")


def chain_verify_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    state: torch.Tensor,
    slots: torch.Tensor,
    cu_seqlens: torch.Tensor,
    bank_k: torch.Tensor | None = None,
    bank_v: torch.Tensor | None = None,
    bank_g: torch.Tensor | None = None,
    write_bank: torch.Tensor | None = None,
    pending_len: torch.Tensor | None = None,
    read_bank: torch.Tensor | None = None,
    write_final_state: bool = False,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """State-resident chain verify with factor output (ALGORITHMS.md §3, §6).

    For each row ``r`` (one request's window of ``T_r = cu[r+1]-cu[r]`` tokens, ``T_r >= 1``) on
    state slot ``s = slots[r]``:

    1. deferred commit: if ``pending_len[r] = p > 0``, fold the ``p`` pending factors of bank
       ``read_bank[r]`` into ``state[s]`` (serial DeltaConstruct) and write ``state[s]`` once;
    2. run the window from that state kept local (never written per token), emitting
       ``o_t = M_t q_t`` and, when banks are given, the factors ``(k^_t, v~_t, g_t)`` into bank
       ``write_bank[r]`` at positions ``0..T_r-1``;
    3. if ``write_final_state`` (AR decode, or committing a prefill chunk) write the state after
       the last token into ``state[s]``.

    Args:
        q, k: ``[N, H, K]`` (post-conv; l2-normalised here when ``use_qk_l2norm``);
        v: ``[N, HV, V]``; g, beta: ``[N, HV]`` float (see :func:`gdn_gating_ref`).
        state: ``[num_slots, HV, V, K]`` float32, updated in place.
        slots: ``[R]`` int64 state-slot index per row. cu_seqlens: ``[R+1]`` int row bounds.
        bank_k/bank_v/bank_g: factor banks (layouts in ``ops/__init__.py``) or None.
        write_bank, read_bank, pending_len: ``[R]`` int per row (bank index 0/1, pending count).
    Returns:
        ``o [N, HV, V]`` float32.
    Raises:
        ValueError: if a window is longer than the bank's ``Tmax``; ``cu_seqlens`` not non-decreasing within
            ``[0, N]``; ``slots`` (or ``write_bank``, ``pending_len``, ``read_bank``) without an entry per row; a
            slot outside ``[0, num_slots)``; a bank index outside ``{0, 1}``; ``pending_len > 0`` without
            ``read_bank`` and the banks, or ``write_bank`` without the banks. The C++ op
            (``csrc/cpu/gdn_verify.cpp``) raises ValueError with the same messages for these.
        RuntimeError: ``state`` not float32 (as the C++ op; the Triton kernels assert it).

    Backend differences (intended): pending counts outside ``[0, Tmax]`` are clamped to it here and by the
    Triton kernels (which cannot raise without a host sync), while the C++ op refuses a count above ``Tmax``
    (ValueError); the C++ op also refuses two rows that write the same state slot (ValueError), where this
    reference runs the rows in order.
    """
    check_f32_state(state)
    HV, V = v.shape[-2:]
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q, k = q.float(), k.float()
    qe = _expand_heads(q, HV) * scale
    ke = _expand_heads(k, HV)
    v, g, beta = v.float(), g.float(), beta.float()
    rows = _rows(cu_seqlens, v.shape[0])
    banks = bank_k if bank_v is not None and bank_g is not None else None
    slots_l, pend = _check_row_args(len(rows), slots, state.shape[0], banks, pending_len, read_bank, write_bank)
    o = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for r, (s, e) in enumerate(rows):
        slot = slots_l[r]
        M = state[slot].clone()
        p = pend[r]
        if p > 0:
            rb = int(read_bank[r])
            M = _apply_pending_(M, bank_k[slot, rb, :p], bank_v[slot, rb, :p], bank_g[slot, rb, :p], HV)
            state[slot] = M
        record = write_bank is not None
        if record and (e - s) > bank_k.shape[2]:
            raise ValueError(f"window of {e - s} tokens exceeds the factor bank (Tmax={bank_k.shape[2]})")
        for t in range(s, e):
            M = M * g[t].exp()[:, None, None]
            vt = beta[t][:, None] * (v[t] - torch.einsum("hvk,hk->hv", M, ke[t]))
            M = M + vt[:, :, None] * ke[t][:, None, :]
            o[t] = torch.einsum("hvk,hk->hv", M, qe[t])
            if record:
                wb = int(write_bank[r])
                bank_k[slot, wb, t - s] = k[t]
                bank_v[slot, wb, t - s] = vt
                bank_g[slot, wb, t - s] = g[t]
        if write_final_state:
            state[slot] = M
    return o


def chain_verify_snapshots_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    state: torch.Tensor,
    slots: torch.Tensor,
    cu_seqlens: torch.Tensor,
    snap: torch.Tensor,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """Per-token-snapshot verify (the vLLM-native baseline, benchmarks only).

    Like :func:`chain_verify_ref` without factors, but writes the full state after every window
    token ``t`` of row ``r`` into ``snap[r, t]`` (``snap [R, Tmax, HV, V, K]`` float32). ``state``
    may be a view of ``snap`` (``snap.view(R * Tmax, HV, V, K)``, rollback = read slot
    ``r * Tmax + num_accepted - 1``): each row's state is read before any of its snapshots is
    written. Returns ``o [N, HV, V]`` float32.
    """
    o = torch.empty(q.shape[0], v.shape[1], v.shape[2], dtype=torch.float32, device=v.device)
    for r, (s, e) in enumerate(_rows(cu_seqlens)):
        tmp = state[int(slots[r])].clone()[None]
        for t in range(s, e):
            o[t : t + 1] = chain_verify_ref(
                q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], scale=scale,
                state=tmp, slots=torch.zeros(1, dtype=torch.long), cu_seqlens=torch.tensor([0, 1]),
                write_final_state=True, use_qk_l2norm=use_qk_l2norm)
            snap[r, t - s] = tmp[0]
    return o


def _commit_rows(slots, bank_idx, num_accepted, num_slots: int, tmax: int) -> list[tuple[int, int, int]]:
    """``(slot, bank, count)`` of the rows of a commit (recover / conv commit) with a count > 0, checked as the
    C++ ops check them (``csrc/cpu/commit_conv.cpp``): ValueError naming the argument."""
    R = slots.numel() if isinstance(slots, torch.Tensor) else len(slots)
    sl = _row_ints("slots", slots, R, None, 2**63)
    bi = _row_ints("bank_idx", bank_idx, R, None, 2**63)
    na = _row_ints("num_accepted", num_accepted, R, None, 2**63)
    act = [(s, b, n) for s, b, n in zip(sl, bi, na) if n > 0]
    _row_ints("slots", [s for s, _, _ in act], len(act), 0, num_slots)
    _row_ints("bank_idx", [b for _, b, _ in act], len(act), 0, 2)
    for _, _, n in act:
        if n > tmax:
            raise ValueError(f"num_accepted {n} exceeds the factor bank (Tmax={tmax})")
    return act


def recover_ref(
    state: torch.Tensor,
    slots: torch.Tensor,
    bank_k: torch.Tensor,
    bank_v: torch.Tensor,
    bank_g: torch.Tensor,
    bank_idx: torch.Tensor,
    num_accepted: torch.Tensor,
) -> None:
    """DeltaConstruct commit of an accepted chain prefix, closed form (ALGORITHMS.md §2).

    ``M_A = e^{G_A} M_0 + sum_{u<=A} e^{G_A - G_u} v~_u k_u^T`` with ``G`` the cumulative log
    decay along the accepted path, for ``A = num_accepted[r]`` factors (nodes 0..A-1 of the
    window; ``A = 0`` is a no-op). Updates ``state[slots[r]]`` in place.

    Args:
        state: ``[num_slots, HV, V, K]`` float32; slots, bank_idx, num_accepted: ``[R]`` int.
        bank_*: factor banks (``ops/__init__.py``).
    Raises:
        ValueError: ``bank_idx`` or ``num_accepted`` without an entry per slot; on a row with ``num_accepted > 0``
            (rows with 0 or less are skipped unread, in every backend) a slot outside ``[0, num_slots)``, a bank
            index outside ``{0, 1}`` or ``num_accepted`` above the bank's ``Tmax``: the C++ op's checks and
            messages (``csrc/cpu/commit_conv.cpp``). The Triton kernel cannot raise: it clamps counts to ``Tmax``.
        RuntimeError: ``state`` not float32 (as the C++ op; the Triton kernel asserts it).
    """
    check_f32_state(state)
    HV = state.shape[1]
    for slot, b, n in _commit_rows(slots, bank_idx, num_accepted, state.shape[0], bank_k.shape[2]):
        kk = _expand_heads(bank_k[slot, b, :n], HV)  # [n, HV, K]
        vv = bank_v[slot, b, :n]  # [n, HV, V]
        G = bank_g[slot, b, :n].cumsum(0)  # [n, HV]
        w = (G[-1:] - G).exp()  # [n, HV]
        state[slot] = G[-1].exp()[:, None, None] * state[slot] + torch.einsum("uh,uhv,uhk->hvk", w, vv, kk)


# --------------------------------------------------------------------------------------------
# Short causal conv on conv-state slots (SiLU), prefill and verify windows
# --------------------------------------------------------------------------------------------


def _conv_silu(hist: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y_t = SiLU(sum_i w[:, i] * z[t + i]) over z = hist (W-1 rows) ++ x (T rows): ``[T, C]``."""
    W = weight.shape[-1]
    z = torch.cat([hist, x], 0)  # [W-1+T, C]
    T = x.shape[0]
    y = torch.zeros_like(x)
    for i in range(W):
        y = y + weight[:, i] * z[i : i + T]
    return F.silu(y)


def causal_conv1d_prefill_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    has_initial_state: torch.Tensor,
) -> torch.Tensor:
    """Depthwise causal conv + SiLU for prefill rows; commits the new conv window.

    Args:
        x: ``[N, C]`` raw conv inputs (q|k|v projections); weight: ``[C, W]``.
        conv_state: ``[num_slots, W-1, C]`` (updated in place with the last W-1 inputs of
        history ++ row); has_initial_state: ``[R]`` bool (False: history is zeros).
    Returns:
        ``y [N, C]`` float32.
    """
    W = weight.shape[-1]
    x32, w32 = x.float(), weight.float()
    y = torch.empty_like(x32)
    for r, (s, e) in enumerate(_rows(cu_seqlens)):
        slot = int(slots[r])
        hist = conv_state[slot].float() if bool(has_initial_state[r]) else x32.new_zeros(W - 1, x.shape[1])
        y[s:e] = _conv_silu(hist, x32[s:e], w32)
        conv_state[slot] = torch.cat([hist, x32[s:e]], 0)[-(W - 1) :].to(conv_state.dtype)
    return y


def conv_verify_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    *,
    bank_x: torch.Tensor | None = None,
    write_bank: torch.Tensor | None = None,
    pending_len: torch.Tensor | None = None,
    read_bank: torch.Tensor | None = None,
    write_final_state: bool = False,
) -> torch.Tensor:
    """Conv for verify / decode windows, with the deferred conv commit (ALGORITHMS.md §2, §6).

    Per row: history = last ``W-1`` of ``conv_state[s] ++ bank_x[s, read_bank, :pending_len]``
    (committed into ``conv_state[s]`` when ``pending_len > 0``); ``y = conv(history ++ x_row)``;
    the raw inputs are recorded into ``bank_x[s, write_bank, :T]``; with ``write_final_state``
    (AR) the window is committed directly instead.

    Returns:
        ``y [N, C]`` float32.
    Raises:
        ValueError: the per-row argument checks of :func:`chain_verify_ref` (``bank_x`` for the banks); the C++ op
            (``csrc/cpu/commit_conv.cpp``) raises ValueError with the same messages. Backend differences as there:
            pending counts above ``Tmax`` are clamped here and by Triton, refused by the C++ op.
    """
    W = weight.shape[-1]
    x32, w32 = x.float(), weight.float()
    y = torch.empty_like(x32)
    rows = _rows(cu_seqlens, x.shape[0])
    slots_l, pend = _check_row_args(len(rows), slots, conv_state.shape[0], bank_x, pending_len, read_bank,
                                    write_bank)
    for r, (s, e) in enumerate(rows):
        slot = slots_l[r]
        hist = conv_state[slot].float()
        if pend[r] > 0:
            hist = torch.cat([hist, bank_x[slot, int(read_bank[r]), : pend[r]]], 0)[-(W - 1) :]
            conv_state[slot] = hist.to(conv_state.dtype)
        y[s:e] = _conv_silu(hist, x32[s:e], w32)
        if write_bank is not None:
            bank_x[slot, int(write_bank[r]), : e - s] = x32[s:e]
        if write_final_state:
            conv_state[slot] = torch.cat([hist, x32[s:e]], 0)[-(W - 1) :].to(conv_state.dtype)
    return y


def conv_step_heads(C: int, state: torch.Tensor, write: bool, out_slots: torch.Tensor | None) -> int:
    """The key head count ``H`` of a one-token conv step (``conv_chain_step``) with ``C`` conv channels over a
    ``[S, HV, V, K]`` state: ``C = 2 H K + HV V`` (q | k | v) with ``H`` dividing ``HV``.

    Raises:
        ValueError: no such ``H``; ``out_slots`` given with ``write=False``.
    """
    HV, V, K = state.shape[1:]
    H = (C - HV * V) // (2 * K) if C > HV * V else 0
    if H < 1 or 2 * H * K + HV * V != C or HV % H:
        raise ValueError(f"conv_chain_step: x has {C} channels, not 2 * H * {K} + {HV} * {V} for a key head count "
                         f"H dividing HV = {HV}")
    if out_slots is not None and not write:
        raise ValueError("conv_chain_step: out_slots needs write=True (the state after the token goes there)")
    return H


def conv_chain_step_ref(
    x: torch.Tensor,
    conv_w: torch.Tensor,
    conv_state: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    state: torch.Tensor,
    slots: torch.Tensor,
    write: bool = True,
    out_slots: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """One token per row through the short conv and the gated delta rule: :func:`conv_verify_ref` then
    :func:`chain_verify_ref` on the conv output's q | k | v column slices, ``cu_seqlens = arange(R + 1)``
    (the oracle of ``triton_chain.conv_chain_step``, which does both in one launch).

    Args:
        x: ``[R, C]`` conv inputs, ``C = 2 H K + HV V`` (q | k | v channels); conv_w ``[C, W]``;
            conv_state ``[S, W-1, C]``; g, beta ``[R, HV]``; state ``[S, HV, V, K]`` float32; slots ``[R]``.
        write: the state and window after the token are stored (AR); False: both only read.
        out_slots: ``[R]`` slots that receive them instead of ``slots`` (``write`` only).
    Returns:
        ``o [R, HV, V]`` float32.
    Raises:
        ValueError: ``C`` not of the form ``2 H K + HV V``, or ``out_slots`` without ``write``.
    """
    R, C = x.shape
    H = conv_step_heads(C, state, write, out_slots)
    S, HV, V, K = state.shape
    slots = slots[:R].to(device=state.device, dtype=torch.long)
    if out_slots is not None:  # run in place on the out slots, from copies of the read slots
        out = out_slots[:R].to(device=state.device, dtype=torch.long)
        state.index_copy_(0, out, state.index_select(0, slots))
        conv_state.index_copy_(0, out, conv_state.index_select(0, slots))
        slots = out
    cu = torch.arange(R + 1, device=x.device)
    y = conv_verify_ref(x, conv_w, cu, conv_state, slots, write_final_state=write)
    q = y[:, : H * K].reshape(R, H, K)
    k = y[:, H * K : 2 * H * K].reshape(R, H, K)
    v = y[:, 2 * H * K :].reshape(R, HV, V)
    return chain_verify_ref(q, k, v, g, beta, scale=scale, state=state, slots=slots, cu_seqlens=cu,
                            write_final_state=write, use_qk_l2norm=use_qk_l2norm)


def conv_commit_ref(
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    bank_x: torch.Tensor,
    bank_idx: torch.Tensor,
    num_accepted: torch.Tensor,
) -> None:
    """Conv-window commit of an accepted prefix: ``conv_state[s] = last W-1 of (conv_state[s] ++ x[:A])``.

    Raises:
        ValueError: as :func:`recover_ref` (``num_accepted`` above ``bank_x``'s ``Tmax`` included).
    """
    W1 = conv_state.shape[1]
    for slot, b, n in _commit_rows(slots, bank_idx, num_accepted, conv_state.shape[0], bank_x.shape[2]):
        z = torch.cat([conv_state[slot].float(), bank_x[slot, b, :n]], 0)
        conv_state[slot] = z[-W1:].to(conv_state.dtype)
