"""Flag checks shared by the benchmark scripts: a bad value stops the script before any model loads, kernel builds
or engine starts, with one argparse-style line (``ap.error``: exit 2) that names the flag and what it allows -- not
a traceback deep in a run, a run on nothing, or results lost after the run.

The scripts run as ``python benchmarks/NAME.py`` (their folder is ``sys.path[0]``) or through ``runpy.run_path``
(``h200_next_session.sh``), which does not put the script's folder on ``sys.path``: each script that imports this as
``_flags`` inserts its own folder first.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Sequence


def _sep_name(sep: str) -> str:
    return "comma" if sep == "," else repr(sep)


def parse_list(ap: argparse.ArgumentParser, flag: str, text: str, *, kind: Callable = int, lo: float | None = 1,
               hi: float | None = None, choices: Sequence[str] | None = None, allow_empty: bool = False,
               sep: str = ",") -> list:
    """``flag``'s ``sep``-separated value ``text`` as a list (blank items dropped): numbers of ``kind`` (``int`` or
    ``float``; floats must be finite) in ``[lo, hi]`` (``None``: unbounded on that side), names from ``choices``, or
    with ``kind=str`` the names as given (the script checks them itself; ``lo`` / ``hi`` unused).

    Calls ``ap.error`` (exit 2, one line naming ``flag`` and the allowed values) on an empty list (unless
    ``allow_empty``), an item that is not a number of ``kind``, a number outside ``[lo, hi]`` or a name outside
    ``choices``.
    """
    items = [s.strip() for s in text.split(sep) if s.strip()]
    if not items and not allow_empty:
        ap.error(f"{flag}: give at least one value, got {text!r}")
    if choices is not None:
        bad = [s for s in items if s not in choices]
        if bad:
            ap.error(f"{flag}: unknown {', '.join(bad)}; allowed: {', '.join(choices)}")
        return items
    if kind is str:
        return items
    try:
        vals = [kind(s) for s in items]
    except ValueError:
        vals = None
    ok = vals is not None and all((kind is not float or math.isfinite(v)) and (lo is None or v >= lo)
                                  and (hi is None or v <= hi) for v in vals)
    if not ok:
        what = {int: "integers", float: "finite numbers"}.get(kind, kind.__name__)
        rng = (f" in [{lo}, {hi}]" if lo is not None and hi is not None else f" >= {lo}" if lo is not None
               else f" <= {hi}" if hi is not None else "")
        ap.error(f"{flag}: expected {_sep_name(sep)}-separated {what}{rng}, got {text!r}")
    return vals


def parse_tuple(ap: argparse.ArgumentParser, flag: str, text: str, length: int, *,
                lo: int | Sequence[int] = 1, sep: str = ",", what: str = "") -> tuple[int, ...]:
    """``text`` as exactly ``length`` integers, ``sep``-separated (e.g. ``--heads 6,256,512``; ``what`` names them
    in the error: ``"H,K,V"``), each >= ``lo`` (one bound for all, or one per entry). Calls ``ap.error`` naming
    ``flag`` otherwise."""
    los = tuple(lo) if isinstance(lo, Sequence) else (lo,) * length
    try:
        vals = tuple(int(s) for s in text.strip().split(sep))
    except ValueError:
        vals = ()
    if len(vals) != length or any(v < b for v, b in zip(vals, los)):
        bound = f">= {lo}" if len(set(los)) == 1 else "each >= " + sep.join(map(str, los))
        ap.error(f"{flag}: expected {length} {_sep_name(sep)}-separated integers {bound}"
                 f"{f' ({what})' if what else ''}, got {text!r}")
    return vals


def check_out(ap: argparse.ArgumentParser, flag: str, path: str | None) -> None:
    """Refuse (``ap.error``) an output file ``path`` whose folder does not exist or that is a folder itself, before
    the run (the results would be lost after it). ``None`` / ``""`` (no output) passes."""
    if not path:
        return
    if os.path.isdir(path):
        ap.error(f"{flag} {path}: is a folder, not a file name")
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        ap.error(f"{flag} {path}: its folder does not exist (the results would be lost after the run)")
