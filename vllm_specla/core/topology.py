"""Draft trees: topology, ancestor masks, heavy-light chain schedule, confidence pruning.

A :class:`DraftTree` is one request's verify window as a parent-pointer array in topological
order (parents before children). Node 0 is the root ``x0`` (the last committed token, not a
draft); every other node is a draft token. A chain is the tree ``parents = [-1, 0, 1, ...]``.
Sources: ALGORITHMS.md §4 (masks), §5 (heavy-light schedule), §7 (pruning), §9 (acceptance).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    """Tokens, parents and drafter scores of one request's draft tree.

    tokens: ``[n]`` token ids (``tokens[0]`` = root x0). parents: ``[n]``, ``parents[0] = -1``,
    ``parents[i] < i``. logp: ``[n]`` drafter log-prob of node i given its parent's path (0 for the
    root). q: optional ``{node: [vocab] float}`` drafter distributions *at* node i (over its
    children), kept for stochastic acceptance.
    """

    tokens: list[int]
    parents: list[int]
    logp: list[float] = field(default_factory=list)
    q: dict[int, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents must have the same length")
        if not self.tokens:
            raise ValueError("tokens: a draft tree has at least its root (node 0, the last committed token)")
        if self.logp and len(self.logp) != len(self.tokens):
            raise ValueError(f"logp: {len(self.logp)} values for {len(self.tokens)} nodes "
                             f"(one per node, 0 for the root)")
        for i, p in enumerate(self.parents):
            if not (-1 <= p < i) or (i == 0) != (p == -1):
                raise ValueError(f"parents must be topological with a single root at 0: node {i} has parent {p}")
        if not self.logp:
            self.logp = [0.0] * len(self.tokens)

    @classmethod
    def chain(cls, root: int, drafts: list[int]) -> "DraftTree":
        """A chain as a tree: node 0 = ``root`` (the last committed token), node ``i`` = ``drafts[i-1]``
        with parent ``i - 1``."""
        return cls([root] + list(drafts), list(range(-1, len(drafts))))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_drafts(self) -> int:
        """Draft tokens in the tree (every node but the root)."""
        return len(self.tokens) - 1

    def truncated(self, max_depth: int) -> "DraftTree":
        """The tree without nodes deeper than ``max_depth`` (topological order kept)."""
        keep = [i for i in range(len(self)) if self.depth(i) <= max_depth]
        if len(keep) == len(self):
            return self
        remap = {old: new for new, old in enumerate(keep)}
        return DraftTree([self.tokens[i] for i in keep],
                         [remap[self.parents[i]] if self.parents[i] >= 0 else -1 for i in keep],
                         [self.logp[i] for i in keep], {remap[i]: d for i, d in self.q.items() if i in remap})

    def deepest_path(self) -> list[int]:
        """Tokens of the deepest root-to-leaf path (ties: best score), excluding the root: the
        chain vLLM's scheduler is told about when a tree is verified."""
        if len(self) == 1:
            return []
        best = max(range(1, len(self)), key=lambda i: (self.depth(i), self.score(i)))
        return [self.tokens[j] for j in self.path(best)[1:]]

    def children(self, i: int) -> list[int]:
        """Node indices whose parent is ``i``, ascending."""
        return [c for c, p in enumerate(self.parents) if p == i]

    def depth(self, i: int) -> int:
        """Edges from the root to node ``i`` (the root: 0; draft ``d_k`` of a chain: ``k``)."""
        d = 0
        while self.parents[i] >= 0:
            i = self.parents[i]
            d += 1
        return d

    @property
    def max_depth(self) -> int:
        """The deepest node's depth: the most draft tokens one accepted path can hold."""
        return max(self.depth(i) for i in range(len(self)))

    def path(self, i: int) -> list[int]:
        """Root-to-node path (node indices, root first)."""
        out = []
        while i >= 0:
            out.append(i)
            i = self.parents[i]
        return out[::-1]

    def score(self, i: int) -> float:
        """Cumulative drafter log-prob of the path to node i (ALGORITHMS.md §7)."""
        return sum(self.logp[j] for j in self.path(i))

    def is_chain(self) -> bool:
        """Whether every node's parent is the node before it (a chain goes to ``chain_verify``)."""
        return self.parents == list(range(-1, len(self) - 1))

    def ancestor_mask(self) -> torch.Tensor:
        """``[n, n]`` bool: ``M[t, u]`` iff u is an ancestor-or-self of t (ALGORITHMS.md §4 ``M_i``)."""
        n = len(self)
        m = torch.zeros(n, n, dtype=torch.bool)
        for t, p in enumerate(self.parents):
            m[t, t] = True
            if p >= 0:
                m[t] |= m[p]
        return m

    def dfs_order(self) -> list[int]:
        """Node indices in depth-first pre-order from the root, children in index order."""
        out, stack = [], [0]
        while stack:
            u = stack.pop()
            out.append(u)
            stack.extend(reversed(self.children(u)))
        return out

    def heavy_light_chains(self) -> list[tuple[int, list[int]]]:
        """Heavy-light decomposition (ALGORITHMS.md §5): ``[(wave, chain nodes)]``.

        heavy(u) = child with the largest subtree (ties: earliest); chains start at the root and at
        every light child; wave(chain of light child c) = wave(chain containing parent(c)) + 1.
        """
        n = len(self)
        size = [1] * n
        for i in range(n - 1, 0, -1):
            size[self.parents[i]] += size[i]
        heavy = {}
        for u in range(n):
            ch = self.children(u)
            if ch:
                heavy[u] = max(ch, key=lambda c: (size[c], -c))
        chains, wave_of_node = [], {}
        starts = [(0, 0)]
        while starts:
            s, w = starts.pop(0)
            chain, u = [], s
            while True:
                chain.append(u)
                wave_of_node[u] = w
                for c in self.children(u):
                    if c != heavy.get(u):
                        starts.append((c, w + 1))
                if u not in heavy:
                    break
                u = heavy[u]
            chains.append((w, chain))
        return chains


def prune_tree(tree: DraftTree, tau: float | None, node_budget: int | None) -> DraftTree:
    """Confidence-guided pruning (ALGORITHMS.md §7): keep nodes with ``score >= best - tau``,
    best-first up to ``node_budget`` drafts, ancestor-closed; the root is always kept.

    ``best`` is the best score among the tree's draft nodes. Returns a new tree (topological order
    preserved) with the drafter distributions of kept nodes.
    """
    n = len(tree)
    if n <= 1:
        return tree
    scores = [tree.score(i) for i in range(n)]
    best = max(scores[1:])
    cand = [i for i in range(1, n) if tau is None or scores[i] >= best - tau]
    cand.sort(key=lambda i: (-scores[i], i))
    keep = {0}
    for i in cand:
        if node_budget is not None and len(keep) - 1 >= node_budget:
            break
        path = tree.path(i)
        new = [j for j in path if j not in keep]
        if node_budget is not None and len(keep) - 1 + len(new) > node_budget:
            continue
        keep.update(new)
    order = sorted(keep)
    remap = {old: new for new, old in enumerate(order)}
    return DraftTree(
        [tree.tokens[i] for i in order],
        [remap[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in order],
        [tree.logp[i] for i in order],
        {remap[i]: d for i, d in tree.q.items() if i in remap},
    )
