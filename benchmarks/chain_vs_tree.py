#!/usr/bin/env python
"""Chain vs tree on the embedded pair at equal verify budget (vLLM-free core, CPU, greedy, fp32).

"Equal verify budget" = the same number of draft nodes verified per step: a chain of K drafts vs
a tree of at most K draft nodes (depth <= K). Prints a table and writes JSON; mean accepted
length tau = tokens emitted per verify step incl. the bonus; nodes/step = drafts verified per step;
pruned fraction = 1 - kept / candidate nodes during tree expansion.

    python benchmarks/chain_vs_tree.py                   # writes benchmarks/chain_vs_tree_cpu.json
    python benchmarks/chain_vs_tree.py --out chain_vs_tree_mine.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flags import check_out  # noqa: E402
OUT = os.path.join(REPO, "benchmarks", "chain_vs_tree_cpu.json")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=OUT, help="write the JSON results here (overwritten; default: the committed "
                    "benchmarks/chain_vs_tree_cpu.json)")
    args = ap.parse_args()
    check_out(ap, "--out", args.out)
    from transformers import AutoTokenizer

    from vllm_specla.core.drafting import EagleDrafterRunner, TreeSpec
    from vllm_specla.data import mtbench_questions
    from vllm_specla.models.drafter import load_eagle_drafter
    from vllm_specla.models.gdn import load_fla_checkpoint
    from vllm_specla.runtime.engine import SpecLAEngine

    T = os.path.join(REPO, "models", "specla-gdn-tiny", "target")
    D = os.path.join(REPO, "models", "specla-gdn-tiny", "drafter")
    tok = AutoTokenizer.from_pretrained(T)
    qs = mtbench_questions()[::5]  # 16 prompts, 2 per category
    prompts = []
    for q in qs:
        ids = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], tokenize=True,
                                      add_generation_prompt=True, return_dict=False)
        prompts.append(list(ids["input_ids"]) if isinstance(ids, dict) else list(ids))
    target, drafter = load_fla_checkpoint(T), load_eagle_drafter(D)
    ar = SpecLAEngine(target, max_batch=16, eos_token_id=2).generate(prompts, 48)
    configs = [("chain", 4, None), ("tree", 4, TreeSpec(top_k=2, max_depth=4, node_budget=4)),
               ("tree", 4, TreeSpec(top_k=4, max_depth=4, node_budget=4)),
               ("chain", 8, None), ("tree", 8, TreeSpec(top_k=2, max_depth=6, node_budget=8)),
               ("tree", 8, TreeSpec(top_k=4, max_depth=4, node_budget=8, tau=6.0))]
    rows = []
    for topo, budget, spec in configs:
        K = budget if spec is None else spec.max_depth
        d = EagleDrafterRunner.for_target(drafter, target, 16)
        eng = SpecLAEngine(target, d, num_speculative_tokens=K, max_batch=16, eos_token_id=2, tree=spec)
        out = eng.generate(prompts, 48)
        st = eng.stats
        tc = getattr(d, "tree_counts", None)
        row = {"topology": topo, "verify_budget_drafts": budget, "K_or_depth": K,
               "top_k": spec.top_k if spec else 1, "tau_prune": spec.tau if spec else None,
               "mean_accepted_length": st.mean_acceptance_length,
               "draft_nodes_per_step": sum(st.num_drafts) / max(st.verify_steps, 1),  # (per verify step, as tau)
               "pruned_fraction": (1 - tc["kept"] / tc["candidates"]) if tc and tc["candidates"] else 0.0,
               "lossless_vs_ar": sum(a == b for a, b in zip(out, ar)), "prompts": len(prompts)}
        rows.append(row)
        print(row, flush=True)
    with open(args.out, "w") as f:
        json.dump({"model": "models/specla-gdn-tiny", "max_tokens": 48, "rows": rows}, f, indent=1)
    print("\n| topology | verify budget (drafts) | depth | top-k | tau prune | mean accepted length | drafts/step | pruned | lossless |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['topology']} | {r['verify_budget_drafts']} | {r['K_or_depth']} | {r['top_k']} | {r['tau_prune']} | "
              f"{r['mean_accepted_length']:.2f} | {r['draft_nodes_per_step']:.2f} | {r['pruned_fraction']:.2f} | "
              f"{r['lossless_vs_ar']}/{r['prompts']} |")


if __name__ == "__main__":
    main()
