"""The vLLM-free decode runtime (``runtime/decode.py``, ``runtime/fused_model.py``) on CPU, fp32.

The same code runs on the H200 under CUDA graphs (``benchmarks/bench_e2e.py``); here it runs eagerly
with the reference / C++ ops: AR, SpecLA and the per-token-snapshot baseline must emit the same
greedy tokens, the fused weight packing must equal the reference model, padding tokens of the
drafter's absorb window must leave the state untouched, and the acceptance-controlled drafter must
produce the requested acceptance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_specla.core.policy import chain_tau
from vllm_specla.core.state import allocate_layer_states
from vllm_specla.runtime.decode import DecodeRuntime
from vllm_specla.runtime.fused_model import FusedEagle, FusedTarget, StepCtrl


@pytest.fixture(scope="module")
def models():
    from vllm_specla.models.drafter import load_eagle_drafter
    from vllm_specla.models.gdn import load_fla_checkpoint

    return load_fla_checkpoint("models/specla-gdn-tiny/target"), load_eagle_drafter("models/specla-gdn-tiny/drafter")


@pytest.fixture(scope="module")
def pair(models):
    tm, dm = models
    tgt = FusedTarget(tm, torch.float32, "cpu")
    return tm, tgt, FusedEagle(dm, tgt, torch.float32, "cpu")


def _prompts(B, P, seed):
    return torch.randint(3, 8000, (B, P), generator=torch.Generator().manual_seed(seed))


def test_fused_target_equals_reference_model(pair):
    tm, tgt, _ = pair
    prompts = _prompts(2, 12, 0)
    states = allocate_layer_states(tm.config, 2, 0)
    h = tgt.hidden(prompts, states, "ar", StepCtrl.uniform(2, 12, "cpu"))
    with torch.no_grad():
        ref = tm.hidden_sequence(prompts).reshape(24, -1)
    assert float((h - ref).norm() / ref.norm()) < 1e-5


def test_commit_mode_padding_leaves_state_unchanged(pair):
    """Drafter absorb: a row of T tokens with valid_len = v ends in the state of its first v tokens."""
    tm, tgt, _ = pair
    B, T = 3, 5
    toks = _prompts(B, T, 1)
    valid = torch.tensor([1, 3, 5])
    s_commit = allocate_layer_states(tm.config, B, T)
    c = StepCtrl.uniform(B, T, "cpu")
    c.valid_len.copy_(valid)
    h_commit = tgt.hidden(toks, s_commit, "commit", c).view(B, T, -1)
    for r in range(B):
        v = int(valid[r])
        s_ar = allocate_layer_states(tm.config, 1, 0)
        h_ar = tgt.hidden(toks[r : r + 1, :v], s_ar, "ar", StepCtrl.uniform(1, v, "cpu"))
        assert torch.allclose(h_commit[r, :v], h_ar, atol=1e-5, rtol=1e-5)
        for a, b in zip(s_commit, s_ar):
            assert torch.allclose(a.ssm[r], b.ssm[0], atol=1e-6, rtol=1e-5)
            assert torch.allclose(a.conv[r], b.conv[0], atol=1e-5, rtol=1e-5)


def test_ar_read_mode_outputs_ar_features_and_writes_nothing(pair):
    """The last draft step (``"ar_read"``): the features of an ``"ar"`` step from the same state,
    with every state and conv window left exactly as it was."""
    tm, tgt, _ = pair
    B = 3
    states = allocate_layer_states(tm.config, B, 0)
    tgt.hidden(_prompts(B, 6, 2), states, "ar", StepCtrl.uniform(B, 6, "cpu"))  # a non-zero state
    before = [(st.ssm.clone(), st.conv.clone()) for st in states]
    tok = _prompts(B, 1, 3)
    h_read = tgt.hidden(tok, states, "ar_read", StepCtrl.uniform(B, 1, "cpu"))
    for st, (ssm, conv) in zip(states, before):
        assert torch.equal(st.ssm, ssm) and torch.equal(st.conv, conv)
    h_ar = tgt.hidden(tok, states, "ar", StepCtrl.uniform(B, 1, "cpu"))
    assert torch.allclose(h_read, h_ar, atol=1e-6, rtol=1e-5)
    assert not all(torch.equal(st.ssm, ssm) for st, (ssm, _) in zip(states, before))  # "ar" does write


@pytest.mark.parametrize("K", [1, 3])
def test_modes_emit_identical_greedy_tokens(pair, K):
    _, tgt, dr = pair
    B = 3
    prompts = _prompts(B, 8, 3)
    outs, taus = {}, {}
    for mode, steps in (("ar", 24), ("specla", 10), ("snapshot", 10)):
        rt = DecodeRuntime(tgt, B, mode, K, dr, output_capacity=40)
        rt.prefill(prompts)
        r = rt.run(steps)
        outs[mode], taus[mode] = rt.outputs(), r.mean_acceptance_length
        assert r.tokens == sum(len(o) for o in outs[mode]) - B  # prefill emitted one per row
    for mode in ("specla", "snapshot"):
        for a, b in zip(outs["ar"], outs[mode]):
            n = min(len(a), len(b))
            assert n >= 11 and a[:n] == b[:n]
    assert taus["specla"] == taus["snapshot"] > 1.0  # same drafts, same acceptance
    if K == 3:
        sb = DecodeRuntime(tgt, B, "snapshot", K, dr).state_bytes_per_request()
        ss = DecodeRuntime(tgt, B, "specla", K, dr).state_bytes_per_request()
        ar = DecodeRuntime(tgt, B, "ar").state_bytes_per_request()
        assert ss["state"] == ar["state"] and ss["factors"] < ar["state"]
        assert sb["snapshots"] > (K + 1) * 0.9 * ar["state"]


def test_acceptance_controlled_drafter(pair):
    _, tgt, dr = pair
    B, K, alpha = 8, 4, 0.5
    prompts = _prompts(B, 6, 4)
    ar = DecodeRuntime(tgt, B, "ar", output_capacity=130)
    ar.prefill(prompts)
    ar.run(120)
    trace = torch.tensor([o[:121] for o in ar.outputs()])
    torch.manual_seed(0)
    rt = DecodeRuntime(tgt, B, "specla", K, dr, output_capacity=130, alpha=alpha, trace=trace)
    rt.prefill(prompts)
    r = rt.run(20)
    expect = (1 - alpha ** (K + 1)) / (1 - alpha)  # ALGORITHMS.md §9b
    assert abs(r.mean_acceptance_length - expect) < 0.3, (r.mean_acceptance_length, expect)
    for o, t in zip(rt.outputs(), trace.tolist()):
        assert o == t[: len(o)]  # still lossless: the target decides every token
    with pytest.raises(ValueError, match="alpha"):
        DecodeRuntime(tgt, B, "specla", K, dr, alpha=0.5)


def test_bad_arguments(pair):
    _, tgt, dr = pair
    with pytest.raises(ValueError, match="mode"):
        DecodeRuntime(tgt, 1, "tree")
    with pytest.raises(ValueError, match="drafter"):
        DecodeRuntime(tgt, 1, "specla", 4)
    for b in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match=rf"batch_size={b!r}: must be an int >= 1"):
            DecodeRuntime(tgt, b, "ar")
    with pytest.raises(ValueError, match=r"output_capacity=-5: must be an int >= 0"):
        DecodeRuntime(tgt, 1, "ar", output_capacity=-5)
    for k in (4.5, True):
        with pytest.raises(ValueError, match=rf"num_speculative_tokens={k!r}: must be an int >= 1"):
            DecodeRuntime(tgt, 1, "specla", k, dr)
    with pytest.raises(ValueError, match=r"tree_width=2.0: must be an int >= 1"):
        DecodeRuntime(tgt, 1, "specla", 2, dr, tree_width=2.0)


def test_ragged_prompts_prefill_per_request(pair):
    """A list of prompts of different lengths = each request prefilled on its own slot."""
    _, tgt, dr = pair
    prompts = [list(range(5, 5 + n)) for n in (3, 9, 5)]
    outs = {}
    for mode in ("ar", "specla"):
        rt = DecodeRuntime(tgt, 3, mode, 2, dr, output_capacity=30)
        rt.prefill(prompts)
        rt.run(12 if mode == "ar" else 6)
        outs[mode] = rt.outputs()
    solo = []
    for p in prompts:
        rt = DecodeRuntime(tgt, 1, "ar", output_capacity=30)
        rt.prefill(torch.tensor([p]))
        rt.run(12)
        solo.append(rt.outputs()[0])
    for a, b, c in zip(outs["ar"], outs["specla"], solo):
        n = min(len(a), len(b))
        assert a == c and a[:n] == b[:n] and n >= 7


def test_fused_eagle_equals_reference_drafter(models, pair):
    tm, dm = models
    _, tgt, dr = pair
    B, T = 2, 6
    toks = _prompts(B, T, 7)
    with torch.no_grad():
        feats = tm.hidden_sequence(_prompts(B, T, 8))
        ref = dm.forward_sequence(toks, feats, tm.model.embeddings).reshape(B * T, -1)
    from vllm_specla.runtime.decode import drafter_config

    st = allocate_layer_states(drafter_config(dr), B, 0)
    got = dr.hidden(toks, feats.reshape(B * T, -1), st, "ar", StepCtrl.uniform(B, T, "cpu"))
    assert float((got - ref).norm() / ref.norm()) < 1e-5


def test_each_gemm_names_the_next_gemms_weight(models, pair, monkeypatch):
    """``fused.linear(prefetch=)`` (the skinny GEMM's L2 prefetch) gets the weight of the GEMM that runs
    next: in-projection -> o -> gate/up -> down -> the next layer's in-projection, the last block's
    down-projection the LM head (the draft head with a draft vocabulary), the drafter's fc its first
    in-projection. Recorded on the CPU through ``fused.linear`` (every GEMM of the step calls it)."""
    from vllm_specla.ops import fused
    from vllm_specla.runtime.decode import drafter_config

    tm, _ = models
    _, tgt, dr = pair
    seen = []
    real = fused.linear

    def rec(x, w, *a, prefetch=None, **kw):
        seen.append((w, prefetch))
        return real(x, w, *a, prefetch=prefetch, **kw)

    monkeypatch.setattr(fused, "linear", rec)

    def chain(stack):
        return [w for L in stack.layers for w in (L.w_in, L.w_o, L.w_gu, L.w_down)]

    toks = _prompts(2, 3, 9)
    tgt.hidden(toks, allocate_layer_states(tm.config, 2, 0), "ar", StepCtrl.uniform(2, 3, "cpu"))
    ws = chain(tgt.stack)
    assert len(seen) == len(ws) and len(ws) >= 8
    assert all(a is w and p is n for (a, p), w, n in zip(seen, ws, ws[1:] + [tgt.lm_head]))
    vocab = torch.arange(0, 4000, 2)
    for d, head in ((dr, tgt.lm_head), (dr.with_draft_vocab(vocab), None)):
        seen.clear()
        f = torch.randn(6, tm.config.hidden_size)
        d.hidden(toks, f, allocate_layer_states(drafter_config(d), 2, 0), "ar", StepCtrl.uniform(2, 3, "cpu"))
        ws = [d.fc] + chain(d.stack)
        tail = head if head is not None else d.head.weight
        assert all(a is w and p is n for (a, p), w, n in zip(seen, ws, ws[1:] + [tail]))
        assert len(seen) == len(ws)


@pytest.mark.parametrize("rows_per_chunk", [1, 2])
def test_snapshot_prefill_in_row_chunks(pair, monkeypatch, rows_per_chunk):
    """A snapshot-mode prefill runs its temporary plain state in chunks of rows (``SNAPSHOT_PREFILL_BYTES``, so that
    it fits beside the snapshots at large batch): 3 rows in chunks of 1 or of 2 + 1 give the state, snapshot 0 and
    outputs of the one-chunk prefill, bit for bit."""
    import vllm_specla.runtime.decode as decode

    _, tgt, dr = pair
    B, K = 3, 2
    prompts = _prompts(B, 8, 5)
    whole = DecodeRuntime(tgt, B, "snapshot", K, dr, output_capacity=30)
    whole.prefill(prompts)
    ref_state = [(st.conv.clone(), sn[:, 0].clone()) for st, sn in zip(whole.states, whole.snaps)]
    whole.run(6)
    rt = DecodeRuntime(tgt, B, "snapshot", K, dr, output_capacity=30)
    per_row = sum(st.conv[0].numel() * st.conv.element_size() + sn[0, 0].numel() * sn.element_size()
                  for st, sn in zip(rt.states, rt.snaps))
    monkeypatch.setattr(decode, "SNAPSHOT_PREFILL_BYTES", rows_per_chunk * per_row + per_row // 2)
    calls = []
    real = decode.allocate_layer_states
    monkeypatch.setattr(decode, "allocate_layer_states", lambda *a, **kw: calls.append(a[1]) or real(*a, **kw))
    rt.prefill(prompts)
    assert calls == ([1, 1, 1] if rows_per_chunk == 1 else [2, 1])
    for (conv, snap0), st, sn in zip(ref_state, rt.states, rt.snaps):
        assert torch.equal(st.conv, conv) and torch.equal(sn[:, 0], snap0)
    rt.run(6)
    assert rt.outputs() == whole.outputs()


def test_snapshot_mode_ragged_prompts_and_set_alpha(pair):
    _, tgt, dr = pair
    prompts = [list(range(9, 9 + n)) for n in (2, 7)]
    ar = DecodeRuntime(tgt, 2, "ar", output_capacity=40)
    ar.prefill(prompts)
    ar.run(30)
    trace = torch.tensor([o[:31] for o in ar.outputs()])
    rt = DecodeRuntime(tgt, 2, "snapshot", 3, dr, output_capacity=40, alpha=0.0, trace=trace)
    rt.prefill(prompts)
    r0 = rt.run(4)
    assert r0.mean_acceptance_length == 1.0  # alpha 0: every draft replaced by a wrong token
    rt.set_alpha(1.0)
    rt.prefill(prompts)
    r1 = rt.run(4)
    assert r1.mean_acceptance_length == 4.0  # alpha 1: every draft is the target's token
    for o, t in zip(rt.outputs(), trace.tolist()):
        assert o == t[: len(o)]
    with pytest.raises(ValueError, match="alpha"):
        rt.set_alpha(1.5)


def test_runtime_input_validation(pair):
    _, tgt, dr = pair
    rt = DecodeRuntime(tgt, 2, "specla", 2, dr)
    with pytest.raises(RuntimeError, match="prefill"):
        rt.step()
    with pytest.raises(ValueError, match="batch_size=2"):
        rt.prefill(torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids"):
        rt.prefill(torch.full((2, 4), tgt.config.vocab_size))
    with pytest.raises(ValueError, match="non-empty"):
        rt.prefill([[1, 2], []])
    with pytest.raises(ValueError, match="integer"):
        rt.prefill(torch.zeros(2, 4))
    rt.prefill([[5, 6], [7]])
    with pytest.raises(ValueError, match="steps"):
        rt.run(0)
    with pytest.raises(ValueError, match=r"run: steps must be an int >= 1, got 2.0"):  # (was range's TypeError)
        rt.run(2.0)
    with pytest.raises(ValueError, match="trace"):
        DecodeRuntime(tgt, 2, "specla", 2, dr, alpha=0.5, trace=torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="specla"):
        DecodeRuntime(tgt, 2, "ar", alpha=0.5, trace=torch.zeros(2, 5, dtype=torch.long))
    # (a string alpha was a TypeError in the comparison, a list trace an AttributeError on .dim())
    with pytest.raises(ValueError, match=r"alpha='0.5': must be a number in \[0, 1\]"):
        DecodeRuntime(tgt, 2, "specla", 2, dr, alpha="0.5", trace=torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"trace: must be a \[batch_size=2, L\] int64 tensor, got list"):
        DecodeRuntime(tgt, 2, "specla", 2, dr, alpha=0.5, trace=[[1, 2], [3, 4]])
    ok = DecodeRuntime(tgt, 2, "specla", 2, dr, alpha=np.float64(0.5), trace=torch.zeros(2, 5, dtype=torch.long))
    for bad in ("1", None, 1.5):
        with pytest.raises(ValueError, match=rf"set_alpha needs .* got {bad!r}"):
            ok.set_alpha(bad)
    ok.set_alpha(np.float32(0.25))
    assert ok.alpha == 0.25
    ok.set_alpha(torch.tensor(0.75))  # (a 0-d tensor, e.g. from torch.linspace)
    assert ok.alpha == 0.75 and float(ok.alpha_t) == 0.75
    ok.prefill([[5, 6], [7]])
    assert ok.run(torch.tensor(2)).steps == 2


def test_greedy_accept_branches_is_longest_branch_and_agrees_with_core_rule():
    from vllm_specla.core.acceptance import greedy_accept_tree
    from vllm_specla.runtime.decode import greedy_accept_branches

    g = torch.Generator().manual_seed(9)
    B, W, K = 200, 3, 3
    T = 1 + W * K
    window = torch.randint(0, 3, (B, T), generator=g)
    parents = [-1] + [0 if i == 0 else 1 + j * K + i - 1 for j in range(W) for i in range(K)]
    # a target's greedy token is a function of the node's context (its token path), so siblings
    # carrying the same token see the same argmax, as in a real model
    salt = torch.randint(0, 1000, (B,), generator=g)
    am = torch.empty_like(window)
    for b in range(B):
        for t in range(T):
            ctx, u = [], t
            while u >= 0:
                ctx.append(int(window[b, u]))
                u = parents[u]
            am[b, t] = hash((int(salt[b]), tuple(ctx))) % 3
    a, path = greedy_accept_branches(window, am, W, K)
    for b in range(B):
        best = 0
        for j in range(W):  # brute force: matched prefix of branch j
            m, prev = 0, 0
            while m < K and int(window[b, 1 + j * K + m]) == int(am[b, prev]):
                prev = 1 + j * K + m
                m += 1
            best = max(best, m)
        assert int(a[b]) == best
        mine = [int(am[b, p]) for p in path[b, : int(a[b]) + 1]]
        _, core = greedy_accept_tree(parents, window[b].tolist(), am[b].tolist())
        n = min(len(mine), len(core))
        assert mine[:n] == core[:n] and len(mine) >= len(core)  # same greedy continuation, never shorter
    assert a.max() >= 2 and a.min() == 0


@pytest.mark.parametrize("W,K", [(2, 2), (3, 3)])
def test_tree_mode_emits_ar_tokens(pair, W, K):
    _, tgt, dr = pair
    B = 3
    prompts = _prompts(B, 7, 11)
    ar = DecodeRuntime(tgt, B, "ar", output_capacity=40)
    ar.prefill(prompts)
    ar.run(30)
    rt = DecodeRuntime(tgt, B, "specla", K, dr, output_capacity=40, tree_width=W)
    rt.prefill(prompts)
    r = rt.run(8)
    assert r.mean_acceptance_length > 1.0
    for a, b in zip(ar.outputs(), rt.outputs()):
        n = min(len(a), len(b))
        assert n >= 9 and a[:n] == b[:n]
    assert rt.state_bytes_per_request()["factors"] > 0
    with pytest.raises(ValueError, match="tree_width"):
        DecodeRuntime(tgt, B, "snapshot", K, dr, tree_width=2)


@pytest.mark.parametrize("model", ["siblings", "iid"])
def test_tree_mode_controlled_acceptance(pair, model):
    """W branches under acceptance control: the mean acceptance length matches
    ``controlled_tree_tau`` (siblings: 2.31, iid: 2.45 here; 16 rows x 40 steps, the standard
    error ~0.03), every run is lossless, and with ``"siblings"`` at most one first-level token of a
    tree matches the target (distinct siblings, as a real top-W)."""
    from vllm_specla.runtime.decode import controlled_tree_tau

    _, tgt, dr = pair
    B, W, K, alpha = 16, 3, 2, 0.5
    prompts = _prompts(B, 6, 12)
    ar = DecodeRuntime(tgt, B, "ar", output_capacity=140)
    ar.prefill(prompts)
    ar.run(130)
    trace = torch.tensor([o[:131] for o in ar.outputs()])
    torch.manual_seed(1)
    rt = DecodeRuntime(tgt, B, "specla", K, dr, output_capacity=140, alpha=alpha, trace=trace, tree_width=W,
                       tree_alpha_model=model)
    rt.prefill(prompts)
    most = 0
    for _ in range(40):
        rt.step()
        level1 = rt.window[:, 1:].view(B, W, K)[:, :, 0]
        most = max(most, int((level1 == trace.gather(1, rt.n[:, None].clamp(max=130))).sum(1).max()))
    tau = 1 + float(rt.acc_sum) / (40 * B)
    expect = controlled_tree_tau(alpha, K, W, model)
    assert abs(tau - expect) < 0.1, (tau, expect)
    assert most == 1 if model == "siblings" else most >= 2
    for o, t in zip(rt.outputs(), trace.tolist()):
        assert o == t[: len(o)]
    assert abs(controlled_tree_tau(0.8, 6, 1) - chain_tau(0.8, 6)) < 1e-12
    assert abs(controlled_tree_tau(0.8, 6, 1, "iid") - chain_tau(0.8, 6)) < 1e-12


def test_fused_target_padded_in_projection():
    """A shape whose packed in-projection (q, k, v, gate, a, b: 388 rows here, 9228 for flame) is
    not a multiple of 8: ``_Layer`` pads it with zero rows, and every consumer of the projection
    output reads only the real columns (AR and verify windows equal the reference model)."""
    from vllm_specla.models.config import GatedDeltaNetConfig
    from vllm_specla.models.gdn import GatedDeltaNetForCausalLM

    cfg = GatedDeltaNetConfig(hidden_size=128, num_hidden_layers=2, num_heads=2, head_dim=32, expand_v=2.0,
                              intermediate_size=256, vocab_size=512, conv_size=4, use_gate=True,
                              use_short_conv=True, norm_eps=1e-6, tie_word_embeddings=False)
    torch.manual_seed(0)
    tm = GatedDeltaNetForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, w in tm.named_parameters():
            if name.endswith("A_log"):
                w.uniform_(1, 16).log_()
            elif name.endswith("dt_bias"):
                w.uniform_(-6, -3)
            elif "norm" in name:
                w.fill_(1.0)
            else:
                w.normal_(0, 0.1 if "conv1d" not in name else 0.5)
    tgt = FusedTarget(tm, torch.float32, "cpu")
    L = tgt.stack.layers[0]
    d = L.dims
    real = 2 * d.key_dim + d.value_dim + L.G + 2 * d.HV
    assert real % 8 and L.w_in.shape[0] == real + (-real % 8)
    assert torch.count_nonzero(L.w_in[real:]) == 0
    prompts = torch.randint(3, cfg.vocab_size, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = tm.hidden_sequence(prompts).reshape(14, -1)
    h = tgt.hidden(prompts, allocate_layer_states(cfg, 2, 0), "ar", StepCtrl.uniform(2, 7, "cpu"))
    assert float((h - ref).norm() / ref.norm()) < 1e-5
    # verify window of 3 after an AR prefix of 4, no pending: the same hidden states
    st = allocate_layer_states(cfg, 2, 3)
    tgt.hidden(prompts[:, :4], st, "ar", StepCtrl.uniform(2, 4, "cpu"))
    hv = tgt.hidden(prompts[:, 4:], st, "verify", StepCtrl.uniform(2, 3, "cpu")).view(2, 3, -1)
    assert float((hv - ref.view(2, 7, -1)[:, 4:]).norm() / ref.view(2, 7, -1)[:, 4:].norm()) < 1e-5


@pytest.mark.parametrize("mode,alpha", [("specla", None), ("specla", 0.5), ("snapshot", 0.5)])
def test_chain_drafting_equals_the_general_form(pair, mode, alpha):
    """``_speculate_chain`` (each draft's argmax stored into the window, or into ``drafts`` under
    acceptance control, then ``step_kernels.control_drafts``; the drafter's final norm applied with
    its LM head, ``FusedEagle.draft_from_hidden``) drafts what the general ``_speculate`` drafts at
    W = 1, from the same committed drafter state, feature and random stream; a draft vocabulary too
    (the argmax maps its ids)."""
    _, tgt, dr = pair
    B, K = 3, 4
    prompts = _prompts(B, 5, 9)
    trace = torch.randint(0, tgt.config.vocab_size, (B, 40), generator=torch.Generator().manual_seed(2))
    for d in (dr, dr.with_draft_vocab(torch.arange(0, 8000, 3))):
        kw = dict(alpha=alpha, trace=trace) if alpha is not None else {}
        rt = DecodeRuntime(tgt, B, mode, K, d, output_capacity=20, **kw)
        rt.prefill(prompts)
        h = torch.randn(B, tgt.config.hidden_size, generator=torch.Generator().manual_seed(4))
        torch.manual_seed(1)
        want = rt._speculate(d.norm(h)).clone()  # (the general form takes normed features)
        last = rt.window[:, 0].clone()
        torch.manual_seed(1)
        rt._speculate_chain(h)  # (the chain form: the drafter's un-normed output)
        assert torch.equal(rt.window[:, 1:], want) and torch.equal(rt.window[:, 0], last)


def test_drafter_dtype_must_match_the_target(pair):
    tm, tgt, _ = pair
    from vllm_specla.models.drafter import load_eagle_drafter

    with pytest.raises(ValueError, match="dtype must be the target's"):
        FusedEagle(load_eagle_drafter("models/specla-gdn-tiny/drafter"), tgt, torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match=r"dtype=torch.float64: must be torch.float32"):
        FusedEagle(load_eagle_drafter("models/specla-gdn-tiny/drafter"), tgt, torch.float64, "cpu")


@pytest.mark.parametrize("W", [1, 2])
def test_absorb_of_the_accepted_rows_drafts_as_the_full_absorb(pair, monkeypatch, W):
    """``ABSORB_ACCEPTED_ROWS`` (the drafter's absorb pass computes past its recurrence only each
    request's accepted row): the same drafts as absorbing every row of the window and gathering after
    (trained pair, fp32: equal output tokens, every window and the acceptance length of each step),
    chain and tree."""
    from vllm_specla.runtime import decode

    _, tgt, dr = pair
    B, K = 3, 3
    prompts = _prompts(B, 6, 12)
    runs = {}
    for on in (True, False):
        monkeypatch.setattr(decode, "ABSORB_ACCEPTED_ROWS", on)
        rt = DecodeRuntime(tgt, B, "specla", K, dr, output_capacity=60, tree_width=W)
        rt.prefill(prompts)
        windows = []
        for _ in range(8):
            rt.run(1)
            windows.append(rt.window.clone())
        runs[on] = (rt.outputs(), torch.stack(windows), rt.acc_log.clone())
    assert runs[True][0] == runs[False][0]
    assert torch.equal(runs[True][1], runs[False][1]) and torch.equal(runs[True][2], runs[False][2])
    assert int(runs[True][2].sum()) > 0


def test_prefill_refuses_bool_and_non_int_ids(pair):
    """Bool ids (a tensor or in lists) and float ids in lists are a ValueError naming ``prompts`` (they were used as
    masks / failed in torch indexing); a uint8 tensor is taken as ids (cast to int64), not as a mask."""
    _, tgt, _ = pair
    rt = DecodeRuntime(tgt, 2, "ar", 0, None, output_capacity=16)
    for bad in (torch.ones(2, 3, dtype=torch.bool), [[True, 5], [6]], [[1.5], [2]]):
        with pytest.raises(ValueError, match="prompts: "):
            rt.prefill(bad)
    ids = [[5, 6, 7], [9, 10, 11]]
    rt.prefill(torch.tensor(ids, dtype=torch.uint8))
    rt.run(4)
    a = rt.outputs()
    rt.prefill(torch.tensor(ids))
    rt.run(4)
    assert a == rt.outputs() and len(a[0]) == 5


def test_tree_width_of_another_type_is_a_value_error(pair):
    """``tree_width="2"`` is a ValueError naming it (the range comparison ran first: a TypeError)."""
    _, tgt, dr = pair
    with pytest.raises(ValueError, match=r"tree_width='2': must be an int >= 1"):
        DecodeRuntime(tgt, 1, "specla", 2, dr, tree_width="2")
