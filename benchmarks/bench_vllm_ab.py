#!/usr/bin/env python
"""A/B of vLLM engines on this machine: several engines alive in one process, ``generate()`` on the
80 MT-Bench prompts alternated round by round, so machine-wide drift (this shared 2-core CPU moves
by 10-20 % between runs) hits every engine alike. Prints a table and writes JSON.

    python benchmarks/bench_vllm_ab.py --rounds 4 --engine ar=none \\
        --engine auto='{"method": "specla", "num_speculative_tokens": "auto", "drafter": "models/specla-gdn-tiny/drafter"}' \\
        --engine k0=<same json>:force_k=0 --json-out benchmarks/vllm_ab_cpu.json

``--engine NAME=SPEC[:force_k=K][:resync=W]``: SPEC is ``none`` (AR), a speculative-config JSON file
or inline JSON. ``force_k=K`` (``"auto"`` configs only) replaces the draft-length policy's choice by K
every step (a diagnostic: ``force_k=0`` is the spec-decode path with the drafter never drafting).
``resync=W`` sets the worker's ``runtime.engine.LAZY_RESYNC_WINDOW`` (an int: a request holding
more than 2 W inputs over K = 0 steps keeps its last W and restarts its drafter slot; ``none``: the
old rule, absorbed alone past ``LAZY_ABSORB_MAX``).
The first engine is the baseline of the ratios. Rounds alternate the engine order (1, 2, 3 then 3, 2,
1). Greedy, fp32, max_tokens 96, the embedded default model; outputs are checked identical to the
baseline's (the script exits 1 when one differs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _flags import check_out  # noqa: E402


class FixedK:
    """A draft-length policy stand-in that always answers ``k`` (``force_k``)."""

    def __init__(self, policy, k: int):
        self.policy, self.k = policy, k

    def choose(self, batch_size: int) -> int:
        return self.k if batch_size else 0

    def __getattr__(self, name):  # observe_*, summary, ... go to the real policy
        return getattr(self.policy, name)


def _force_k(worker, k: int) -> int:
    """(collective_rpc) make the worker's SpecLA proposer draft ``k`` per step."""
    proposer = worker.model_runner.drafter
    if getattr(proposer, "policy", None) is None:
        raise ValueError("force_k needs a num_speculative_tokens: \"auto\" config")
    proposer.policy = FixedK(proposer.policy, k)
    return k


def _set_resync(worker, w: int | None) -> int | None:
    """(collective_rpc) set ``LAZY_RESYNC_WINDOW`` in the worker's process."""
    import vllm_specla.runtime.engine as engine_mod  # noqa: PLC0415

    engine_mod.LAZY_RESYNC_WINDOW = w
    return w


def _policy_describe(worker) -> dict | None:
    """(collective_rpc) the worker's draft-length policy model (``DraftLengthPolicy.describe``)."""
    policy = getattr(worker.model_runner.drafter, "policy", None)
    return policy.describe() if policy is not None else None


def _k_diff(now: dict | None, before: dict | None) -> dict:
    """Per-batch-bucket K counts of one round: cumulative ``chosen_by_batch`` now minus before."""
    out = {}
    for b, row in (now or {}).items():
        prev = (before or {}).get(b, {})
        d = {k: n - prev.get(k, 0) for k, n in row.items() if n - prev.get(k, 0)}
        if d:
            out[str(b)] = {str(k): n for k, n in d.items()}
    return out


def parse_engine(arg: str) -> tuple[str, dict | None, dict]:
    name, sep, rest = arg.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--engine {arg!r}: expected NAME=SPEC[:force_k=K][:resync=W]")
    opts: dict = {}
    while True:
        head, _, tail = rest.rpartition(":")
        key, eq, val = tail.partition("=")
        if not head or not eq or key not in ("force_k", "resync"):
            break
        try:
            opts[key] = None if key == "resync" and val == "none" else int(val)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--engine {name}: {key} must be an integer"
                                             f"{' or none' if key == 'resync' else ''}, got {val!r}") from None
        rest = head
    opts = dict(reversed(opts.items()))  # as given, left to right
    if opts.get("resync") is not None and opts["resync"] < 0:
        raise argparse.ArgumentTypeError(f"--engine {name}: resync must be an int >= 0 or none, got {opts['resync']}")
    if rest == "none":
        if "force_k" in opts:
            raise argparse.ArgumentTypeError(f"--engine {name}: force_k needs a num_speculative_tokens: \"auto\" "
                                             "config, got none (AR)")
        return name, None, opts
    from vllm_specla.config import is_inline_json
    from vllm_specla.worker.patches import load_spec_file

    if not is_inline_json(rest) and not os.path.isfile(rest):  # (was json.loads' "Expecting value: line 1 column 1")
        raise argparse.ArgumentTypeError(f"--engine {name}: SPEC {rest!r} is no file here; SPEC is none, a JSON file "
                                         "or inline JSON")
    try:
        spec = load_spec_file(rest) if os.path.isfile(rest) else json.loads(rest)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--engine {name}: SPEC is none, a JSON file or inline JSON ({e})") from None
    if not isinstance(spec, dict):
        raise argparse.ArgumentTypeError(f"--engine {name}: SPEC must be a JSON object, got {type(spec).__name__}")
    if "force_k" in opts:  # (the worker refused it only after the engine's start)
        from vllm_specla.config import DEFAULT_MAX_AUTO_K

        norm = {str(k).replace("-", "_"): v for k, v in spec.items()}  # (hyphenated keys, as vLLM takes them)
        k_max = norm.get("max_num_speculative_tokens")
        if str(norm.get("num_speculative_tokens")).strip().lower() != "auto":
            raise argparse.ArgumentTypeError(f"--engine {name}: force_k needs a num_speculative_tokens: \"auto\" "
                                             f"config, got {norm.get('num_speculative_tokens')!r}")
        if k_max is None:
            k_max = DEFAULT_MAX_AUTO_K
        if isinstance(k_max, bool) or not isinstance(k_max, int):  # (the engine names it; force_k needs the int)
            raise argparse.ArgumentTypeError(f"--engine {name}: max_num_speculative_tokens must be an int for force_k, "
                                             f"got {k_max!r}")
        if not 0 <= opts["force_k"] <= k_max:
            raise argparse.ArgumentTypeError(f"--engine {name}: force_k must be in 0..{k_max} "
                                             f"(max_num_speculative_tokens), got {opts['force_k']}")
    for key in ("drafter", "model"):  # ("model": vLLM's name for the drafter, taken as "drafter")
        d = spec.get(key)
        if isinstance(d, str) and not os.path.isabs(d) and not os.path.exists(d):
            spec[key] = os.path.join(REPO, d)
    return name, spec, opts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", action="append", required=True, type=parse_engine,
                    help="NAME=SPEC[:force_k=K][:resync=W] (repeat)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=80)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--single-stream", type=int, default=0,
                    help="time the first N prompts one request at a time instead of all at once")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    names = [n for n, _, _ in args.engine]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:  # (their timings went into one list, compared with themselves)
        ap.error(f"--engine: names must differ, got {', '.join(dup)} more than once")
    for flag, v, lo, hi in (("--rounds", args.rounds, 1, None), ("--num-prompts", args.num_prompts, 1, 80),
                            ("--max-tokens", args.max_tokens, 1, None), ("--max-num-seqs", args.max_num_seqs, 1, None),
                            ("--single-stream", args.single_stream, 0, None)):
        if v < lo or (hi is not None and v > hi):  # (--num-prompts: MT-Bench's 80 questions; 81 ran 80 silently)
            ap.error(f"{flag}: must be an int {f'>= {lo}' if hi is None else f'in {lo}..{hi}'}, got {v}")
    check_out(ap, "--json-out", args.json_out)
    engines_arg = args.engine
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(_force_k)
    from vllm import LLM, SamplingParams

    import offline_generate as og

    engines = []
    for name, spec, opts in engines_arg:
        llm = LLM(model=og.DEFAULT_MODEL, dtype="float32", enforce_eager=True, max_model_len=2048,
                  max_num_seqs=args.max_num_seqs, gpu_memory_utilization=0.15, seed=0, speculative_config=spec,
                  disable_log_stats=False)
        if "force_k" in opts:
            llm.collective_rpc(_force_k, args=(opts["force_k"],))
        if "resync" in opts:
            llm.collective_rpc(_set_resync, args=(opts["resync"],))
        engines.append((name, llm))
    prompts = og.build_prompts(engines[0][1].get_tokenizer(), args.num_prompts)
    if args.single_stream:
        prompts = prompts[: args.single_stream]
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    times: dict[str, list[float]] = {n: [] for n, _ in engines}
    tokens: dict[str, int] = {}
    same: dict[str, bool] = {}
    k_rounds: dict[str, list[dict]] = {n: [] for n, _ in engines}  # per round: {B bucket: {K: steps}}
    k_seen: dict[str, dict | None] = {n: None for n, _ in engines}
    base = engines[0][0]
    for r in range(args.rounds):
        outs = {}
        for name, llm in engines if r % 2 == 0 else engines[::-1]:
            t0 = time.perf_counter()
            if args.single_stream:
                o = [llm.generate([p], sp, use_tqdm=False)[0] for p in prompts]
            else:
                o = llm.generate(prompts, sp, use_tqdm=False)
            times[name].append(time.perf_counter() - t0)
            if llm.llm_engine.vllm_config.speculative_config is not None:
                now = (llm.collective_rpc("specla_counters")[0].get("policy") or {}).get("chosen_by_batch")
                k_rounds[name].append(_k_diff(now, k_seen[name]))
                k_seen[name] = now
            outs[name] = [list(x.outputs[0].token_ids) for x in o]
            tokens[name] = sum(len(t) for t in outs[name])
        for name in outs:
            same[name] = same.get(name, True) and outs[name] == outs[base]
        print(f"round {r}: " + "  ".join(f"{n} {v[-1]:.2f} s" for n, v in times.items()), flush=True)
    rows = []
    print(f"\n| engine | median s | tok/s | speed vs {base} per round | median | identical |")
    print("|---|---|---|---|---|---|")
    for name, v in times.items():
        ratios = [a / b for a, b in zip(times[base], v)]
        llm = dict(engines)[name]
        spec_on = llm.llm_engine.vllm_config.speculative_config is not None
        # the worker's own counters: LLM.get_metrics() reads the process-wide Prometheus registry, which
        # each new engine re-registers, so with several engines it holds only the last one's counts
        counters = llm.collective_rpc("specla_counters")[0] if spec_on else {}
        drafted = counters.get("draft_tokens_proposed")
        row = {"engine": name, "draft_tokens": drafted if spec_on else None,
               "k_chosen": (counters.get("policy") or {}).get("chosen"), "k_by_batch_per_round": k_rounds[name] or None,
               "policy_model": llm.collective_rpc(_policy_describe)[0] if spec_on else None, "seconds": v,
               "median_s": statistics.median(v), "output_tokens": tokens[name],
               "speed_vs_base": ratios, "median_speed_vs_base": statistics.median(ratios), "identical": same[name]}
        rows.append(row)
        print(f"| {name} | {row['median_s']:.2f} | {tokens[name] / row['median_s']:.1f} | "
              f"{' '.join(f'{x:.3f}' for x in ratios)} | {row['median_speed_vs_base']:.3f}x | {same[name]} |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": {**vars(args), "json_out": os.path.relpath(args.json_out, REPO), "engine": [f"{n}={json.dumps(sp)}" + "".join(f":{k}={'none' if v is None else v}" for k, v in o.items())
                                                          for n, sp, o in args.engine]}, "engines": rows}, f, indent=1)
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
