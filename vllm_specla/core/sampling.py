"""Lossless stochastic acceptance for chains and trees of deterministic drafts (ALGORITHMS.md §9).

Our drafters propose deterministic tokens (greedy chains, top-k trees), i.e. point-mass drafts.
The rules that keep the target distribution ``p`` exactly are:

* chain (point-mass draft ``d_i``): accept with probability ``p_{i-1}(d_i)``; on rejection sample
  from ``p_{i-1}`` with ``d_i`` removed, renormalised, and stop; after ``K`` accepts sample the
  bonus from ``p_K`` (the standard rule of arXiv 2211.17192 with ``q = one-hot(d)``);
* tree of deterministic candidates: at node ``u`` with residual ``r = p_u``, for each child ``c``
  in order accept with probability ``r(c) / sum(r)``; otherwise set ``r(c) = 0`` and continue; if
  all children are rejected sample from ``r`` and stop; at a leaf sample the bonus from ``p_leaf``
  (equivalently: sample ``y ~ p_u`` and descend if ``y`` is a child).

``p`` is the target distribution after the request's sampling transforms (temperature, top-k,
top-p) at each node. SpecInfer's ``min(1, r/q)`` rule is for i.i.d. *sampled* candidates and is
not lossless here; :func:`specinfer_tree_rule_wrong` keeps it only so tests can show it fails.
"""

from __future__ import annotations

import torch


def apply_sampling_transforms(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """``[..., V]`` logits -> probabilities after temperature, top-k and top-p (vLLM's order)."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0 for sampling (use greedy acceptance for 0)")
    x = logits.float() / temperature
    if top_k and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        srt, idx = torch.sort(x, dim=-1, descending=True)
        cum = torch.softmax(srt, -1).cumsum(-1)
        drop = cum - torch.softmax(srt, -1) > top_p
        srt = srt.masked_fill(drop, float("-inf"))
        x = torch.full_like(x, float("-inf")).scatter(-1, idx, srt)
    return torch.softmax(x, -1)


def _sample(p: torch.Tensor, gen: torch.Generator | None) -> int:
    return int(torch.multinomial(p / p.sum(), 1, generator=gen))


def accept_chain_pointmass(p: torch.Tensor, drafts: list[int], gen: torch.Generator | None = None) -> list[int]:
    """Stochastic acceptance of a point-mass draft chain.

    Args:
        p: ``[K+1, V]`` target probabilities at window nodes 0..K (node 0 = last committed token).
        drafts: ``K`` draft tokens.
    Returns:
        emitted tokens (accepted drafts, then one resampled/bonus token), length 1..K+1.
    """
    out = []
    for i, d in enumerate(drafts):
        if torch.rand((), generator=gen).item() < float(p[i, d]):
            out.append(d)
            continue
        r = p[i].clone()
        r[d] = 0.0
        out.append(_sample(r, gen))
        return out
    out.append(_sample(p[len(drafts)], gen))
    return out


def accept_tree_residual(
    parents: list[int], tokens: list[int], p: torch.Tensor, gen: torch.Generator | None = None
) -> tuple[list[int], list[int]]:
    """Stochastic acceptance of a tree of deterministic candidates (residual rule, lossless).

    Args:
        parents, tokens: the draft tree (node 0 = root). p: ``[n, V]`` target probabilities at
        every node.
    Returns:
        ``(path, emitted)`` as :func:`~vllm_specla.core.acceptance.greedy_accept_tree`.
    """
    children: dict[int, list[int]] = {}
    for c, par in enumerate(parents):
        if par >= 0:
            children.setdefault(par, []).append(c)
    node, path, out = 0, [0], []
    while True:
        r = p[node].clone()
        moved = False
        for c in children.get(node, []):
            tot = float(r.sum())
            if tot > 0 and torch.rand((), generator=gen).item() < float(r[tokens[c]]) / tot:
                node = c
                path.append(c)
                out.append(tokens[c])
                moved = True
                break
            r[tokens[c]] = 0.0
        if not moved:
            out.append(_sample(r, gen))
            return path, out


def specinfer_tree_rule_wrong(
    parents: list[int], tokens: list[int], p: torch.Tensor, q: torch.Tensor, gen: torch.Generator | None = None
) -> tuple[list[int], list[int]]:
    """SpecInfer's i.i.d.-candidate rule (accept ``c`` with ``min(1, r(c)/q(c))``, else
    ``r = norm(max(0, r - q))``) applied to deterministic top-k candidates. NOT lossless — kept for
    the tests that show it fails. ``q [n, V]``: drafter probabilities at every node."""
    children: dict[int, list[int]] = {}
    for c, par in enumerate(parents):
        if par >= 0:
            children.setdefault(par, []).append(c)
    node, path, out = 0, [0], []
    while True:
        r = p[node].clone()
        moved = False
        for c in children.get(node, []):
            t = tokens[c]
            if torch.rand((), generator=gen).item() < min(1.0, float(r[t]) / max(float(q[node, t]), 1e-12)):
                node, moved = c, True
                path.append(c)
                out.append(t)
                break
            r = torch.clamp(r - q[node], min=0)
            r = r / r.sum() if r.sum() > 0 else p[node].clone()
        if not moved:
            out.append(_sample(r, gen))
            return path, out
