"""State slots, factor banks and deferred-commit bookkeeping (vLLM-free).

A *state slot* holds one request's recurrent state for every GDN layer: the conv window
``[W-1, C]``, the recurrent state ``[HV, V, K]`` (fp32) and two *factor banks* of ``Tmax`` window
positions each (k^, v~, g, raw conv input x; ARCHITECTURE.md "State slots", ALGORITHMS.md §2, §6).
Its size does not grow with K beyond the factors themselves: one state plus ``2 * Tmax`` factor
rows, never ``1 + K`` states.

:class:`SlotBook` is the per-slot SpecLA bookkeeping shared by all layers (which bank holds the
latest factors, how many of them are *pending*, i.e. accepted but not yet folded into the state).
:class:`StepPlan` is the per-step metadata handed to every layer (STYLE.md: built once per step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from vllm_specla.models.config import GatedDeltaNetConfig


class LayerState(NamedTuple):
    """One GDN layer's state tensors, all indexed by state slot first.

    conv ``[S, W-1, C]`` (model dtype or fp32), ssm ``[S, HV, V, K]`` fp32,
    bank_k ``[S, 2, Tmax, H, K]``, bank_v ``[S, 2, Tmax, HV, V]``, bank_g ``[S, 2, Tmax, HV]``,
    bank_x ``[S, 2, Tmax, C]`` (fp32). Banks may be ``None`` when speculation is off.
    """

    conv: torch.Tensor
    ssm: torch.Tensor
    bank_k: torch.Tensor | None = None
    bank_v: torch.Tensor | None = None
    bank_g: torch.Tensor | None = None
    bank_x: torch.Tensor | None = None


def layer_state_shapes(
    config: GatedDeltaNetConfig, max_window: int, tp_size: int = 1
) -> list[tuple[int, ...]]:
    """Per-slot shapes ``[conv, ssm, bank_k, bank_v, bank_g, bank_x]`` of one layer.

    ``max_window = 1 + K`` (0 = no factor banks: AR only). Heads are divided by ``tp_size``.
    """
    H = config.num_heads // tp_size
    HV = config.n_v_heads // tp_size
    K, V, W = config.head_k_dim, config.head_v_dim, config.conv_size
    C = 2 * H * K + HV * V
    shapes = [(W - 1, C), (HV, V, K)]
    if max_window > 0:
        T = max_window
        shapes += [(2, T, H, K), (2, T, HV, V), (2, T, HV), (2, T, C)]
    return shapes


def allocate_layer_states(
    config: GatedDeltaNetConfig,
    num_slots: int,
    max_window: int,
    device: torch.device | str = "cpu",
    conv_dtype: torch.dtype = torch.float32,
    stacked: bool = False,
) -> list[LayerState]:
    """Allocate zeroed :class:`LayerState` for every layer (the vLLM-free runtime's cache).

    ``stacked=True``: each field of all layers is one ``[L, S, ...]`` tensor and layer ``l`` holds
    its contiguous view ``[l]`` (same shapes and strides as separate tensors), so per-step work on
    every layer's banks can run as one launch over :func:`stacked_view` (the runtime's tree-path
    compaction, :func:`vllm_specla.ops.tree_reference.compact_path_factors`)."""
    shapes = layer_state_shapes(config, max_window)
    dtypes = [conv_dtype] + [torch.float32] * (len(shapes) - 1)
    L = config.num_hidden_layers
    if stacked:
        big = [torch.zeros((L, num_slots, *s), dtype=d, device=device) for s, d in zip(shapes, dtypes)]
        return [LayerState(*[b[i] for b in big]) for i in range(L)]
    return [LayerState(*[torch.zeros((num_slots, *s), dtype=d, device=device) for s, d in zip(shapes, dtypes)])
            for _ in range(L)]


def stacked_view(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The ``[L, *shape]`` tensor whose ``[l]`` is ``tensors[l]``, without a copy: the tensors must
    be consecutive contiguous slices of one storage (``allocate_layer_states(stacked=True)``).

    Raises:
        ValueError: when they are not (different shapes / dtypes / storages, gaps, not contiguous)."""
    t0 = tensors[0]
    n = t0.numel()
    for i, t in enumerate(tensors):
        if (t.shape != t0.shape or t.dtype != t0.dtype or not t.is_contiguous()
                or t.untyped_storage().data_ptr() != t0.untyped_storage().data_ptr()
                or t.storage_offset() != t0.storage_offset() + i * n):
            raise ValueError(f"stacked_view: tensor {i} is not the next slice of one stacked allocation "
                             "(allocate the states with allocate_layer_states(stacked=True))")
    return t0.as_strided((len(tensors), *t0.shape), (n, *t0.stride()), t0.storage_offset())


def state_bytes_per_slot(config: GatedDeltaNetConfig, max_window: int, conv_bytes: int = 4) -> dict[str, int]:
    """Bytes per slot over all layers: ``{"state": conv+ssm, "factors": banks, "total": ...}``."""
    shapes = layer_state_shapes(config, max_window)
    n = [int(torch.Size(s).numel()) for s in shapes]
    state = n[0] * conv_bytes + n[1] * 4
    factors = sum(n[2:]) * 4
    L = config.num_hidden_layers
    return {"state": state * L, "factors": factors * L, "total": (state + factors) * L}


@dataclass
class RowGroup:
    """A group of rows (requests) of one kind inside the flattened token batch.

    token_idx: ``[n_tok]`` int64 positions of the group's tokens in the batch (row-contiguous),
    or None when the group is the whole batch in order. cu_seqlens: ``[R+1]`` int64 (group-local).
    slots: ``[R]`` int64 state slots.
    """

    token_idx: torch.Tensor | None
    cu_seqlens: torch.Tensor
    slots: torch.Tensor


@dataclass
class PrefillRows(RowGroup):
    """Rows that commit every token (prompt prefill, chunked prefill continuation)."""

    has_initial_state: torch.Tensor = None  # [R] bool


@dataclass
class VerifyRows(RowGroup):
    """Decode / verify windows (1 + K tokens, state read once, pending factors applied first).

    ``speculative=False`` (AR): the final state is written directly, no factors; with
    ``out_slots`` to those slots instead (the read slots are left as they were: a draft step onto
    scratch slots without copying the state first), and with ``write_state=False`` not at all (a
    last draft step, whose state nothing reads).
    ``speculative=True``: factors go to ``write_bank``; the state is left at the committed
    point until acceptance (``SlotBook.accept``).
    """

    speculative: bool = False
    pending_len: torch.Tensor | None = None  # [R] int64
    read_bank: torch.Tensor | None = None  # [R] int64
    write_bank: torch.Tensor | None = None  # [R] int64
    # draft trees: [n_tok] parent position within the row (-1 = root); None = every row a chain
    parents: torch.Tensor | None = None
    out_slots: torch.Tensor | None = None  # [R] int64, AR rows only: write the final state there
    write_state: bool = True  # AR rows: False = read the state only (no final state, no factors)


@dataclass
class StepPlan:
    """Per-step metadata shared by all GDN layers (built once, STYLE.md ``VerifyPlan``)."""

    num_tokens: int
    prefill: PrefillRows | None = None
    verify: VerifyRows | None = None
    # verify-row bookkeeping for acceptance (row order of ``verify``)
    extra: dict = field(default_factory=dict)


class SlotBook:
    """Per-slot SpecLA bookkeeping shared by all layers (ALGORITHMS.md §6).

    ``bank_sel[s]``: the bank that holds slot ``s``'s latest factors; ``pending_len[s]``: how many
    of them are accepted but not folded into the state yet (deferred commit). Both int64 on the
    state's device.
    """

    def __init__(self, num_slots: int, device: torch.device | str = "cpu"):
        self.bank_sel = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self.pending_len = torch.zeros(num_slots, dtype=torch.int64, device=device)

    @property
    def num_slots(self) -> int:
        return self.bank_sel.shape[0]

    def take_pending(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For verify rows on ``slots``: return (pending_len, read_bank, write_bank) and flip banks.

        After this call the pending factors are considered consumed by the coming forward (which
        folds them in) and the slots' latest factors live in ``write_bank``.
        """
        pending = self.pending_len[slots].clone()
        read = self.bank_sel[slots].clone()
        write = 1 - read
        self.bank_sel[slots] = write
        self.pending_len[slots] = 0
        return pending, read, write

    def reset(self, slots: torch.Tensor) -> None:
        """A new request (prefill without initial state) or a released slot: drop pending factors."""
        self.pending_len[slots] = 0

    def set_pending(self, slots: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Deferred commit: the first ``num_accepted`` factors of the latest bank become pending."""
        self.pending_len[slots] = num_accepted.to(self.pending_len.dtype)


def build_step_plan(
    query_lens: list[int] | torch.Tensor,
    slots: list[int] | torch.Tensor,
    is_prefill: list[bool] | torch.Tensor,
    has_initial_state: list[bool] | torch.Tensor,
    *,
    speculative: bool,
    book: SlotBook | None = None,
    device: torch.device | str = "cpu",
    parents: list[list[int] | None] | None = None,
    out_slots: list[int] | torch.Tensor | None = None,
    write_state: bool = True,
) -> StepPlan:
    """Build the :class:`StepPlan` of one step from per-row facts (row order = token order).

    Args:
        query_lens: tokens of each row in this step; slots: state slot per row;
        is_prefill: the row commits all its tokens (prompt/continuation); else it is a decode /
        verify window; has_initial_state: the slot holds this request's earlier state.
        speculative: verify rows record factors (SpecLA) instead of writing the final state (AR).
        book: the :class:`SlotBook`; required when ``speculative``; pending factors of verify
        slots are taken (and banks flipped), and prefill slots without initial state are reset.
        parents: per row, the draft tree's parent array (window positions, ``-1`` root) or None
        for a chain; only verify rows may be trees.
        out_slots: per row (AR verify rows only, distinct, none of them a read slot of the step):
            the slot that receives the row's final state and conv window; the read slot keeps its
            state (``VerifyRows.out_slots``).
        write_state: False: AR verify rows only read their state (outputs, nothing written).
    Raises:
        ValueError: when ``speculative`` and no ``book`` is given; ``out_slots`` or
            ``write_state=False`` with ``speculative`` or with prefill rows; a prefill row with
            ``has_initial_state`` (a continuation) on a slot whose factors are still pending in ``book``
            (the caller flushes it first: ``worker/runner.py``), before the book changes; a tree row
            whose parents do not match its token count.
    """
    ql = torch.as_tensor(query_lens, dtype=torch.int64).tolist()
    sl = torch.as_tensor(slots, dtype=torch.int64).tolist()
    pf = [bool(x) for x in torch.as_tensor(is_prefill).tolist()]
    if (out_slots is not None or not write_state) and (speculative or any(pf)):
        raise ValueError("out_slots / write_state=False apply to AR verify rows only (speculative=False, "
                         "no prefill rows)")
    hi = [bool(x) for x in torch.as_tensor(has_initial_state).tolist()]
    if parents is not None:  # checked before the book changes (a refused step loses no pending factors)
        for r, pr in enumerate(parents):
            if pr is not None and r < len(ql) and not pf[r] and len(pr) != ql[r]:
                raise ValueError(f"row {r}: {len(pr)} parents for {ql[r]} tokens")
    starts = [0]
    for n in ql:
        starts.append(starts[-1] + n)
    plan = StepPlan(num_tokens=starts[-1])

    def group(rows: list[int]):
        idx, cu = [], [0]
        for r in rows:
            idx.extend(range(starts[r], starts[r + 1]))
            cu.append(cu[-1] + ql[r])
        whole = len(rows) == len(ql)
        tok = None if whole else torch.tensor(idx, dtype=torch.int64, device=device)
        return tok, torch.tensor(cu, dtype=torch.int64, device=device), torch.tensor(
            [sl[r] for r in rows], dtype=torch.int64, device=device
        )

    prow = [r for r in range(len(ql)) if pf[r]]
    vrow = [r for r in range(len(ql)) if not pf[r]]
    if prow:
        tok, cu, s = group(prow)
        plan.prefill = PrefillRows(
            tok, cu, s, has_initial_state=torch.tensor([hi[r] for r in prow], dtype=torch.bool, device=device)
        )
        if book is not None:
            cont = s[plan.prefill.has_initial_state]
            if bool((book.pending_len[cont] > 0).any()):  # (checked before the book changes)
                bad = [int(x) for x in cont[book.pending_len[cont] > 0].tolist()]
                raise ValueError(f"prefill continuation on a slot with pending factors (slots {bad}): flush it "
                                 "first")
            book.reset(s[~plan.prefill.has_initial_state])
    if vrow:
        tok, cu, s = group(vrow)
        if speculative:
            if book is None:
                raise ValueError("speculative verify rows need a SlotBook")
            pending, read, write = book.take_pending(s)
            plan.verify = VerifyRows(tok, cu, s, speculative=True, pending_len=pending, read_bank=read, write_bank=write)
            if parents is not None and any(parents[r] is not None and parents[r] != list(range(-1, ql[r] - 1))
                                           for r in vrow):
                flat = []
                for r in vrow:
                    pr = parents[r] if parents[r] is not None else list(range(-1, ql[r] - 1))
                    flat.extend(pr)
                plan.verify.parents = torch.tensor(flat, dtype=torch.int64, device=device)
        else:
            pending = read = None
            if book is not None and bool((book.pending_len[s] > 0).any()):
                if out_slots is not None or not write_state:  # before take_pending: nothing is lost
                    raise ValueError("out_slots / write_state=False: the rows' slots hold pending factors")
                # AR row on a slot with pending factors (e.g. speculation switched off): fold them in
                pending, read, _ = book.take_pending(s)
                book.bank_sel[s] = read  # AR writes no factors: keep the bank selection
            # (out_slots: every row is a verify row, prefill rows were refused above)
            outs = None if out_slots is None else torch.as_tensor(out_slots, dtype=torch.int64).to(device)
            plan.verify = VerifyRows(tok, cu, s, speculative=False, pending_len=pending, read_bank=read,
                                     out_slots=outs, write_state=write_state)
        plan.extra["verify_rows"] = vrow
    plan.extra["prefill_rows"] = prow
    return plan
