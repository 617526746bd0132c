"""Batched, differentiable plain-torch chunked gated delta rule for training our model on GPU.

``vllm_specla.ops.reference.chunk_gated_delta_rule_ref`` loops over rows in Python (it is the
oracle); training calls it with ``B`` equal-length rows from zero state, so here every row,
head and chunk is processed at once and only the inter-chunk state recurrence is sequential.
Same math and conventions (ALGORITHMS.md §1, fla 0.6.0 naive reference): l2-normalised q/k,
``q * scale``, per-chunk cumulative log decay ``G``, ``T = (I + A)^-1`` by a unit lower
triangular solve, float32 throughout (autocast disabled inside).

Why not fla's kernels: fla 0.6.0 refuses the gated ``chunk_bwd_dqkwg`` backward under Triton
3.4-3.7.0 on Hopper (fla issue #640), and the H200 image ships Triton 3.6; its forward autotuning
also took minutes on a fresh machine. :func:`install` patches the name that
``vllm_specla.models.gdn.gdn_mix_sequence`` calls; non-uniform rows or an initial state fall
back to the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_specla.ops import reference as _ref

_orig = _ref.chunk_gated_delta_rule_ref


def chunk_gdr_batched(q, k, v, g, beta, scale: float, chunk_size: int = 64, use_qk_l2norm: bool = True):
    """``q, k [B, T, H, K]``, ``v [B, T, HV, V]``, ``g, beta [B, T, HV]`` (zero initial state).

    Returns ``o [B, T, HV, V]`` float32 and ``final [B, HV, V, K]`` float32.
    """
    with torch.autocast(q.device.type, enabled=False):
        B, T, H, K = q.shape
        HV, V = v.shape[-2:]
        C = chunk_size
        q, k, v, g, beta = q.float(), k.float(), v.float(), g.float(), beta.float()
        if use_qk_l2norm:
            q, k = _ref.l2norm(q), _ref.l2norm(k)
        if H != HV:
            q, k = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)
        q = q * scale
        pad = (-T) % C
        if pad:  # zero k/v/beta/g rows change nothing; their outputs are dropped
            q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
            g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
        N = (T + pad) // C
        # [B, HV, N, C, *]
        Q = q.reshape(B, N, C, HV, K).permute(0, 3, 1, 2, 4)
        Kc = k.reshape(B, N, C, HV, K).permute(0, 3, 1, 2, 4)
        Vc = v.reshape(B, N, C, HV, V).permute(0, 3, 1, 2, 4)
        G = g.reshape(B, N, C, HV).permute(0, 3, 1, 2).cumsum(-1)
        Bt = beta.reshape(B, N, C, HV).permute(0, 3, 1, 2)
        causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
        D = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()
        A = (Bt[..., :, None] * (Kc @ Kc.transpose(-1, -2)) * D).tril(-1)
        eye = torch.eye(C, dtype=torch.float32, device=q.device).expand_as(A)
        Tm = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
        eG = G.exp()
        W = Tm @ ((eG * Bt)[..., None] * Kc)          # [B, HV, N, C, K]
        U = Tm @ (Bt[..., None] * Vc)                 # [B, HV, N, C, V]
        P = (Q @ Kc.transpose(-1, -2)) * D            # [B, HV, N, C, C]
        Qg = eG[..., None] * Q
        GC = G[..., -1]                               # [B, HV, N]
        Kd = Kc * (GC[..., None] - G).exp()[..., None]
        S = torch.zeros(B, HV, K, V, dtype=torch.float32, device=q.device)
        outs = []
        for n in range(N):
            Vt = U[:, :, n] - W[:, :, n] @ S
            outs.append(Qg[:, :, n] @ S + P[:, :, n] @ Vt)
            S = GC[:, :, n].exp()[..., None, None] * S + Kd[:, :, n].transpose(-1, -2) @ Vt
        O = torch.stack(outs, 2)                       # [B, HV, N, C, V]
        o = O.permute(0, 2, 3, 1, 4).reshape(B, N * C, HV, V)[:, :T]
        return o, S.transpose(-1, -2)


def chunk_gated_delta_rule_fast(q, k, v, g, beta, scale, cu_seqlens, initial_state=None, chunk_size=64,
                                use_qk_l2norm=True):
    """Drop-in for :func:`chunk_gated_delta_rule_ref` (flattened ``[N, ...]`` varlen layout)."""
    R = cu_seqlens.numel() - 1
    N = q.shape[0]
    if initial_state is None and R > 0 and N % R == 0:
        T = N // R
        if torch.equal(cu_seqlens.cpu(), torch.arange(0, N + 1, T)):
            o, final = chunk_gdr_batched(
                q.reshape(R, T, *q.shape[1:]), k.reshape(R, T, *k.shape[1:]), v.reshape(R, T, *v.shape[1:]),
                g.reshape(R, T, -1), beta.reshape(R, T, -1), scale, chunk_size, use_qk_l2norm)
            return o.reshape(N, *o.shape[2:]), final
    return _orig(q, k, v, g, beta, scale, cu_seqlens, initial_state=initial_state, chunk_size=chunk_size,
                 use_qk_l2norm=use_qk_l2norm)


def install() -> None:
    """Route ``vllm_specla.models.gdn``'s full-sequence path through the batched version."""
    import vllm_specla.models.gdn as gdn  # noqa: PLC0415

    gdn.chunk_gated_delta_rule_ref = chunk_gated_delta_rule_fast


def uninstall() -> None:
    import vllm_specla.models.gdn as gdn  # noqa: PLC0415

    gdn.chunk_gated_delta_rule_ref = _orig
