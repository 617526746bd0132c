"""Frequency-ranked draft vocabulary (FR-Spec, arXiv 2502.14856; EAGLE-3's ``draft_vocab_size``).

The EAGLE drafter reads its logits out through the target's LM head, one ``[V, D]`` GEMM per draft
token. At batch 1 that weight read is a large share of a draft step (flame 1B shape: 131 MB of a
~245 MB draft step, bf16). With a draft vocabulary the drafter scores only the ``Vd`` tokens that
are most frequent in a corpus, through ``[Vd, D]`` rows of the same LM head copied once at load.

Verification is unchanged (the target scores the full vocabulary), so greedy output equals AR and
sampled output keeps the target distribution: the drafts stay deterministic (point-mass) proposals,
which the acceptance rules of ``core/sampling.py`` (ALGORITHMS.md §9) keep exact whichever tokens
they are. What a smaller ``Vd`` can cost is acceptance: a target token outside the draft
vocabulary can never be drafted (``benchmarks/RESULTS.md`` measures it on the embedded pair).

The ranking comes from ``token_counts.json`` in the drafter checkpoint directory
(:data:`TOKEN_COUNTS_FILE`: ``{"vocab_size": V, "counts": [V ints], "source": "..."}``, written by
``examples/count_tokens.py``), so any ``Vd`` can be chosen at serving time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

import torch

from vllm_specla.core import is_int

TOKEN_COUNTS_FILE = "token_counts.json"


def draft_vocab_ids(counts: Sequence[int] | torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` most frequent token ids, in ascending id order.

    Args:
        counts: ``[V]`` non-negative token counts (int).
        size: draft vocabulary size ``Vd``, an integer ``1 <= size <= V`` (not a bool).
    Returns:
        ``[Vd]`` int64 on the CPU. Ties in count go to the lower id; ascending order makes an
        argmax over the draft logits pick the lowest id among equal logits, as an argmax over
        full logits masked to the draft vocabulary does.
    Raises:
        ValueError: ``size`` not an integer in ``1..V`` (a float, a bool), or a negative count.
    """
    c = torch.as_tensor(counts, dtype=torch.int64).reshape(-1)
    V = c.numel()
    if not is_int(size) or not 1 <= size <= V:  # (2.5 failed in slicing with a TypeError; True was taken as 1)
        raise ValueError(f"size must be an integer 1..{V} (the vocabulary size), got {size!r}")
    if int(c.min()) < 0:
        raise ValueError("token counts must be non-negative")  # (load_token_counts names the file)
    # stable sort by descending count: equal counts keep ascending id order
    order = torch.sort(-c, stable=True).indices
    return order[:size].sort().values


def count_tokens(sequences: Iterable[Sequence[int]], vocab_size: int) -> list[int]:
    """Occurrences of every token id in ``sequences`` (token id lists): ``[vocab_size]`` ints.

    Raises:
        ValueError: a token id outside ``0..vocab_size-1``.
    """
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for seq in sequences:
        t = torch.as_tensor(list(seq), dtype=torch.int64)
        if t.numel() == 0:
            continue
        if int(t.min()) < 0 or int(t.max()) >= vocab_size:
            raise ValueError(f"token id outside 0..{vocab_size - 1} in the counted text")
        counts += torch.bincount(t, minlength=vocab_size)
    return counts.tolist()


def save_token_counts(directory: str, counts: Sequence[int], source: str) -> str:
    """Write :data:`TOKEN_COUNTS_FILE` into ``directory``; returns its path."""
    path = os.path.join(directory, TOKEN_COUNTS_FILE)
    with open(path, "w") as f:
        json.dump({"vocab_size": len(counts), "source": source, "total": int(sum(counts)),
                   "counts": [int(x) for x in counts]}, f, separators=(",", ":"))
    return path


def load_token_counts(directory: str, vocab_size: int | None = None) -> list[int]:
    """Read :data:`TOKEN_COUNTS_FILE` from a drafter checkpoint directory.

    Raises:
        FileNotFoundError: no such file (the message says how to write one).
        ValueError: malformed file, or its vocabulary size differs from ``vocab_size``.
    """
    path = os.path.join(directory, TOKEN_COUNTS_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"token frequencies are needed, but {path!r} does not exist; write it with vllm_specla's "
            f"`python examples/count_tokens.py --tokenizer <target> --text <corpus> --out {directory}`")
    try:
        with open(path) as f:
            raw = json.load(f)
        counts = [int(x) for x in raw["counts"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path!r} is not a token-counts file ({e})") from None
    if vocab_size is not None and len(counts) != vocab_size:
        raise ValueError(f"{path!r} counts {len(counts)} tokens but the target vocabulary has {vocab_size}")
    if any(c < 0 for c in counts) or not any(counts):
        raise ValueError(f"{path!r}: counts must be non-negative and not all zero")
    return counts


def check_ids(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``ids`` (a tensor, or a list / numpy array of ints) as ``[Vd]`` int64 after checking it is a draft vocabulary.

    Raises:
        ValueError: not integer ids, empty, not strictly ascending, or outside ``0..vocab_size-1``.
    """
    try:
        ids = torch.as_tensor(ids)
    except (TypeError, ValueError, RuntimeError):
        ids = None
    if ids is None or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"draft vocabulary ids must be strictly ascending integer ids in 0..{vocab_size - 1}")
    ids = ids.to(torch.int64).reshape(-1)
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size or \
            (ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all())):
        raise ValueError(f"draft vocabulary ids must be strictly ascending integer ids in 0..{vocab_size - 1}")
    return ids


class DraftHead:
    """The LM-head rows of a draft vocabulary (FR-Spec): draft logits and their target ids.

    Args:
        lm_head: the target's LM head weight ``[V', D]`` (``V' >= V``: vLLM pads the vocabulary);
            rows ``ids`` are copied once into a contiguous ``[Vd, D]`` weight of its dtype/device.
        ids: ``[Vd]`` int64 target token ids in ascending order (:func:`draft_vocab_ids`).
        vocab_size: the target vocabulary ``V``.
    Raises:
        ValueError: ``ids`` not strictly ascending or outside ``0..V-1`` (:func:`check_ids`).
    """

    def __init__(self, lm_head: torch.Tensor, ids: torch.Tensor, vocab_size: int):
        self.ids = check_ids(ids, vocab_size).to(lm_head.device).contiguous()
        self.weight = lm_head.detach().index_select(0, self.ids).contiguous()

    @property
    def size(self) -> int:
        """``Vd``."""
        return self.ids.numel()

    def to_target(self, draft_idx: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary indices (any shape, int) -> target token ids (same shape, int64)."""
        return self.ids[draft_idx]


def is_full_vocab(ids: torch.Tensor, vocab_size: int) -> bool:
    """True when ``ids`` is every token id (a draft vocabulary that changes nothing)."""
    return ids.numel() == vocab_size and bool((ids.cpu() == torch.arange(vocab_size)).all())


def draft_head(lm_head: torch.Tensor, ids: torch.Tensor | None, vocab_size: int) -> DraftHead | None:
    """A :class:`DraftHead` on ``lm_head``'s device, or None for no draft vocabulary (``ids`` None
    or every id: the full LM head then serves, with no copy of it)."""
    if ids is None or is_full_vocab(ids, vocab_size):
        return None
    return DraftHead(lm_head, ids.to(lm_head.device), vocab_size)


def draft_logits_fn(logits_fn, lm_head: torch.Tensor | None, ids: torch.Tensor, vocab_size: int):
    """A drafter's ``logits_fn(feats [N, D]) -> [N, V]`` restricted to a draft vocabulary: returns
    ``fn(feats) -> [N, Vd]`` fp32 logits over ``ids`` (in their order; the caller maps indices back
    through ``ids``, as ``SlotDrafter.draft_ids`` does).

    With the whole LM head on this process (``lm_head``: its unquantized weight, at least
    ``vocab_size`` rows; the caller passes None under tensor parallelism or quantization) only the
    ``Vd`` draft rows are read (:class:`DraftHead`, copied once: a later weight reload does not reach
    it); otherwise the full ``logits_fn`` runs and its ``ids`` columns are taken.

    Raises:
        ValueError: ``ids`` not strictly ascending ids in ``0..vocab_size-1``.
    """
    if lm_head is not None and lm_head.dim() == 2 and lm_head.shape[0] >= vocab_size and lm_head.is_floating_point():
        head = DraftHead(lm_head, ids, vocab_size)
        return lambda f: torch.nn.functional.linear(f.to(head.weight.dtype), head.weight).float()
    ids = check_ids(ids, vocab_size)
    cols: dict = {}  # device -> ids there (one copy, not one per call)

    def taken(f):
        lg = logits_fn(f)
        c = cols.get(lg.device)
        if c is None:
            c = cols[lg.device] = ids.to(lg.device)
        return lg.index_select(-1, c).float()

    return taken
