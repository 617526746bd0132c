#!/usr/bin/env python
"""Tree drafting: the tree builder of a git revision against the working tree's, side by side in one
run (vLLM-free core, CPU, greedy, fp32, the embedded trained pair, 16 MT-Bench prompts, 48 tokens).

Session 26 replaced level-by-level budget filling with best-first selection over the whole candidate
pool (``core/drafting.py`` ``SlotDrafter.step_tree``); ``--rev`` names the revision whose
``step_tree`` is the "old" arm (default: the commit before that change). Prints one line per
(config, builder) and writes JSON: mean acceptance length (tokens per verify step incl. the bonus),
draft nodes verified per step, and how many outputs equal AR.

Usage: ``.venv/bin/python benchmarks/tree_builder_ab.py --out benchmarks/tree_builder_cpu_s26.json``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def old_step_tree(rev: str):
    """``SlotDrafter.step_tree`` as of ``rev`` (its module loaded from ``git show``)."""
    src = subprocess.run(["git", "-C", REPO, "show", f"{rev}:vllm_specla/core/drafting.py"], check=True,
                         capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("drafting_at_rev", f.name)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["drafting_at_rev"] = mod  # (dataclasses look the module up)
    spec.loader.exec_module(mod)
    os.unlink(f.name)
    return mod.SlotDrafter.step_tree


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rev", default="de2f852", help="git revision of the old builder")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from vllm_specla.core import drafting
    from vllm_specla.core.drafting import EagleDrafterRunner, TreeSpec
    from vllm_specla.data import mtbench_questions
    from vllm_specla.models.drafter import load_eagle_drafter
    from vllm_specla.models.gdn import load_fla_checkpoint
    from vllm_specla.runtime.engine import SpecLAEngine

    builders = [("old", old_step_tree(args.rev)), ("new", drafting.SlotDrafter.step_tree)]
    T = os.path.join(REPO, "models", "specla-gdn-tiny", "target")
    D = os.path.join(REPO, "models", "specla-gdn-tiny", "drafter")
    tok = AutoTokenizer.from_pretrained(T)
    prompts = []
    for q in mtbench_questions()[::5]:  # 16 prompts, 2 per category
        ids = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], tokenize=True,
                                      add_generation_prompt=True, return_dict=False)
        prompts.append(list(ids["input_ids"]) if isinstance(ids, dict) else list(ids))
    target, drafter = load_fla_checkpoint(T), load_eagle_drafter(D)
    ar = SpecLAEngine(target, max_batch=16, eos_token_id=2).generate(prompts, args.max_tokens)
    configs = [("top-4, 16 nodes, K = 4 (vLLM defaults)", TreeSpec(top_k=4, max_depth=4, node_budget=16)),
               ("top-4, 16 nodes, K = 6", TreeSpec(top_k=4, max_depth=6, node_budget=16)),
               ("top-2, 8 nodes, K = 4", TreeSpec(top_k=2, max_depth=4, node_budget=8)),
               ("top-4, 8 nodes, K = 4, prune_tau 6", TreeSpec(top_k=4, max_depth=4, node_budget=8, tau=6.0))]
    rows = []
    try:
        for name, spec in configs:
            for which, fn in builders:
                drafting.SlotDrafter.step_tree = fn
                d = EagleDrafterRunner.for_target(drafter, target, 16)
                eng = SpecLAEngine(target, d, num_speculative_tokens=spec.max_depth, max_batch=16, eos_token_id=2,
                                   tree=spec)
                out = eng.generate(prompts, args.max_tokens)
                st = eng.stats
                row = {"config": name, "builder": which, "top_k": spec.top_k, "node_budget": spec.node_budget,
                       "K": spec.max_depth, "prune_tau": spec.tau,
                       "mean_acceptance_length": round(st.mean_acceptance_length, 3),
                       "draft_nodes_per_step": round(sum(st.num_drafts) / max(st.verify_steps, 1), 2),  # (as tau)
                       "lossless_vs_ar": f"{sum(a == b for a, b in zip(out, ar))}/{len(prompts)}"}
                rows.append(row)
                print(f"{name:40s} {which:4s} tau {row['mean_acceptance_length']:.3f}  nodes/step "
                      f"{row['draft_nodes_per_step']:5.2f}  lossless {row['lossless_vs_ar']}", flush=True)
    finally:
        drafting.SlotDrafter.step_tree = builders[1][1]
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rev_old": args.rev, "prompts": len(prompts), "max_tokens": args.max_tokens, "rows": rows}, f,
                      indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
