"""Reference ops vs independent oracles (CPU, fp32; tolerances stated per test).

Oracles: fla 0.6.0's pure-torch ``naive_recurrent_gated_delta_rule`` / ``naive_chunk_gated_delta_rule``
(independent code), and a direct per-token recurrence written here.
"""

from __future__ import annotations

import pytest
import torch

from vllm_specla.ops.reference import (
    chain_verify_ref,
    chunk_gated_delta_rule_ref,
    conv_commit_ref,
    conv_verify_ref,
    causal_conv1d_prefill_ref,
    l2norm,
    recover_ref,
    recurrent_gated_delta_rule_ref,
)

ATOL = 2e-5  # fp32, O(1) inputs, windows <= 70 tokens


def _inputs(lens, H=2, HV=4, K=16, V=24, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    N = sum(lens)
    q = torch.randn(N, H, K, generator=g).to(dtype)
    k = torch.randn(N, H, K, generator=g).to(dtype)
    v = torch.randn(N, HV, V, generator=g).to(dtype)
    gg = -torch.rand(N, HV, generator=g) * 0.7 - 0.01
    beta = torch.rand(N, HV, generator=g)
    cu = torch.tensor([0] + lens).cumsum(0)
    init = torch.randn(len(lens), HV, V, K, generator=g) * 0.2
    return q, k, v, gg, beta, cu, init


def _per_token(q, k, v, g, beta, scale, M):
    """Direct per-token gated delta rule in [K, V] form (S = M^T), one sequence, one head group."""
    HV = v.shape[1]
    rep = HV // q.shape[1]
    S = M.transpose(-1, -2).clone()  # [HV, K, V]
    outs = []
    for t in range(q.shape[0]):
        qt = l2norm(q[t]).repeat_interleave(rep, 0) * scale
        kt = l2norm(k[t]).repeat_interleave(rep, 0)
        S = S * g[t].exp()[:, None, None]
        u = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", S, kt))
        S = S + kt[:, :, None] * u[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", S, qt))
    return torch.stack(outs), S.transpose(-1, -2)


@pytest.mark.parametrize("lens", [[5, 70, 1], [1], [64, 65]])
def test_recurrent_and_chunk_match_fla_naive(lens):
    fla_naive = pytest.importorskip("fla.ops.gated_delta_rule.naive")
    q, k, v, g, beta, cu, init = _inputs(lens)
    scale = q.shape[-1] ** -0.5
    o_r, f_r = recurrent_gated_delta_rule_ref(q, k, v, g, beta, scale, cu, init)
    o_c, f_c = chunk_gated_delta_rule_ref(q, k, v, g, beta, scale, cu, init, chunk_size=16)
    torch.testing.assert_close(o_c, o_r, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(f_c, f_r, atol=ATOL, rtol=1e-4)
    for r in range(len(lens)):
        s, e = int(cu[r]), int(cu[r + 1])
        qq = l2norm(q[s:e]).repeat_interleave(2, 1)[None]
        kk = l2norm(k[s:e]).repeat_interleave(2, 1)[None]
        h0 = init[r].transpose(-1, -2)[None]
        o1, s1 = fla_naive.naive_recurrent_gated_delta_rule(qq, kk, v[s:e][None], beta[s:e][None], g[s:e][None],
                                                             initial_state=h0, output_final_state=True)
        o2, s2 = fla_naive.naive_chunk_gated_delta_rule(qq, kk, v[s:e][None], g[s:e][None], beta[s:e][None],
                                                        initial_state=h0, output_final_state=True)
        torch.testing.assert_close(o_r[s:e], o1[0], atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(f_r[r], s1[0].transpose(-1, -2), atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(o_c[s:e], o2[0], atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(f_c[r], s2[0].transpose(-1, -2), atol=ATOL, rtol=1e-4)


def test_recurrent_matches_direct_per_token_recurrence():
    q, k, v, g, beta, cu, init = _inputs([9, 3])
    scale = q.shape[-1] ** -0.5
    o, f = recurrent_gated_delta_rule_ref(q, k, v, g, beta, scale, cu, init)
    for r in range(2):
        s, e = int(cu[r]), int(cu[r + 1])
        o2, f2 = _per_token(q[s:e], k[s:e], v[s:e], g[s:e], beta[s:e], scale, init[r])
        torch.testing.assert_close(o[s:e], o2, atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(f[r], f2, atol=ATOL, rtol=1e-4)


def test_chunked_prefill_equals_token_by_token_decode():
    """Prefill a row in one chunked call == feeding it one token at a time through chain_verify (AR)."""
    q, k, v, g, beta, cu, init = _inputs([37])
    scale = q.shape[-1] ** -0.5
    o_pf, f_pf = chunk_gated_delta_rule_ref(q, k, v, g, beta, scale, cu, init, chunk_size=8)
    state = init.clone()
    outs = []
    for t in range(37):
        outs.append(chain_verify_ref(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], scale=scale,
                                     state=state, slots=torch.tensor([0]), cu_seqlens=torch.tensor([0, 1]),
                                     write_final_state=True))
    torch.testing.assert_close(torch.cat(outs), o_pf, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(state[0], f_pf[0], atol=ATOL, rtol=1e-4)


def _banks(S, T, H, HV, K, V, C=8):
    return (torch.full((S, 2, T, H, K), float("nan")), torch.full((S, 2, T, HV, V), float("nan")),
            torch.full((S, 2, T, HV), float("nan")), torch.full((S, 2, T, C), float("nan")))


@pytest.mark.parametrize("K_draft", [1, 2, 4, 8])
def test_chain_verify_outputs_and_delta_construct_every_prefix(K_draft):
    """Verify outputs == sequential recurrence; DeltaConstruct(factors[:A]) == sequential state after A
    tokens for EVERY A in 0..K+1, on two slots of a 4-slot cache; the state is not written."""
    T = K_draft + 1
    q, k, v, g, beta, cu, init = _inputs([T, T], seed=K_draft)
    H, HV, Kd, V = 2, 4, 16, 24
    scale = Kd ** -0.5
    state = torch.randn(4, HV, V, Kd)
    slots = torch.tensor([3, 1])
    state[slots] = init
    before = state.clone()
    bk, bv, bg, _ = _banks(4, T, H, HV, Kd, V)
    wb = torch.tensor([1, 0])
    o = chain_verify_ref(q, k, v, g, beta, scale=scale, state=state, slots=slots, cu_seqlens=cu,
                         bank_k=bk, bank_v=bv, bank_g=bg, write_bank=wb)
    assert torch.equal(state, before), "chain verify must not write the state"
    for r in range(2):
        s = int(cu[r])
        o_seq, _ = _per_token(q[s:s + T], k[s:s + T], v[s:s + T], g[s:s + T], beta[s:s + T], scale, init[r])
        torch.testing.assert_close(o[s:s + T], o_seq, atol=ATOL, rtol=1e-4)
        for A in range(0, T + 1):
            st = state.clone()
            recover_ref(st, slots[r:r + 1], bk, bv, bg, wb[r:r + 1], torch.tensor([A]))
            if A == 0:
                exp = init[r]
            else:
                _, exp = _per_token(q[s:s + A], k[s:s + A], v[s:s + A], g[s:s + A], beta[s:s + A], scale, init[r])
            torch.testing.assert_close(st[int(slots[r])], exp, atol=ATOL, rtol=1e-4)
            others = [i for i in range(4) if i != int(slots[r])]
            assert torch.equal(st[others], state[others])


def test_deferred_commit_fused_equals_separate_commit():
    """chain_verify with pending factors folded in == recover() then chain_verify."""
    q, k, v, g, beta, cu, init = _inputs([5, 5, 3, 3], seed=5)
    scale = 16 ** -0.5
    H, HV, Kd, V = 2, 4, 16, 24
    bk, bv, bg, _ = _banks(2, 5, H, HV, Kd, V)
    state = init[:2].clone()
    slots = torch.tensor([0, 1])
    chain_verify_ref(q[:10], k[:10], v[:10], g[:10], beta[:10], scale=scale, state=state, slots=slots,
                     cu_seqlens=cu[:3], bank_k=bk, bank_v=bv, bank_g=bg, write_bank=torch.tensor([0, 0]))
    acc = torch.tensor([2, 5])
    s_sep = state.clone()
    recover_ref(s_sep, slots, bk, bv, bg, torch.tensor([0, 0]), acc)
    cu2 = torch.tensor([0, 3, 6])
    bk2, bv2, bg2 = bk.clone(), bv.clone(), bg.clone()
    o_sep = chain_verify_ref(q[10:], k[10:], v[10:], g[10:], beta[10:], scale=scale, state=s_sep, slots=slots,
                             cu_seqlens=cu2, bank_k=bk2, bank_v=bv2, bank_g=bg2, write_bank=torch.tensor([1, 1]))
    s_fused = state.clone()
    o_fused = chain_verify_ref(q[10:], k[10:], v[10:], g[10:], beta[10:], scale=scale, state=s_fused, slots=slots,
                               cu_seqlens=cu2, bank_k=bk, bank_v=bv, bank_g=bg, write_bank=torch.tensor([1, 1]),
                               pending_len=acc, read_bank=torch.tensor([0, 0]))
    torch.testing.assert_close(o_fused, o_sep, atol=ATOL, rtol=1e-4)
    torch.testing.assert_close(s_fused, s_sep, atol=ATOL, rtol=1e-4)  # committed S_0 written once
    torch.testing.assert_close(bv[:, 1, :3], bv2[:, 1, :3], atol=ATOL, rtol=1e-4)


def test_bf16_inputs_fp32_state():
    q, k, v, g, beta, cu, init = _inputs([6], dtype=torch.bfloat16)
    scale = 16 ** -0.5
    o_r, f_r = recurrent_gated_delta_rule_ref(q.float(), k.float(), v.float(), g, beta, scale, cu, init)
    st = init.clone()
    o = chain_verify_ref(q, k, v, g, beta, scale=scale, state=st, slots=torch.tensor([0]), cu_seqlens=cu,
                         write_final_state=True)
    assert o.dtype == torch.float32 and st.dtype == torch.float32
    torch.testing.assert_close(o, o_r, atol=ATOL, rtol=1e-4)


def test_conv_prefill_verify_and_commit_every_prefix():
    """Conv windows: prefill == window over history; conv_commit(A) == last W-1 of history ++ x[:A]."""
    W, C = 4, 8
    g = torch.Generator().manual_seed(9)
    w = torch.randn(C, W, generator=g)
    x = torch.randn(20, C, generator=g)
    conv = torch.zeros(2, W - 1, C)
    y_full = causal_conv1d_prefill_ref(x, w, torch.tensor([0, 20]), conv, torch.tensor([1]), torch.tensor([False]))
    # split: prefill 15, then a verify window of 5 with factors
    conv2 = torch.zeros(2, W - 1, C)
    y_a = causal_conv1d_prefill_ref(x[:15], w, torch.tensor([0, 15]), conv2, torch.tensor([1]), torch.tensor([False]))
    bank_x = torch.full((2, 2, 5, C), float("nan"))
    committed = conv2.clone()
    y_b = conv_verify_ref(x[15:], w, torch.tensor([0, 5]), conv2, torch.tensor([1]), bank_x=bank_x,
                          write_bank=torch.tensor([1]))
    torch.testing.assert_close(torch.cat([y_a, y_b]), y_full, atol=1e-6, rtol=1e-5)
    assert torch.equal(conv2, committed), "verify must not write the conv window"
    for A in range(0, 6):
        c = conv2.clone()
        conv_commit_ref(c, torch.tensor([1]), bank_x, torch.tensor([1]), torch.tensor([A]))
        torch.testing.assert_close(c[1], x[:15 + A][-(W - 1):])
    # deferred conv commit inside the next verify
    c = conv2.clone()
    y_next = conv_verify_ref(x[17:19], w, torch.tensor([0, 2]), c, torch.tensor([1]), bank_x=bank_x,
                             write_bank=torch.tensor([0]), pending_len=torch.tensor([2]), read_bank=torch.tensor([1]))
    torch.testing.assert_close(y_next, y_full[17:19], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(c[1], x[:17][-(W - 1):])


@pytest.mark.parametrize("mode", ["write", "out_slots", "read"])
def test_conv_chain_step_dispatcher_and_reference(mode):
    """``chain_verify.conv_chain_step`` (the two-launch form every backend runs: conv_verify, then chain_verify
    on the conv output's q | k | v slices; the C++ CPU op when built) and ``conv_chain_step_ref`` against a
    direct oracle written here: a 4-tap causal conv + SiLU over (window ++ x), then the per-token recurrence,
    per row and head group. ``out_slots``: the state and window after the token land there, the read slots
    keep theirs; ``read``: nothing is written. Untouched slots keep their random contents. fp32, ATOL."""
    from vllm_specla.ops.chain_verify import conv_chain_step  # noqa: PLC0415
    from vllm_specla.ops.reference import conv_chain_step_ref  # noqa: PLC0415

    H, HV, K, V, R, S = 2, 4, 16, 24, 3, 8
    C = 2 * H * K + HV * V
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(R, C + 8, generator=gen)[:, :C]  # a column slice, as the runtime passes it
    w = torch.randn(C, 4, generator=gen) * 0.5
    win = torch.randn(S, 3, C, generator=gen)
    g = -torch.rand(R, HV, generator=gen) * 0.5 - 0.01
    beta = torch.rand(R, HV, generator=gen)
    st = torch.randn(S, HV, V, K, generator=gen) * 0.2
    slots = torch.tensor([5, 0, 3])
    outs = torch.tensor([1, 7, 2]) if mode == "out_slots" else None
    write = mode != "read"
    scale = K ** -0.5
    # oracle
    dst = outs if outs is not None else slots
    o_want = torch.empty(R, HV, V)
    st_want, win_want = st.clone(), win.clone()
    for r in range(R):
        hist = torch.cat([win[slots[r]], x[r : r + 1]], 0)  # [4, C]
        y = torch.nn.functional.silu((hist * w.t()).sum(0))
        q = l2norm(y[: H * K].view(H, K)) * scale
        k = l2norm(y[H * K : 2 * H * K].view(H, K))
        v = y[2 * H * K :].view(HV, V)
        for hv in range(HV):
            hh = hv // (HV // H)
            M = st[slots[r], hv]  # [V, K]
            eg = torch.exp(g[r, hv])
            vt = beta[r, hv] * (v[hv] - eg * (M @ k[hh]))
            Mn = eg * M + vt[:, None] * k[hh][None, :]
            o_want[r, hv] = Mn @ q[hh]
            if write:
                st_want[dst[r], hv] = Mn
        if write:
            win_want[dst[r]] = hist[1:]
    kw = dict(scale=scale, write=write, **(dict(out_slots=outs) if outs is not None else {}))
    for fn, extra in ((conv_chain_step, dict(cu_seqlens=torch.arange(R + 1))), (conv_chain_step_ref, {})):
        s2, w2 = st.clone(), win.clone()
        o = fn(x, w, w2, g, beta, state=s2, slots=slots, **kw, **extra)
        assert torch.allclose(o, o_want, atol=ATOL), fn.__name__
        assert torch.allclose(s2, st_want, atol=ATOL), fn.__name__
        assert torch.equal(w2, win_want), fn.__name__
    with pytest.raises(ValueError, match="channels"):
        conv_chain_step(x[:, 1:], w[1:], win[..., 1:], g, beta, scale=scale, state=st, slots=slots,
                        cu_seqlens=torch.arange(R + 1))
    with pytest.raises(ValueError, match="out_slots needs write"):
        conv_chain_step_ref(x, w, win, g, beta, scale=scale, state=st, slots=slots, write=False,
                            out_slots=torch.tensor([1, 7, 2]))


@pytest.mark.parametrize("change,message", [
    ({"slots": torch.tensor([-1, 1])}, r"slots must be in \[0, 3\], got -1"),  # a padding slot: would hit slot 3
    ({"slots": torch.tensor([0, 4])}, r"slots must be in \[0, 3\], got 4"),
    ({"slots": torch.tensor([0])}, r"slots must have an entry for each of the 2 rows, got 1"),
    ({"cu_seqlens": torch.tensor([0, 6, 3])}, r"cu_seqlens must be non-decreasing within \[0, 6\], got \[0, 6, 3\]"),
    ({"cu_seqlens": torch.tensor([0, 3, 7])}, r"cu_seqlens must be non-decreasing within \[0, 6\]"),
    ({"write_bank": torch.tensor([0, 2])}, r"write_bank must be in \[0, 1\], got 2"),
    ({"pending_len": torch.tensor([1, 0])}, r"pending_len > 0 needs read_bank"),
    ({"pending_len": torch.tensor([0, 2]), "read_bank": torch.tensor([0, 0]), "bank_k": None, "bank_v": None,
      "bank_g": None, "write_bank": None}, r"pending_len > 0 needs read_bank and the factor banks"),
    ({"pending_len": torch.tensor([1, 0]), "read_bank": torch.tensor([-1, 0])}, r"read_bank must be in \[0, 1\]"),
])
def test_chain_and_conv_verify_refs_refuse_what_the_cpp_op_refuses(change, message):
    """The references index with Python ints, so a padding slot -1, a bank index 2 or a descending cu_seqlens used
    to read or write some other slot's state quietly; they now raise ValueError naming the argument, as the C++ op
    (csrc/cpu/gdn_verify.cpp) does -- and leave every state, conv window and bank untouched. (Pending counts above
    the bank clamp to it, as the Triton kernels' tests expect: tests/test_kernels_gpu.py.)"""
    q, k, v, g, beta, cu, _ = _inputs([3, 3], seed=11)
    H, HV, Kd, V = 2, 4, 16, 24
    state = torch.randn(4, HV, V, Kd)
    bk, bv, bg = (torch.randn_like(b) for b in _banks(4, 3, H, HV, Kd, V)[:3])
    kw = dict(scale=0.25, state=state, slots=torch.tensor([2, 1]), cu_seqlens=cu, bank_k=bk, bank_v=bv, bank_g=bg,
              write_bank=torch.tensor([0, 1]))
    kw.update(change)
    before = [t.clone() for t in (state, bk, bv, bg)]
    with pytest.raises(ValueError, match=message):
        chain_verify_ref(q, k, v, g, beta, **kw)
    assert all(torch.equal(a, b) for a, b in zip(before, (state, bk, bv, bg)))
    # the conv verify reference takes the same per-row arguments
    C, W = 8, 4
    x = torch.randn(6, C)
    conv = torch.randn(4, W - 1, C)
    bank_x = torch.randn(4, 2, 3, C)
    ckw = {n: kw[n] for n in ("slots", "cu_seqlens", "write_bank")}
    ckw.update({n: kw[n] for n in ("pending_len", "read_bank") if n in kw})
    before = (conv.clone(), bank_x.clone())
    with pytest.raises(ValueError, match=message):
        conv_verify_ref(x, torch.randn(C, W), conv_state=conv, bank_x=bank_x if kw["bank_k"] is not None else None,
                        **ckw)
    assert torch.equal(conv, before[0]) and torch.equal(bank_x, before[1])


@pytest.mark.parametrize("args,message", [
    ((torch.tensor([-1]), torch.tensor([0]), torch.tensor([2])), r"slots must be in \[0, 3\], got -1"),
    ((torch.tensor([1]), torch.tensor([2]), torch.tensor([2])), r"bank_idx must be in \[0, 1\], got 2"),
    ((torch.tensor([1, 2]), torch.tensor([0]), torch.tensor([2])),
     r"bank_idx must have an entry for each of the 2 rows"),
])
def test_recover_and_conv_commit_refs_refuse_bad_rows(args, message):
    """DeltaConstruct's and the conv commit's references check slots and bank indices as csrc/cpu/commit_conv.cpp
    does, before touching any state (on the rows that accept something: the others are skipped unread, as in the
    C++ and Triton kernels)."""
    H, HV, Kd, V = 2, 4, 16, 24
    state = torch.randn(4, HV, V, Kd)
    bk, bv, bg = (torch.randn_like(b) for b in _banks(4, 3, H, HV, Kd, V)[:3])
    before = state.clone()
    with pytest.raises(ValueError, match=message):
        recover_ref(state, *args[:1], bk, bv, bg, *args[1:])
    assert torch.equal(state, before)
    conv, bank_x = torch.randn(4, 3, 8), torch.randn(4, 2, 3, 8)
    before = conv.clone()
    with pytest.raises(ValueError, match=message):
        conv_commit_ref(conv, args[0], bank_x, *args[1:])
    assert torch.equal(conv, before)


def test_pending_counts_clamp_and_accepted_counts_above_the_bank_are_refused():
    """Pending counts outside ``[0, Tmax]`` are clamped (the Triton kernels' contract, which their GPU tests compare
    with these references): ``Tmax + 4`` acts as ``Tmax``, ``-1`` as 0. An accepted count above ``Tmax`` given to a
    commit (recover / conv commit) is a ValueError naming it, as in the C++ ops (it used to be truncated quietly),
    before any state is touched; a count of 0 or less is a no-op."""
    q, k, v, g, beta, cu, _ = _inputs([3, 3], seed=12)
    H, HV, Kd, V = 2, 4, 16, 24
    state = torch.randn(4, HV, V, Kd)
    bk, bv, bg = (torch.randn_like(b) for b in _banks(4, 3, H, HV, Kd, V)[:3])
    kw = dict(scale=0.25, slots=torch.tensor([2, 1]), cu_seqlens=cu, bank_k=bk, bank_v=bv, bank_g=bg,
              read_bank=torch.tensor([1, 0]))
    s1, s2 = state.clone(), state.clone()
    o1 = chain_verify_ref(q, k, v, g, beta, state=s1, pending_len=torch.tensor([7, -1]), **kw)
    o2 = chain_verify_ref(q, k, v, g, beta, state=s2, pending_len=torch.tensor([3, 0]), **kw)
    assert torch.equal(o1, o2) and torch.equal(s1, s2) and not torch.equal(s1[2], state[2])
    s1 = state.clone()
    with pytest.raises(ValueError, match=r"num_accepted 4 exceeds the factor bank \(Tmax=3\)"):
        recover_ref(s1, torch.tensor([2, 1]), bk, bv, bg, torch.tensor([0, 1]), torch.tensor([1, 4]))
    assert torch.equal(s1, state)
    conv, bank_x = torch.randn(4, 3, 8), torch.randn(4, 2, 3, 8)
    c1 = conv.clone()
    with pytest.raises(ValueError, match=r"num_accepted 4 exceeds the factor bank \(Tmax=3\)"):
        conv_commit_ref(c1, torch.tensor([2, 1]), bank_x, torch.tensor([0, 1]), torch.tensor([1, 4]))
    assert torch.equal(c1, conv)
    recover_ref(s1, torch.tensor([2, 1]), bk, bv, bg, torch.tensor([0, 1]), torch.tensor([3, -2]))
    assert not torch.equal(s1[2], state[2]) and torch.equal(s1[1], state[1])
