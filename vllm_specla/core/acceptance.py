"""Acceptance rules for verified draft chains (ALGORITHMS.md §9, §3).

Greedy chain: accept draft ``d_i`` while ``d_i == argmax p_{i-1}``; at the first mismatch emit
``argmax p_{i-1}`` (the correction); if all ``K`` drafts are accepted emit the bonus
``argmax p_K``. The emitted tokens are a prefix-shaped list (vLLM's scheduler contract:
``num_accepted_tokens = len(emitted)``; the state commits window nodes ``0..len(emitted)-1``).
"""

from __future__ import annotations

import torch


def greedy_accept_chain(
    draft_tokens: torch.Tensor, num_drafts: torch.Tensor, target_argmax: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance of a batch of draft chains, on any device (no host round trip).

    Args:
        draft_tokens: ``[R, K]`` int64 drafts (entries past ``num_drafts[r]`` are ignored).
        num_drafts: ``[R]`` int64 number of drafts per row (0 allowed: a zero-draft step).
        target_argmax: ``[R, K+1]`` int64, ``argmax p_i`` at window node ``i`` (node 0 = the last
            committed token), entries past ``num_drafts[r]`` ignored.
    Returns:
        ``emitted [R, K+1]`` int64 (accepted drafts then the correction/bonus token, ``-1``
        padded) and ``num_emitted [R]`` int64 in ``1..num_drafts+1`` (= vLLM's
        ``num_accepted_tokens``).
    """
    R, K = draft_tokens.shape
    pos = torch.arange(K, device=draft_tokens.device)
    match = (draft_tokens == target_argmax[:, :K]) & (pos[None, :] < num_drafts[:, None])
    # number of leading matches = index of the first non-match
    accepted = torch.cumprod(match.to(torch.int64), dim=1).sum(1)
    num_emitted = accepted + 1
    col = torch.arange(K + 1, device=draft_tokens.device)
    emitted = torch.where(col[None, :] < accepted[:, None], torch.nn.functional.pad(draft_tokens, (0, 1)), -1)
    emitted.scatter_(1, accepted[:, None], target_argmax.gather(1, accepted[:, None]))
    return emitted, num_emitted


def greedy_accept_tree(parents: list[int], tokens: list[int], target_argmax: list[int]) -> tuple[list[int], list[int]]:
    """Greedy tree acceptance (ALGORITHMS.md §9): from the root, move to the child whose token is
    ``argmax p_node``; stop when none matches and emit ``argmax p_node``.

    Args:
        parents, tokens: the draft tree (node 0 = root x0, topological order).
        target_argmax: ``argmax p`` at every node.
    Returns:
        ``(path, emitted)``: window positions of the accepted path (root first) and the emitted
        tokens (accepted drafts along the path, then the correction/bonus), a prefix-shaped list
        for vLLM's scheduler; ``len(emitted) == len(path)``.
    """
    children: dict[int, list[int]] = {}
    for c, p in enumerate(parents):
        if p >= 0:
            children.setdefault(p, []).append(c)
    node, path = 0, [0]
    while True:
        want = target_argmax[node]
        nxt = next((c for c in children.get(node, []) if tokens[c] == want), None)
        if nxt is None:
            break
        node = nxt
        path.append(node)
    emitted = [tokens[i] for i in path[1:]] + [target_argmax[node]]
    return path, emitted
