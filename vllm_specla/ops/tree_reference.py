"""Plain-torch references for tree verify (ALGORITHMS.md §4) and tree conv.

A draft tree per row is a *parent-pointer array in topological order*: ``parents [N]`` int, one
entry per token of the flattened batch, holding the parent's position **within the same row**
(``0 .. T_r-1``) or ``-1`` for a root (node 0 = x_0, the last sampled token; several roots make a
forest, each root starting from the committed state). Parents come before children:
``parents[t] < t``. A chain is ``parents = [-1, 0, 1, ..., T_r-2]``.

Factors are recorded per node at the node's window position ``t`` in bank ``write_bank`` (k^_t,
v~_t, and the node's own log decay g_t, not the path sum): DeltaConstruct for an accepted
endpoint folds the factors along its path, in path order — :func:`compact_path_factors` gathers
them to positions ``0..A-1`` so that ``recover`` / the next verify's pending fold can use them.

Three forms, all float32, all updating ``state`` (pending commit) and the banks in place:

* :func:`tree_verify_sequential_ref` — each node runs one recurrence step from its parent's state
  (the definition; ALGORITHMS.md §10.1 "per node from its parent's state");
* :func:`tree_verify_ut_ref` — ancestor-masked UT form of §4, reading the root state only;
* :func:`tree_conv_ref` / :func:`tree_conv_sequential_ref` — causal conv where node ``t`` sees only
  its own ancestors (then the committed conv window above the root), never its DFS neighbours.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_specla.ops.reference import (
    _apply_pending_,
    _check_row_args,
    _expand_heads,
    _rows,
    check_f32_state,
    l2norm,
)


def _local_parents(parents: torch.Tensor | list[int], cu_seqlens: torch.Tensor,
                   num_nodes: int | None = None) -> list[list[int]]:
    """Each row's parents as window positions. Raises ValueError (the C++ op's checks, ``csrc/cpu/gdn_verify.cpp``)
    unless ``parents`` has one entry per node (``num_nodes``, the tokens of the call; without it, at least the
    rows' ``cu_seqlens[-1]``) and each row's are topological and local to the row."""
    p = parents.reshape(-1).tolist() if isinstance(parents, torch.Tensor) else list(parents)
    rows = _rows(cu_seqlens, num_nodes)
    need = num_nodes if num_nodes is not None else (rows[-1][1] if rows else 0)
    if len(p) < need or (num_nodes is not None and len(p) != need):
        raise ValueError(f"parents must be [N]: one entry per node (N={need}), got {len(p)}")
    out = []
    for s, e in rows:
        row = [int(x) for x in p[s:e]]
        for t, par in enumerate(row):
            if not (-1 <= par < t):
                raise ValueError(f"parents must be topological (parent < node) and local to the row: node {t} has {par}")
        out.append(row)
    return out


def is_chain(parents: torch.Tensor | list[int], cu_seqlens: torch.Tensor) -> bool:
    """True iff every row is a chain ``[-1, 0, 1, ..., T-2]`` (then chain verify applies)."""
    return all(row == list(range(-1, len(row) - 1)) for row in _local_parents(parents, cu_seqlens))


def ancestor_mask(parents_row: list[int]) -> torch.Tensor:
    """``Mi [T, T]`` bool, ``Mi[t, u]`` iff ``u`` is an ancestor-or-self of ``t`` (§4 ``M_i``)."""
    T = len(parents_row)
    m = torch.zeros(T, T, dtype=torch.bool)
    for t, p in enumerate(parents_row):
        m[t, t] = True
        if p >= 0:
            m[t] |= m[p]
    return m


def path_of(parents_row: list[int], node: int) -> list[int]:
    """Root-to-``node`` path (ancestors then the node itself), in window positions."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents_row[node]
    return path[::-1]


def _prep(q, k, v, g, beta, scale, use_qk_l2norm):
    HV = v.shape[-2]
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q, k = q.float(), k.float()
    return q, k, _expand_heads(q, HV) * scale, _expand_heads(k, HV), v.float(), g.float(), beta.float()


def _pending_commit(state, slot, r, pending_len, read_bank, bank_k, bank_v, bank_g, HV):
    if pending_len is None:
        return
    p = int(pending_len[r])
    if p > 0:
        rb = int(read_bank[r])
        state[slot] = _apply_pending_(state[slot].clone(), bank_k[slot, rb, :p], bank_v[slot, rb, :p],
                                      bank_g[slot, rb, :p], HV)


def _checked_rows(cu_seqlens, num_nodes, slots, num_slots, bank, pending_len=None, read_bank=None,
                  write_bank=None):
    """``_rows(cu_seqlens)`` after the per-row checks of the chain references (ValueError naming the argument)."""
    rows = _rows(cu_seqlens, num_nodes)
    _check_row_args(len(rows), slots, num_slots, bank, pending_len, read_bank, write_bank)
    return rows


def _check_window(T: int, bank_k, write_bank):
    if write_bank is not None and T > bank_k.shape[2]:
        raise ValueError(f"window of {T} nodes exceeds the factor bank (Tmax={bank_k.shape[2]})")


def tree_verify_sequential_ref(
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
    parents: torch.Tensor | list[int],
    bank_k: torch.Tensor | None = None,
    bank_v: torch.Tensor | None = None,
    bank_g: torch.Tensor | None = None,
    write_bank: torch.Tensor | None = None,
    pending_len: torch.Tensor | None = None,
    read_bank: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    node_states: list | None = None,
) -> torch.Tensor:
    """Tree verify by definition: node ``t`` steps the gated delta rule from its parent's state.

    Arguments as :func:`vllm_specla.ops.reference.chain_verify_ref` plus ``parents [N]`` (module
    doc). Pending factors are committed into ``state[slot]`` first; the tree's node states are
    never written to ``state``. If ``node_states`` is a list, each row's ``[T_r, HV, V, K]`` node
    states are appended to it (tests). Returns ``o [N, HV, V]`` float32.

    Raises:
        ValueError: ``parents`` without one entry per node (``[N]``), not topological or not local to its row;
            the per-row arguments as :func:`~vllm_specla.ops.reference.chain_verify_ref` (the C++ ``tree_verify``'s
            checks, ``csrc/cpu/gdn_verify.cpp``).
    """
    check_f32_state(state)
    HV, V = v.shape[-2:]
    q, k, qe, ke, v, g, beta = _prep(q, k, v, g, beta, scale, use_qk_l2norm)
    prow = _local_parents(parents, cu_seqlens, v.shape[0])
    o = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    rows = _checked_rows(cu_seqlens, v.shape[0], slots, state.shape[0], bank_k, pending_len, read_bank, write_bank)
    for r, (s, e) in enumerate(rows):
        slot = int(slots[r])
        _check_window(e - s, bank_k, write_bank)
        _pending_commit(state, slot, r, pending_len, read_bank, bank_k, bank_v, bank_g, HV)
        M0 = state[slot].clone()
        Ms = []
        for t in range(e - s):
            i = s + t
            par = prow[r][t]
            M = (Ms[par] if par >= 0 else M0) * g[i].exp()[:, None, None]
            vt = beta[i][:, None] * (v[i] - torch.einsum("hvk,hk->hv", M, ke[i]))
            M = M + vt[:, :, None] * ke[i][:, None, :]
            o[i] = torch.einsum("hvk,hk->hv", M, qe[i])
            Ms.append(M)
            if write_bank is not None:
                wb = int(write_bank[r])
                bank_k[slot, wb, t] = k[i]
                bank_v[slot, wb, t] = vt
                bank_g[slot, wb, t] = g[i]
        if node_states is not None:
            node_states.append(torch.stack(Ms) if Ms else M0.new_zeros(0, *M0.shape))
    return o


def tree_verify_ut_ref(
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
    parents: torch.Tensor | list[int],
    bank_k: torch.Tensor | None = None,
    bank_v: torch.Tensor | None = None,
    bank_g: torch.Tensor | None = None,
    write_bank: torch.Tensor | None = None,
    pending_len: torch.Tensor | None = None,
    read_bank: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """Tree verify, ancestor-masked UT form (ALGORITHMS.md §4), reading only the root state.

    Per row and value head, with ``Mi`` the ancestor-or-self mask, ``Ms = Mi - I``,
    ``g+ = Mi g``, ``D[t,u] = e^{g+_t - g+_u}`` on ``Mi`` (0 elsewhere),
    ``A = Ms * beta_t (k_t.k_u) D``, ``T = (I + A)^-1``:
    ``V~ = T (beta V) - T ((e^{g+} beta) K) S_0`` and ``O = (e^{g+} Q) S_0 + (Mi * Q K^T * D) V~``
    (``S_0 = M_0^T``, [K, V] form). Same arguments/returns as :func:`tree_verify_sequential_ref`.
    """
    check_f32_state(state)
    HV, V = v.shape[-2:]
    q, k, qe, ke, v, g, beta = _prep(q, k, v, g, beta, scale, use_qk_l2norm)
    prow = _local_parents(parents, cu_seqlens, v.shape[0])
    o = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    dev = v.device
    rows = _checked_rows(cu_seqlens, v.shape[0], slots, state.shape[0], bank_k, pending_len, read_bank, write_bank)
    for r, (s, e) in enumerate(rows):
        slot = int(slots[r])
        T = e - s
        _check_window(T, bank_k, write_bank)
        _pending_commit(state, slot, r, pending_len, read_bank, bank_k, bank_v, bank_g, HV)
        if T == 0:
            continue
        Mi = ancestor_mask(prow[r]).to(dev)
        Msk = Mi & ~torch.eye(T, dtype=torch.bool, device=dev)
        S0 = state[slot].transpose(-1, -2)  # [HV, K, V]
        Q = qe[s:e].transpose(0, 1)  # [HV, T, K]
        Kk = ke[s:e].transpose(0, 1)
        Vv = v[s:e].transpose(0, 1)  # [HV, T, V]
        B = beta[s:e].transpose(0, 1)  # [HV, T]
        Gp = g[s:e].transpose(0, 1) @ Mi.float().T  # g+_t = sum_{u in path(t)} g_u: [HV, T]
        diff = (Gp[:, :, None] - Gp[:, None, :]).masked_fill(~Mi, float("-inf"))
        D = diff.exp()  # [HV, T, T]
        A = (B[:, :, None] * (Kk @ Kk.transpose(-1, -2)) * D).masked_fill(~Msk, 0.0)
        eye = torch.eye(T, dtype=torch.float32, device=dev).expand(HV, T, T)
        Tm = torch.linalg.solve_triangular(eye + A, eye, upper=False, unitriangular=True)
        Vt = Tm @ (B[..., None] * Vv) - Tm @ ((Gp.exp() * B)[..., None] * Kk) @ S0
        O = (Gp.exp()[..., None] * Q) @ S0 + ((Q @ Kk.transpose(-1, -2)) * D) @ Vt
        o[s:e] = O.transpose(0, 1)
        if write_bank is not None:
            wb = int(write_bank[r])
            bank_k[slot, wb, :T] = k[s:e]
            bank_v[slot, wb, :T] = Vt.transpose(0, 1)
            bank_g[slot, wb, :T] = g[s:e]
    return o


def _history(conv_state, slot, r, bank_x, pending_len, read_bank):
    """Committed conv window after folding the pending raw inputs (committed in place)."""
    W1 = conv_state.shape[1]
    hist = conv_state[slot].float()
    if pending_len is not None and int(pending_len[r]) > 0:
        p = int(pending_len[r])
        hist = torch.cat([hist, bank_x[slot, int(read_bank[r]), :p]], 0)[-W1:]
        conv_state[slot] = hist.to(conv_state.dtype)
    return hist


def tree_conv_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: torch.Tensor,
    parents: torch.Tensor | list[int],
    conv_state: torch.Tensor,
    slots: torch.Tensor,
    *,
    bank_x: torch.Tensor | None = None,
    write_bank: torch.Tensor | None = None,
    pending_len: torch.Tensor | None = None,
    read_bank: torch.Tensor | None = None,
) -> torch.Tensor:
    """Tree conv (ALGORITHMS.md §4 "Tree conv"): ``y_t = SiLU(sum_j w[W-1-j] x_{a^j(t)})``.

    ``a^0(t) = t``, ``a^j`` its j-th ancestor; above the root the committed window (after the
    pending commit, done in place as in :func:`~vllm_specla.ops.reference.conv_verify_ref`), most
    recent first. Raw inputs are recorded per node into ``bank_x[s, write_bank, t]``; the conv
    window is not advanced (commit after acceptance: compaction + ``conv_commit``).

    Args: x ``[N, C]``, weight ``[C, W]``, conv_state ``[num_slots, W-1, C]``, parents ``[N]``.
    Returns ``y [N, C]`` float32.
    """
    W = weight.shape[-1]
    x32, w32 = x.float(), weight.float()
    y = torch.empty_like(x32)
    prow = _local_parents(parents, cu_seqlens, x.shape[0])
    rows = _checked_rows(cu_seqlens, x.shape[0], slots, conv_state.shape[0], bank_x, pending_len, read_bank,
                         write_bank)
    for r, (s, e) in enumerate(rows):
        slot = int(slots[r])
        hist = _history(conv_state, slot, r, bank_x, pending_len, read_bank)
        T = e - s
        if write_bank is not None and T > bank_x.shape[2]:
            raise ValueError(f"window of {T} nodes exceeds the factor bank (Tmax={bank_x.shape[2]})")
        # src[j, t] = index into z = hist ++ x_row of the j-th ancestor of t (j = 0: t itself)
        z = torch.cat([hist, x32[s:e]], 0)
        W1 = W - 1
        idx = torch.empty(W, T, dtype=torch.long)
        for t in range(T):
            cur, h = t, W1 - 1
            for j in range(W):
                if cur >= 0:
                    idx[j, t] = W1 + cur
                    cur = prow[r][cur]
                else:
                    idx[j, t] = h
                    h -= 1
        acc = torch.zeros(T, x.shape[1], dtype=torch.float32, device=x.device)
        for j in range(W):
            acc = acc + w32[:, W - 1 - j] * z[idx[j].to(x.device)]
        y[s:e] = F.silu(acc)
        if write_bank is not None:
            bank_x[slot, int(write_bank[r]), :T] = x32[s:e]
    return y


def tree_conv_sequential_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: torch.Tensor,
    parents: torch.Tensor | list[int],
    conv_state: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """Oracle for :func:`tree_conv_ref`: for each node, the chain conv of its own path
    (committed window ++ root..node) — what AR would compute had that path been generated.
    Read-only (no pending, no banks). Returns ``y [N, C]`` float32."""
    from vllm_specla.ops.reference import _conv_silu  # noqa: PLC0415

    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    prow = _local_parents(parents, cu_seqlens, x.shape[0])
    for r, (s, e) in enumerate(_checked_rows(cu_seqlens, x.shape[0], slots, conv_state.shape[0], None)):
        hist = conv_state[int(slots[r])].float()
        for t in range(e - s):
            path = path_of(prow[r], t)
            xp = x[s:e].float()[path]
            y[s + t] = _conv_silu(hist, xp, weight.float())[-1]
    return y


def compact_path_factors(
    banks: list[torch.Tensor],
    slots: torch.Tensor,
    bank_idx: torch.Tensor,
    path: torch.Tensor,
    path_len: torch.Tensor,
    stacked: bool = False,
) -> None:
    """Gather an accepted tree path's factors to window positions ``0..A-1`` in place.

    After tree acceptance the endpoint's path ``path[r, :path_len[r]]`` (window positions, root
    first, increasing) is moved to the front of bank ``bank_idx[r]`` of every bank tensor in
    ``banks`` (any of ``bank_k``, ``bank_v``, ``bank_g``, ``bank_x``: ``[S, 2, Tmax, ...]``), so
    that ``recover`` / ``conv_commit`` / the next verify's pending fold apply it as a chain.
    In place is safe: ``path[r, j] >= j``, so position ``j`` is overwritten only after every read
    of it. No host sync (pure tensor indexing).

    Args: slots, bank_idx, path_len ``[R]`` int; path ``[R, P]`` int (entries past ``path_len``
    ignored); ``stacked``: every tensor of ``banks`` has a leading layer dimension
    (``[L, S, 2, Tmax, ...]``, :func:`vllm_specla.core.state.stacked_view`), compacted for all
    layers at once.

    Two indexing kernels per bank tensor (one gather of all ``P`` path positions, then one
    scatter), so a runtime step launches ``8 x layers`` small kernels over per-layer banks, or 8
    over stacked ones; the gather materialises every source before any write.
    """
    R, P = path.shape
    if R == 0:
        return
    dev = path.device
    slots = slots.to(dev).long()[:, None]
    bank_idx = bank_idx.to(dev).long()[:, None]
    ar = torch.arange(P, device=dev)[None, :]
    src = torch.where(ar < path_len.to(dev)[:, None], path.long(), ar)  # positions past the path stay
    for b in banks:
        if stacked:
            b[:, slots, bank_idx, ar] = b[:, slots, bank_idx, src]
        else:
            b[slots, bank_idx, ar] = b[slots, bank_idx, src]


# Name used by the issue tracker and the kernel tests for "the" tree-verify oracle.
tree_verify_ref = tree_verify_sequential_ref


# --------------------------------------------------------------------------------------------
# Heavy-light (chain-decomposed) schedule, ALGORITHMS.md §5
# --------------------------------------------------------------------------------------------
#
# Per row (forests allowed): a virtual root sits above the row's roots, holding the committed
# state S_0 (after the pending fold). size(u) = 1 + sum of its children's sizes; heavy(u) = the
# child with the largest subtree, ties -> the earliest in topological order (the virtual root's
# heavy child = the largest root subtree, ties -> the earliest root, so node 0 for a single tree).
# Chains start at every root and at every light child and follow heavy pointers to a leaf. The
# chain of the heavy root is wave 0; a chain starting at a light child c has
# wave(chain of parent(c)) + 1 (the other roots of a forest: wave 1). A node with light children is
# a *boundary*: its state is materialised (scratch slot ``bslot``) for its light children's chains.
# A tree (single root) of N nodes has at most floor(log2 N) + 1 waves (each light edge at least
# halves the subtree size).


class HLDRow:
    """Heavy-light schedule of one row (window positions ``0..T-1``).

    Attributes: ``size``, ``heavy`` (heavy child, ``-1`` for a leaf), ``wave`` (of the node's chain),
    ``chains`` (``[(wave, [head, ..., tail])]`` sorted by ``(wave, head)``), ``boundary`` (nodes with
    light children, increasing), ``bslot`` (scratch slot per node = index in ``boundary``, ``-1``
    otherwise), ``heavy_root``.
    """

    def __init__(self, parents_row: list[int]):
        par = [int(p) for p in parents_row]
        T = len(par)
        for t, p in enumerate(par):
            if not (-1 <= p < t):
                raise ValueError(f"parents must be topological (parent < node): node {t} has {p}")
        size = [1] * T
        for t in range(T - 1, -1, -1):
            if par[t] >= 0:
                size[par[t]] += size[t]
        heavy, best = [-1] * T, [0] * T
        heavy_root, best_root = -1, 0
        for t in range(T):  # increasing t + strict '>' = ties go to the earliest child
            p = par[t]
            if p >= 0:
                if size[t] > best[p]:
                    best[p], heavy[p] = size[t], t
            elif size[t] > best_root:
                best_root, heavy_root = size[t], t
        wave, bnd = [0] * T, [False] * T
        heads = []
        for t in range(T):
            p = par[t]
            light = (t != heavy_root) if p < 0 else (heavy[p] != t)
            wave[t] = (0 if p < 0 else wave[p]) + int(light)
            if p < 0 or light:
                heads.append(t)
            if p >= 0 and light:
                bnd[p] = True
        heads.sort(key=lambda h: (wave[h], h))
        chains = []
        for h in heads:
            nodes, u = [], h
            while u >= 0:
                nodes.append(u)
                u = heavy[u]
            chains.append((wave[h], nodes))
        self.parents = par
        self.size, self.heavy, self.wave, self.heavy_root = size, heavy, wave, heavy_root
        self.chains = chains
        self.boundary = [t for t in range(T) if bnd[t]]
        self.bslot = [-1] * T
        for i, t in enumerate(self.boundary):
            self.bslot[t] = i

    @property
    def num_waves(self) -> int:
        return (self.chains[-1][0] + 1) if self.chains else 0

    def chains_per_wave(self) -> list[int]:
        out = [0] * self.num_waves
        for w, _ in self.chains:
            out[w] += 1
        return out

    @property
    def serial_depth(self) -> int:
        """Sum over waves of the longest chain: the sequential node steps of the wave schedule."""
        best = [0] * self.num_waves
        for w, nodes in self.chains:
            best[w] = max(best[w], len(nodes))
        return sum(best)


def hld_schedule_ref(parents: torch.Tensor | list[int], cu_seqlens: torch.Tensor) -> list[HLDRow]:
    """Heavy-light schedule of every row (plain Python; the oracle of the device schedule kernel)."""
    return [HLDRow(row) for row in _local_parents(parents, cu_seqlens)]


def hld_layout(BN: int, NW: int) -> dict[str, int]:
    """Offsets of the packed int32 schedule row (one row per request, ``LS`` entries):
    ``heavy[BN]`` | ``bslot[BN]`` | ``heads[BN]`` (chain heads sorted by (wave, node), ``-1`` pad) |
    ``wave_off[NW + 1]`` (chains of wave ``w`` = ``heads[wave_off[w]:wave_off[w+1]]``) | ``n_boundary``."""
    return dict(heavy=0, bslot=BN, heads=2 * BN, wave_off=3 * BN, n_boundary=3 * BN + NW + 1, LS=3 * BN + NW + 2)


def hld_pack(rows: list[HLDRow], BN: int, NW: int) -> torch.Tensor:
    """Pack schedules into the ``[R, LS]`` int32 layout of :func:`hld_layout` (what the device
    schedule kernel writes; chains of waves ``>= NW`` are dropped, which never happens for rows of
    at most ``BN`` nodes and ``NW = len(hld_max_chains_per_wave(BN))``)."""
    lay = hld_layout(BN, NW)
    out = torch.full((len(rows), lay["LS"]), -1, dtype=torch.int32)
    for r, row in enumerate(rows):
        T = len(row.heavy)
        if T > BN:
            raise ValueError(f"row of {T} nodes exceeds the schedule width {BN}")
        out[r, lay["heavy"]:lay["heavy"] + T] = torch.tensor(row.heavy, dtype=torch.int32)
        out[r, lay["bslot"]:lay["bslot"] + T] = torch.tensor(row.bslot, dtype=torch.int32)
        heads = [nodes[0] for w, nodes in row.chains if w < NW]
        out[r, lay["heads"]:lay["heads"] + len(heads)] = torch.tensor(heads, dtype=torch.int32)
        for w in range(NW + 1):
            out[r, lay["wave_off"] + w] = sum(1 for cw, _ in row.chains if cw < w)
        out[r, lay["n_boundary"]] = len(row.boundary)
    return out


def _hld_max_chains_table(n: int) -> list[list[int]]:
    """``F[w][s]``: the most chains of wave ``w`` any tree of ``s <= n`` nodes can have (its root's
    chain is wave 0). DP: ``F[w][s] = max_S F[w][S] + G_{w-1}(s - 1 - S, cap S)``, ``S`` the heavy
    subtree size, ``G_x(m, cap)`` the best sum of ``F[x][s_i]`` over light subtrees ``s_i <= cap``
    with ``sum s_i = m`` (unbounded knapsack, item sizes added one cap at a time)."""
    F = [[0] + [1] * n]
    while True:
        prev = F[-1]
        # G[cap][m]: light subtrees of size <= cap summing to exactly m (m = 0 -> 0)
        G = [[0] + [-1] * n]  # cap 0: only m = 0 reachable (-1 = unreachable)
        for cap in range(1, n + 1):
            row = list(G[-1])
            for m in range(cap, n + 1):
                if row[m - cap] >= 0:
                    row[m] = max(row[m], row[m - cap] + prev[cap])
            G.append(row)
        cur = [0] * (n + 1)
        for s in range(2, n + 1):
            cur[s] = max(cur[S] + G[S][s - 1 - S] for S in range(1, s))
        if max(cur) == 0:
            return F
        F.append(cur)


_WAVE_BOUNDS: dict[int, list[int]] = {}


def hld_max_chains_per_wave(n_nodes: int, forest: bool = True) -> list[int]:
    """Upper bound on the chains of each wave over all rows of at most ``n_nodes`` nodes: entry
    ``w`` bounds wave ``w``; the length bounds the number of waves (``floor(log2 n) + 1`` for
    trees). With ``forest`` the bound covers forests (a virtual root above the roots, ``n + 1``
    nodes). Host-only (shapes), so launch grids derived from it need no sync."""
    n = max(1, int(n_nodes)) + (1 if forest else 0)
    if n not in _WAVE_BOUNDS:
        F = _hld_max_chains_table(n)
        _WAVE_BOUNDS[n] = [F[w][n] for w in range(len(F))]
    return list(_WAVE_BOUNDS[n])


def tree_verify_hld_ref(
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
    parents: torch.Tensor | list[int],
    bank_k: torch.Tensor | None = None,
    bank_v: torch.Tensor | None = None,
    bank_g: torch.Tensor | None = None,
    write_bank: torch.Tensor | None = None,
    pending_len: torch.Tensor | None = None,
    read_bank: torch.Tensor | None = None,
    use_qk_l2norm: bool = True,
    boundary_log: list | None = None,
) -> torch.Tensor:
    """Tree verify executed on the heavy-light schedule (what the Triton HLD kernel does), in torch.

    Chains run wave by wave; each starts from ``S_0`` (its head is a root) or from the materialised
    state of its head's parent, steps its nodes with the state kept local, and materialises the
    state after every boundary node. Same arguments, results and side effects as
    :func:`tree_verify_sequential_ref`. ``boundary_log`` (tests): appended ``(row, node)`` for every
    materialised state.
    """
    check_f32_state(state)
    HV, V = v.shape[-2:]
    q, k, qe, ke, v, g, beta = _prep(q, k, v, g, beta, scale, use_qk_l2norm)
    o = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    rows = _checked_rows(cu_seqlens, v.shape[0], slots, state.shape[0], bank_k, pending_len, read_bank, write_bank)
    sched = [HLDRow(row) for row in _local_parents(parents, cu_seqlens, v.shape[0])]
    for r, ((s, e), row) in enumerate(zip(rows, sched)):
        slot = int(slots[r])
        _check_window(e - s, bank_k, write_bank)
        _pending_commit(state, slot, r, pending_len, read_bank, bank_k, bank_v, bank_g, HV)
        M0 = state[slot].clone()
        scratch = {}
        for _, nodes in row.chains:  # sorted by wave: a head's parent was materialised earlier
            par = row.parents[nodes[0]]
            M = M0 if par < 0 else scratch[par]
            for t in nodes:
                i = s + t
                M = M * g[i].exp()[:, None, None]
                vt = beta[i][:, None] * (v[i] - torch.einsum("hvk,hk->hv", M, ke[i]))
                M = M + vt[:, :, None] * ke[i][:, None, :]
                o[i] = torch.einsum("hvk,hk->hv", M, qe[i])
                if row.bslot[t] >= 0:
                    scratch[t] = M
                    if boundary_log is not None:
                        boundary_log.append((r, t))
                if write_bank is not None:
                    wb = int(write_bank[r])
                    bank_k[slot, wb, t] = k[i]
                    bank_v[slot, wb, t] = vt
                    bank_g[slot, wb, t] = g[i]
    return o
