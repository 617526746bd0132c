#!/usr/bin/env python
"""Acceptance of the embedded target + drafter through vLLM (CPU): K = 1..8, MT-Bench and
HumanEval, greedy and temperature 0.7. Prints a table and writes JSON.

    python benchmarks/acceptance.py --ks 1,2,3,4,5,6,7,8 --json benchmarks/acceptance_cpu.json

Measures (ALGORITHMS.md §9b), from vLLM's own spec-decode counters:
* mean acceptance length tau = 1 + accepted / verify steps (tokens per verify step incl. bonus);
* per-position acceptance rate r_i = accepted at position i / verify steps with a draft there
  (vLLM counts per position; verify steps near max_tokens carry fewer drafts, so the denominator
  is the number of steps that drafted position i, reconstructed as described in `_per_pos`);
* conditional acceptance alpha_i = r_i / r_{i-1} (r_0 = 1).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flags import check_out  # noqa: E402
MODEL = os.path.join(REPO, "models", "specla-gdn-tiny")


DATASETS = ("mtbench", "humaneval")


def _datasets(s: str) -> str:
    names = [d.strip() for d in s.split(",")]
    bad = [d for d in names if d not in DATASETS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{bad[0] if bad else s!r}: allowed datasets: {', '.join(DATASETS)}")
    return ",".join(names)


def _ks(s: str) -> list[int]:
    """``--ks``: comma-separated draft lengths, each an int in 1..16 (checked before any engine starts)."""
    try:
        ks = [int(k) for k in s.split(",")]
    except ValueError:
        ks = None
    if not ks or any(not 1 <= k <= 16 for k in ks):
        raise argparse.ArgumentTypeError(f"{s!r}: comma-separated ints in 1..16")
    return ks


def _temperatures(s: str) -> list[float]:
    """``--temperatures``: comma-separated finite numbers >= 0 (0 = greedy)."""
    try:
        ts = [float(t) for t in s.split(",")]
    except ValueError:
        ts = None
    if not ts or any(not (math.isfinite(t) and t >= 0) for t in ts):
        raise argparse.ArgumentTypeError(f"{s!r}: comma-separated finite numbers >= 0 (0 = greedy)")
    return ts


def _positive(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{s!r}: an int >= 1")
    return v


def prompts_for(dataset: str, tok, n: int | None):
    from vllm_specla.data import humaneval_problems, mtbench_questions

    if dataset == "mtbench":
        qs = [q["turns"][0] for q in mtbench_questions()]
        out = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
               for q in qs]
    else:
        out = [p["prompt"] for p in humaneval_problems()]  # raw code completion
    return out[:n] if n else out


def metrics(llm) -> dict:
    return {m.name: (m.values if hasattr(m, "values") else m.value) for m in llm.get_metrics()
            if m.name.startswith("vllm:spec_decode")}


def diff(a: dict, b: dict) -> dict:
    out = {}
    for k, v in b.items():
        if isinstance(v, list):
            prev = a.get(k) or [0] * len(v)
            out[k] = [x - y for x, y in zip(v, prev)]
        else:
            out[k] = (v or 0) - (a.get(k) or 0)
    return out


def summarize(m: dict, K: int) -> dict:
    steps = m.get("vllm:spec_decode_num_drafts", 0)
    acc = m.get("vllm:spec_decode_num_accepted_tokens", 0)
    per_pos = m.get("vllm:spec_decode_num_accepted_tokens_per_pos") or [0] * K
    rate = [a / steps if steps else float("nan") for a in per_pos]
    alpha = [rate[i] / (rate[i - 1] if i else 1.0) if (rate[i - 1] if i else 1.0) else float("nan")
             for i in range(len(rate))]
    return {"verify_steps": steps, "draft_tokens": m.get("vllm:spec_decode_num_draft_tokens", 0),
            "accepted_tokens": acc, "tau": 1 + acc / steps if steps else float("nan"),
            "per_position_rate": rate, "conditional_alpha": alpha}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ks", type=_ks, default="1,2,3,4,5,6,7,8")
    ap.add_argument("--datasets", type=_datasets, default="mtbench,humaneval",
                    help="comma-separated, from: " + ", ".join(DATASETS))
    ap.add_argument("--temperatures", type=_temperatures, default="0,0.7")
    ap.add_argument("--max-tokens", type=_positive, default=96)
    ap.add_argument("--num-prompts", type=_positive, default=None)
    ap.add_argument("--json", default=os.path.join(REPO, "benchmarks", "acceptance_cpu.json"),
                    help="write the JSON results here (overwritten; default: the committed "
                         "benchmarks/acceptance_cpu.json: give another path for a partial run)")
    args = ap.parse_args()
    check_out(ap, "--json", args.json)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import vllm_specla

    vllm_specla.register()
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    target, drafter = os.path.join(MODEL, "target"), os.path.join(MODEL, "drafter")
    tok = AutoTokenizer.from_pretrained(target)
    data = {d: prompts_for(d, tok, args.num_prompts) for d in args.datasets.split(",")}
    results = []
    for K in args.ks:
        t0 = time.time()
        llm = LLM(model=target, dtype="float32", enforce_eager=True, max_model_len=2048, max_num_seqs=16,
                  gpu_memory_utilization=0.15, disable_log_stats=False, seed=0,
                  speculative_config={"method": "specla", "num_speculative_tokens": K, "drafter": drafter})
        for ds, prompts in data.items():
            for temp in args.temperatures:
                before = metrics(llm)
                sp = SamplingParams(temperature=temp, max_tokens=args.max_tokens, seed=0 if temp > 0 else None)
                t1 = time.time()
                outs = llm.generate(prompts, sp, use_tqdm=False)
                el = time.time() - t1
                s = summarize(diff(before, metrics(llm)), K)
                s.update(K=K, dataset=ds, temperature=temp, prompts=len(prompts),
                         output_tokens=sum(len(o.outputs[0].token_ids) for o in outs), seconds=el)
                results.append(s)
                print(f"K={K} {ds:9s} T={temp:.1f}  tau={s['tau']:.2f}  alpha=" +
                      " ".join(f"{a:.2f}" for a in s["conditional_alpha"]) + f"  ({el:.0f}s)", flush=True)
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        print(f"# K={K} done in {time.time() - t0:.0f}s", flush=True)
    with open(args.json, "w") as f:
        json.dump({"model": "models/specla-gdn-tiny", "max_tokens": args.max_tokens, "dtype": "float32",
                   "machine": "CPU (vLLM-CPU 0.32)", "results": results}, f, indent=1)
    print("\n| K | dataset | T | tau | mean alpha | per-position rate |\n|---|---|---|---|---|---|")
    for s in results:
        ma = sum(s["conditional_alpha"]) / len(s["conditional_alpha"])
        print(f"| {s['K']} | {s['dataset']} | {s['temperature']} | {s['tau']:.2f} | {ma:.2f} | "
              + " ".join(f"{r:.2f}" for r in s["per_position_rate"]) + " |")


if __name__ == "__main__":
    main()
