"""Plot speedup vs batch from ``bench_e2e.py`` JSON lines (matplotlib; run on any machine).

One panel per shape; x = batch (log2), y = speedup over AR measured in the same run. Lines: SpecLA
at each alpha with the best K of the grid, SpecLA with the automatic draft-length policy
(``mode == "specla-auto"`` records), and the per-token-snapshot baseline. Also prints a markdown
table (best K per shape, batch, alpha) for benchmarks/RESULTS.md.

Usage: ``python benchmarks/plot_e2e.py benchmarks/e2e_h200.jsonl --png benchmarks/e2e_speedup.png``
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap
from collections import defaultdict


SHAPES = ("flame", "map", "tiny")  # the shapes plotted (bench_e2e.py SHAPES; --trained records are not plotted)
SPEEDUP_KEYS = ("mode", "batch", "K", "tau", "tokens_per_s")  # what the table and plot read of a timed record


def load(path: str) -> list[dict]:
    """The records of a ``bench_e2e.py --out`` file: JSON lines, one object per line (blank lines skipped).

    Raises:
        OSError: the file cannot be read. ValueError (naming the line): a line that is not a JSON object, or a
        timed record (one with ``speedup``) of a plotted shape without a key the table reads.
    """
    recs = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line.strip())
            except json.JSONDecodeError as e:
                raise ValueError(f"line {i}: not JSON ({e.msg} at column {e.colno}); expected bench_e2e.py JSON "
                                 "lines, one record object per line") from None
            if not isinstance(r, dict):
                raise ValueError(f"line {i}: expected a JSON object (one bench_e2e.py record per line), "
                                 f"got {type(r).__name__}")
            if r.get("shape") in SHAPES and "speedup" in r:
                need = SPEEDUP_KEYS + (("alpha",) if r.get("mode") in ("specla", "snapshot", "specla-auto") else ())
                missing = [k for k in need if k not in r]
                if missing:
                    raise ValueError(f"line {i}: a {r.get('shape')} record with a speedup needs {', '.join(need)}; "
                                     f"it has no {', '.join(missing)}")
            recs.append(r)
    return recs


def best_k(recs, shape, mode="specla"):
    """{(alpha, batch): record with the highest speedup} over K."""
    out = {}
    for r in recs:
        if r.get("shape") != shape or r.get("mode") != mode or "speedup" not in r:
            continue
        key = (r["alpha"], r["batch"])
        if key not in out or r["speedup"] > out[key]["speedup"]:
            out[key] = r
    return out


def panel_title(shape: str, recs: list[dict], label: str = "") -> str:
    """A panel's title: the shape, the GPU(s) the records name (``gpu``), the setting, and ``label``."""
    gpus = sorted({r["gpu"] for r in recs if r.get("shape") == shape and r.get("gpu")}) or ["GPU not recorded"]
    title = f"{shape}: {', '.join(gpus)}, CUDA graphs, greedy, acceptance-controlled drafter"
    return f"{title}; {label}" if label else title


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    ap.add_argument("--png", default=None)
    ap.add_argument("--label", default="", help="appended to each panel's title (e.g. the run / session)")
    args = ap.parse_args()
    if args.png and os.path.isdir(args.png):
        ap.error(f"--png {args.png}: is a folder, not a file name")
    if args.png and not os.path.isdir(os.path.dirname(os.path.abspath(args.png))):
        ap.error(f"--png {args.png}: its folder does not exist")
    try:
        recs = load(args.jsonl)
    except OSError as e:
        ap.error(f"jsonl {args.jsonl}: cannot read it ({type(e).__name__}: {e})")
    except ValueError as e:  # (also a file that is not UTF-8 text)
        ap.error(f"jsonl {args.jsonl}: {e}")
    shapes = [s for s in SHAPES if any(r.get("shape") == s for r in recs)]
    if not shapes:
        ap.error(f"jsonl {args.jsonl}: no bench_e2e.py records of shape {', '.join(SHAPES)} (the shapes plotted), "
                 f"got {len(recs)} records")
    print("| shape | B | alpha | best K | tau | SpecLA tok/s | AR tok/s | speedup | auto K | auto speedup |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ar = {(r["shape"], r["batch"]): r for r in recs if r.get("mode") == "ar"}
    # (timed runs only: --trained auto records have no alpha, an out-of-memory skip no speedup)
    auto = {(r["shape"], r["alpha"], r["batch"]): r for r in recs if r.get("mode") == "specla-auto" and "speedup" in r
            and r.get("shape") in SHAPES}
    for s in shapes:
        bk = best_k(recs, s)
        for (a, B), r in sorted(bk.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            au = auto.get((s, a, B))
            au_k, au_s = (str(au["K"]), f"{au['speedup']:.2f}") if au else ("-", "-")
            ar_tps = ar.get((s, B), {}).get("tokens_per_s")  # (None: no timed AR record of this batch in the file)
            print(f"| {s} | {B} | {a} | {r['K']} | {r['tau']:.2f} | {r['tokens_per_s']:.0f} | "
                  f"{'-' if ar_tps is None else f'{ar_tps:.0f}'} | {r['speedup']:.2f} | {au_k} | {au_s} |")
    if not args.png:
        return
    try:
        import matplotlib  # noqa: PLC0415
    except ImportError:
        ap.error("--png needs matplotlib (pip install matplotlib; `make setup` installs it); the table above needs "
                 "nothing")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.2), squeeze=False)
    for ax, s in zip(axes[0], shapes):
        bk = best_k(recs, s)
        lines = defaultdict(list)
        ks = sorted({r["K"] for r in recs if r.get("shape") == s and r.get("mode") == "specla"})
        which = f"K={ks[0]}" if len(ks) == 1 else f"best K of {ks}"
        for (a, B), r in bk.items():
            lines[f"SpecLA, alpha={a}, {which}"].append((B, r["speedup"]))
        for r in recs:
            if r.get("shape") == s and r.get("mode") == "specla-auto" and "speedup" in r:
                lines[f"SpecLA auto K, alpha={r['alpha']}"].append((r["batch"], r["speedup"]))
            if r.get("shape") == s and r.get("mode") == "snapshot" and "speedup" in r:
                lines[f"snapshots, K={r['K']}, alpha={r['alpha']}"].append((r["batch"], r["speedup"]))
        for name, pts in sorted(lines.items()):
            pts.sort()
            style = "--" if "snapshot" in name else (":" if "auto" in name else "-")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=name)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch (requests)")
        ax.set_ylabel("speedup over AR (tokens/s)")
        ax.set_title(textwrap.fill(panel_title(s, recs, args.label), 90), fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
