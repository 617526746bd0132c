"""Summarise Nsight Compute's per-SASS-instruction warp-stall samples (a report's source page as CSV).

Input: ``ncu -i REPORT.ncu-rep --page source --csv --print-source sass > FILE.csv`` of a report taken with
``--section SourceCounters --section WarpStateStats`` (``benchmarks/h200_next_session.sh`` s20a / s20b). For
each kernel in the file it prints the warp-stall samples summed by reason (``stall_long_sb``: waiting on a
global / local memory result, ``stall_selected``: issuing, ...; the reasons are Nsight Compute's, see its
"Warp Stall Reasons" table) and the ``--top`` instructions with the most samples of ``--reason``, with their
execution counts (a loop body's instructions execute tokens x warps times), so a dependency that stalls
every loop iteration shows as one instruction. Writes the same as JSON to ``--out`` if given.

Usage: ``python benchmarks/ncu_sass_stalls.py ncu_s20a_sass.csv --reason stall_long_sb --top 8``
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import sys


def read_kernels(path: str) -> list[dict]:
    """The CSV's kernels: ``[{"name", "header", "rows"}]``, one per "Kernel Name" block (rows: lists of
    strings, one per SASS instruction, in the header's column order). Raises ValueError when the file holds
    no kernel block or a block has no header row (not a ``--page source --csv`` export)."""
    kernels: list[dict] = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                kernels.append({"name": row[1], "header": None, "rows": []})
            elif not kernels:
                continue
            elif row[0] == "Address":
                kernels[-1]["header"] = row
            else:
                kernels[-1]["rows"].append(row)
    if not kernels or any(k["header"] is None for k in kernels):
        raise ValueError(f"{path}: no kernel block with a header row; expected `ncu --page source --csv "
                         "--print-source sass` output")
    return kernels


def _int(s: str) -> int:
    try:
        return int(s.replace(",", "")) if s else 0
    except ValueError:
        return 0


def summarise(kernel: dict, reason: str, top: int) -> dict:
    """Samples by stall reason (all samples, issued or not), total samples and executed instructions, and
    the ``top`` instructions by ``reason`` (address, SASS text, that reason's samples, all samples,
    executions). Raises ValueError when ``reason`` is not a column of the export."""
    idx = {n: i for i, n in enumerate(kernel["header"])}
    if reason not in idx:
        allowed = sorted(n for n in idx if n.startswith("stall_") and "(Not" not in n)
        raise ValueError(f"--reason {reason!r} is not a column of this export; one of: {', '.join(allowed)}")
    reasons = [n for n in idx if n.startswith("stall_") and "(Not" not in n]
    by_reason: collections.Counter = collections.Counter()
    samples = executed = 0
    for r in kernel["rows"]:
        samples += _int(r[idx["Warp Stall Sampling (All Samples)"]])
        executed += _int(r[idx["Instructions Executed"]])
        for n in reasons:
            by_reason[n] += _int(r[idx[n]])
    ranked = sorted(kernel["rows"], key=lambda r: -_int(r[idx[reason]]))[:top]
    return {
        "kernel": kernel["name"], "samples": samples, "instructions_executed": executed,
        "sass_lines": len(kernel["rows"]),
        "by_reason": {n: v for n, v in by_reason.most_common() if v},
        "top": [{"address": r[idx["Address"]], "sass": r[idx["Source"]].strip(), reason: _int(r[idx[reason]]),
                 "samples": _int(r[idx["Warp Stall Sampling (All Samples)"]]),
                 "executed": _int(r[idx["Instructions Executed"]])} for r in ranked if _int(r[idx[reason]])],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--reason", default="stall_long_sb", help="stall column to rank instructions by")
    ap.add_argument("--top", type=int, default=6, help="instructions to list per kernel")
    ap.add_argument("--out", default=None, help="also write the summary as JSON here")
    args = ap.parse_args()
    if args.top < 0:
        raise SystemExit(f"--top must be >= 0, got {args.top}")
    try:
        res = [summarise(k, args.reason, args.top) for k in read_kernels(args.csv)]
    except (OSError, ValueError) as e:
        raise SystemExit(str(e)) from None
    for s in res:
        print(f"{s['kernel'][:100]}\n  samples {s['samples']}, instructions executed {s['instructions_executed']}, "
              f"{s['sass_lines']} SASS lines")
        print("  " + ", ".join(f"{n[6:]} {v} ({v / max(s['samples'], 1):.0%})" for n, v in s["by_reason"].items()))
        for t in s["top"]:
            print(f"    {t['address']}  {t['sass'][:64]:64s} {args.reason[6:]} {t[args.reason]:5d}  "
                  f"all {t['samples']:5d}  executed {t['executed']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
