#!/usr/bin/env python
"""Ray-distributed SpecLA serving: tensor parallelism (and data-parallel replicas) over Ray.

    python examples/ray_serve.py                         # TP=2 over a local Ray cluster, embedded model
    python examples/ray_serve.py --data-parallel 2 --tensor-parallel 1   # two replicas instead
    python examples/ray_serve.py --ray-address 10.0.0.5:6379             # use your running cluster

What it does:

1. starts a throw-away local Ray head (``ray start --head --block`` with free ports, its own temp
   dir, and ``--resources '{"vllm_cpu": N}'``), unless ``--ray-address`` is given;
2. starts ``vllm serve MODEL --speculative-config specla.json --tensor-parallel-size TP
   --distributed-executor-backend ray`` (``--data-parallel-size DP --data-parallel-backend ray``
   for replicas) on 127.0.0.1. On CPU the plugin's opt-in ``VLLM_SPECLA_CPU_RAY=1`` is set: it
   gives the CPU platform the Ray resource ``vllm_cpu`` (``vllm_specla/worker/ray_cpu.py``);
   GPU platforms use Ray's ``GPU`` resource and need nothing;
3. sends a few MT-Bench questions (``openai`` client), prints answers and the acceptance
   counters from ``/metrics``;
4. stops the server and the Ray head by PID (never ``ray stop``, which would stop every cluster
   on the machine);
5. only with ``--check`` (local or your own cluster): starts a second, single-process server
   (no Ray), asks the same questions and prints how many greedy answers equal the Ray run's
   (exit status 1 if any differs). Without ``--check`` nothing is compared.

With your own cluster, start each node with ``--resources '{"vllm_cpu": <workers on this node>}'``
(CPU nodes) and export ``VLLM_SPECLA_CPU_RAY=1`` where vLLM starts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from vllm_specla.serving import (RayCluster, Server, ServerStartError, spec_decode_metrics,  # noqa: E402
                                 vllm_serve_command)
from offline_generate import _at_least  # noqa: E402  (the sibling examples' argparse types)
from serve_and_query import _positive_float  # noqa: E402

DEFAULT_MODEL = os.path.join(REPO, "models", "specla-gdn-tiny", "target")
DEFAULT_SPEC = os.path.join(REPO, "examples", "specla.json")
NAME = "specla-gdn"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--speculative-config", default=DEFAULT_SPEC)
    p.add_argument("--tensor-parallel", type=_at_least(1), default=2)
    p.add_argument("--data-parallel", type=_at_least(1), default=1)
    p.add_argument("--ray-address", type=_ray_address, default=None,
                   help="an existing Ray cluster: host:port of its head, auto or ray://host:port (default: start a "
                        "local one)")
    p.add_argument("--num-prompts", type=_at_least(1, 80), default=4, help="MT-Bench questions, 1..80 (default 4)")
    p.add_argument("--max-tokens", type=_at_least(1), default=48)
    p.add_argument("--check", action="store_true", help="compare with a single-process server (greedy, fp32)")
    p.add_argument("--startup-timeout", type=_positive_float, default=900, help="seconds to wait for /health")
    return p.parse_args()


def _ray_address(s: str) -> str:
    """``--ray-address``: ``host:port`` (a Ray head's GCS address), ``auto`` or ``ray://host:port`` (Ray's forms);
    anything else was passed to vLLM and ended in an engine-start traceback."""
    host, sep, port = s.rpartition(":")
    if s == "auto" or (s.startswith("ray://") and len(s) > len("ray://")) or (sep and host and port.isdigit()):
        return s
    raise argparse.ArgumentTypeError(f"{s!r}: expected host:port (e.g. 10.0.0.5:6379), auto or ray://host:port")


def _reachable(address: str, timeout: float = 5.0) -> bool:
    """Whether a TCP connection to a ``host:port`` Ray address opens (other forms, e.g. ``auto`` or ``ray://``,
    are left to Ray); vLLM's engine otherwise retries an unreachable GCS until ``--startup-timeout``."""
    import socket

    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return True
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout):  # [::1]:6379
            return True
    except OSError:
        return False


def serve_cmd(args, *parallel: str) -> list[str]:
    return vllm_serve_command(
        args.model, "--speculative-config", args.speculative_config, "--served-model-name", NAME,
        "--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.15", "--max-model-len", "2048",
        "--max-num-seqs", "16", "--seed", "0", *parallel)


def ask_all(server: Server, questions: list[str], max_tokens: int) -> list[str]:
    from openai import OpenAI

    client = OpenAI(base_url=server.base_url, api_key="EMPTY", max_retries=0, timeout=600)
    out = []
    for q in questions:
        r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": q}],
                                           max_tokens=max_tokens, temperature=0)
        out.append(r.choices[0].message.content)
    return out


def run(cmd: list[str], env: dict, questions, args, label: str):
    server = Server(cmd, env=env, ready_timeout=args.startup_timeout)
    print(f"[{label}] $ {' '.join(server.cmd)}\n  (log: {server.log_path})", flush=True)
    t0 = time.time()
    with server:
        print(f"[{label}] server up (pid {server.pid}) in {time.time() - t0:.1f} s", flush=True)
        answers = ask_all(server, questions, args.max_tokens)
        metrics = spec_decode_metrics(server.get("/metrics"))
    print(f"[{label}] server stopped")
    return answers, metrics


def main() -> int:
    args = parse_args()
    from vllm_specla.data import mtbench_questions

    questions = [q["turns"][0] for q in mtbench_questions()[: args.num_prompts]]
    workers = args.tensor_parallel * args.data_parallel
    parallel = ["--tensor-parallel-size", str(args.tensor_parallel), "--distributed-executor-backend", "ray"]
    if args.data_parallel > 1:
        parallel += ["--data-parallel-size", str(args.data_parallel), "--data-parallel-backend", "ray"]
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), "VLLM_SPECLA_CPU_RAY": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if args.ray_address and not _reachable(args.ray_address):
        print(f"Error: --ray-address {args.ray_address}: nothing answers there (a Ray head's GCS address host:port, "
              "e.g. 10.0.0.5:6379)", file=sys.stderr)
        return 1
    cluster = None
    try:
        if args.ray_address:
            env["RAY_ADDRESS"] = args.ray_address
        else:
            cluster = RayCluster(num_workers=workers).start()
            env.update(cluster.env)
            print(f"local Ray head (pid {cluster.proc.pid}) at {cluster.address} with {workers} x vllm_cpu", flush=True)
        label = f"ray TP={args.tensor_parallel} DP={args.data_parallel}"
        answers, m = run(serve_cmd(args, *parallel), env, questions, args, label)
    except ServerStartError as e:  # (a refused config: the log's one line, not a traceback with the log's tail)
        print(f"Error: {e.one_line()}", file=sys.stderr)
        return 1
    finally:
        if cluster is not None:
            cluster.stop()
            print("local Ray head stopped")
    for q, a in zip(questions, answers):
        print(f"\n### {q}\n{a.strip()}")
    print(f"\nSpecLA over Ray (from /metrics): {m['num_accepted_tokens']}/{m['num_draft_tokens']} draft tokens "
          f"accepted, mean acceptance length {m['mean_acceptance_length']:.2f}, per position {m['accepted_per_pos']}")
    if args.check:
        try:
            single, _ = run(serve_cmd(args), {"VLLM_CPU_KVCACHE_SPACE": env["VLLM_CPU_KVCACHE_SPACE"]}, questions,
                            args, "single process")
        except ServerStartError as e:
            print(f"Error: {e.one_line()}", file=sys.stderr)
            return 1
        same = sum(a == b for a, b in zip(answers, single))
        print(f"identical to the single-process run: {same}/{len(answers)}")
        return 0 if same == len(answers) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
