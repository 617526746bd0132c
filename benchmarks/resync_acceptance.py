#!/usr/bin/env python
"""What the drafter's resync window costs in acceptance (CPU, vLLM-free engine, embedded pair).

Under ``num_speculative_tokens: "auto"`` a K = 0 step holds each request's drafter inputs back
(``runtime/engine.py`` ``hold_or_absorb``). With ``LAZY_RESYNC_WINDOW`` = W a request holding more
than min(2 W, ``LAZY_ABSORB_MAX``) inputs keeps only its last W and restarts its drafter slot from
them (K = 0 steps never run the drafter; resuming absorbs at most 2 W held inputs per request); with
None it is absorbed alone past ``LAZY_ABSORB_MAX`` (the drafter's state sees every token). This
script decodes MT-Bench prompts greedily with a scripted K per step (K = 0 for the first
``--hold-steps`` steps of the run, then ``--k``; with ``--prompts`` <= ``--batch`` every request is
held over those steps) and reports, per W, the acceptance length tau over the drafting steps, the
drafter's absorbed tokens and wall time, and that every output equals AR.

    python benchmarks/resync_acceptance.py --prompts 16 --cap 256 --windows none,0,8,16,32,64 \
        --json benchmarks/resync_acceptance_cpu_s40.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flags import check_out  # noqa: E402
MODEL = os.path.join(REPO, "models", "specla-gdn-tiny")


class Schedule:
    """A draft-length policy stand-in: K = 0 for ``hold`` steps, then ``k`` (engine interface)."""

    def __init__(self, hold: int, k: int):
        self.hold, self.k_max, self.i = hold, k, 0

    def choose(self, batch_size: int) -> int:
        self.i += 1
        return 0 if self.i <= self.hold else self.k_max

    def observe_step(self, *a):
        pass

    def observe_draft(self, *a):
        pass

    def observe_acceptance(self, *a):
        pass

    def summary(self):
        return {"steps": self.i}


MT_BENCH_QUESTIONS = 80  # (vllm_specla.data.mtbench_questions(); a constant, so a bad flag needs no data download)
K_MAX = 64  # as SpecLAEngine bounds an int K ("auto"'s K_max too); the Schedule policy here sizes the banks at K


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad flags before the models load (``ap.error``: one line naming the flag, exit 2); parses
    ``args.windows`` into a list of ints / None. Bounds: a request is decoded for ``--max-tokens`` >= 1 tokens
    from ``--prompts`` questions (1 .. 80: MT-Bench's first turns) in ``--batch`` >= 1 state slots; ``--k`` >= 1
    drafts per step after ``--hold-steps`` >= 0 held ones (K = 0 throughout would measure no drafting at all);
    ``--cap`` >= 1 held inputs (the engine keeps min(W, cap) of them); a window is an int >= 0 or none
    (``hold_or_absorb``)."""
    for flag, v, lo, hi in (("--prompts", args.prompts, 1, MT_BENCH_QUESTIONS),
                            ("--max-tokens", args.max_tokens, 1, None), ("--batch", args.batch, 1, None),
                            ("--k", args.k, 1, K_MAX),
                            ("--hold-steps", args.hold_steps, 0, None), ("--cap", args.cap, 1, None)):
        if v < lo or (hi is not None and v > hi):
            ap.error(f"{flag}: must be an int {f'>= {lo}' if hi is None else f'in {lo}..{hi}'}, got {v}")
    windows = [w.strip() for w in args.windows.split(",")]
    try:
        args.windows = [None if w == "none" else int(w) for w in windows]
    except ValueError:
        args.windows = None
    if args.windows is None or any(w is not None and w < 0 for w in args.windows):
        ap.error(f"--windows: comma-separated ints >= 0 or 'none', got {','.join(windows)!r}")
    check_out(ap, "--json", args.json)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16, help="first N MT-Bench questions (first turn)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--batch", type=int, default=16, help="state slots (requests decoded together)")
    ap.add_argument("--k", type=int, default=4, help="draft tokens per step after the held steps")
    ap.add_argument("--hold-steps", type=int, default=24, help="K = 0 steps at the start")
    ap.add_argument("--cap", type=int, default=256, help="LAZY_ABSORB_MAX for the run (256: the default)")
    ap.add_argument("--windows", default="none,0,8,32,64", help="LAZY_RESYNC_WINDOW values ('none' = absorb)")
    ap.add_argument("--json", default=None, help="write the rows here as a JSON list")
    args = ap.parse_args()
    check_args(ap, args)

    from transformers import AutoTokenizer

    import vllm_specla.runtime.engine as engine_mod
    from vllm_specla.core.drafting import EagleDrafterRunner
    from vllm_specla.data import mtbench_questions
    from vllm_specla.models.drafter import load_eagle_drafter
    from vllm_specla.models.gdn import load_fla_checkpoint

    torch.set_num_threads(os.cpu_count() or 1)
    tok = AutoTokenizer.from_pretrained(os.path.join(MODEL, "target"))
    qs = [q["turns"][0] for q in mtbench_questions()][: args.prompts]
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                  add_generation_prompt=True), add_special_tokens=False) for q in qs]
    target = load_fla_checkpoint(os.path.join(MODEL, "target"))
    drafter = load_eagle_drafter(os.path.join(MODEL, "drafter"))
    ar = engine_mod.SpecLAEngine(target, max_batch=args.batch).generate(prompts, args.max_tokens)

    engine_mod.LAZY_ABSORB_MAX = args.cap
    rows = []
    for win in args.windows:
        engine_mod.LAZY_RESYNC_WINDOW = win
        runner = EagleDrafterRunner.for_target(drafter, target, args.batch)
        absorbed = {"tokens": 0, "calls": 0, "seconds": 0.0}
        step = runner.step

        def counting_step(rs, step=step, absorbed=absorbed):
            absorbed["calls"] += 1
            absorbed["tokens"] += sum(len(r.tokens) for r in rs)
            t0 = time.perf_counter()
            out = step(rs)
            absorbed["seconds"] += time.perf_counter() - t0
            return out

        runner.step = counting_step
        eng = engine_mod.SpecLAEngine(target, runner, num_speculative_tokens=Schedule(args.hold_steps, args.k),
                                      max_batch=args.batch)
        t0 = time.perf_counter()
        out = eng.generate(prompts, args.max_tokens)
        wall = time.perf_counter() - t0
        st = eng.stats
        drafted = [(d, a) for d, a in zip(st.num_drafts, st.num_accepted) if d > 0]
        row = {"window": win, "cap": args.cap, "k": args.k, "hold_steps": args.hold_steps, "batch": args.batch,
               "prompts": len(prompts), "max_tokens": args.max_tokens,
               "tau": 1 + sum(a for _, a in drafted) / max(1, len(drafted)), "verify_steps": len(drafted),
               "drafter_calls": absorbed["calls"], "drafter_tokens": absorbed["tokens"],
               "drafter_s": round(absorbed["seconds"], 3), "wall_s": round(wall, 3),
               "lossless": out == ar}
        rows.append(row)
        print(json.dumps(row), flush=True)
    engine_mod.LAZY_RESYNC_WINDOW = None
    print(f"\n{'window':>7} {'tau':>6} {'verify steps':>12} {'drafter tokens':>14} {'drafter s':>9} {'lossless':>8}")
    for r in rows:
        print(f"{str(r['window']):>7} {r['tau']:6.3f} {r['verify_steps']:12d} {r['drafter_tokens']:14d} "
              f"{r['drafter_s']:9.2f} {str(r['lossless']):>8}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
