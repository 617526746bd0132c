#!/usr/bin/env python
"""Serve a GDN model with SpecLA through vLLM's OpenAI server, query it, read the acceptance metrics.

    python examples/serve_and_query.py                       # embedded model + examples/specla.json
    python examples/serve_and_query.py --model DIR --speculative-config my_specla.json --num-prompts 16
    python examples/serve_and_query.py --url http://127.0.0.1:8000   # query a server you started

What it does:

1. starts ``vllm serve MODEL --speculative-config specla.json --served-model-name NAME`` on
   127.0.0.1 (fp32, eager, small memory; vLLM flags after ``--`` are added last, so they override these, except
   ``--host`` / ``--port``), waits for ``/health``; the queries use the name ``/v1/models`` lists;
2. sends the first turn of MT-Bench questions (``vllm_specla.data.mtbench_questions()``) as chat
   completions with the ``openai`` client, concurrently, greedy; streams one more answer;
3. prints the answers and the speculative-decoding counters scraped from ``/metrics``
   (``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens``,
   ``..._num_accepted_tokens_per_pos``) with the mean acceptance length: this run's share (scraped before and
   after its queries, so a ``--url`` server's earlier traffic is not counted);
4. stops the server by PID (SIGTERM, bounded wait, then SIGKILL of its process group).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import http.client
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # run from a checkout without installing

from vllm_specla.serving import (Server, ServerStartError, spec_decode_delta, spec_decode_metrics,  # noqa: E402
                                 vllm_serve_command)
from offline_generate import _at_least  # noqa: E402  (the sibling example: its integer-range argparse type)

DEFAULT_MODEL = os.path.join(REPO, "models", "specla-gdn-tiny", "target")
DEFAULT_SPEC = os.path.join(REPO, "examples", "specla.json")
STARTUP_TIMEOUT = 600.0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="gated_deltanet checkpoint dir with a tokenizer")
    p.add_argument("--speculative-config", default=DEFAULT_SPEC, help="specla.json path or inline JSON ('' = AR)")
    p.add_argument("--served-model-name", default=None,
                   help="the model name to serve and query (default: the served one, from /v1/models; a server this "
                        "starts for the embedded model serves it as specla-gdn-tiny, as README's vllm serve line)")
    p.add_argument("--url", type=_server_url, default=None,
                   help="use this running server (http://host:port) instead of starting one")
    p.add_argument("--port", type=_at_least(0, 65535), default=None,
                   help="port for the started server, 0..65535 (default or 0: a free one)")
    p.add_argument("--num-prompts", type=_at_least(1, 80), default=8, help="MT-Bench questions, 1..80 (default 8)")
    p.add_argument("--max-tokens", type=_at_least(1), default=64)
    p.add_argument("--concurrency", type=_at_least(1), default=8, help="requests in flight at once")
    p.add_argument("--show", type=_at_least(0), default=3, help="answers to print in full")
    p.add_argument("--startup-timeout", type=_positive_float, default=STARTUP_TIMEOUT,
                   help=f"seconds to wait for /health (default {STARTUP_TIMEOUT:g})")
    p.add_argument("vllm_args", nargs=argparse.REMAINDER, help="extra `vllm serve` flags after --")
    args = p.parse_args()
    extra = [a for a in args.vllm_args if a != "--"]
    if args.url:  # (these only shape a server this script starts: with --url they were ignored)
        unused = [flag for flag, given in (("--model", args.model != DEFAULT_MODEL),
                                           ("--speculative-config", args.speculative_config != DEFAULT_SPEC),
                                           ("--port", args.port is not None),
                                           ("--startup-timeout", args.startup_timeout != STARTUP_TIMEOUT),
                                           (f"the vllm serve flags after -- ({' '.join(extra)})", bool(extra)))
                  if given]
        if unused:
            p.error(f"--url {args.url}: {', '.join(unused)} shape a server this script starts; leave out --url or "
                    "them")
    return args


def _server_url(s: str) -> str:
    """``http://host:port`` (a trailing ``/`` or ``/v1`` is dropped)."""
    from urllib.parse import urlsplit

    u = urlsplit(s.strip())
    try:
        port = u.port
    except ValueError:
        port = None
    if u.scheme != "http" or not u.hostname or port is None or u.path.rstrip("/") not in ("", "/v1"):
        raise argparse.ArgumentTypeError(f"must be a server address http://host:port, got {s!r}")
    return f"{u.scheme}://{u.netloc}"


def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        v = 0.0
    if not v > 0:  # (also NaN)
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {s!r}")
    return v


SERVED_NAME = "specla-gdn-tiny"  # (README's `vllm serve` line serves the embedded model under this name)


def served_model_name(server: Server, wanted: str | None) -> str:
    """The model name to query: ``wanted`` if the server lists it in ``/v1/models``, else (``wanted`` None) its only
    model.

    Raises:
        ValueError: ``wanted`` is not served, or None while the server serves several models or none (the queries
            would all be 404s); the message names the served models.
        OSError, http.client.HTTPException: ``/v1/models`` did not answer (e.g. 401 from a server started with
            ``--api-key``)."""
    import json  # noqa: PLC0415

    names = [str(m.get("id")) for m in json.loads(server.get("/v1/models")).get("data", [])]
    if (wanted is None and len(names) == 1) or (wanted is not None and wanted in names):
        return wanted or names[0]
    served = f"serves {', '.join(names)}" if names else "serves no model"
    raise ValueError(f"--served-model-name: the server at {server.url} {served}, got "
                     f"{wanted if wanted is not None else 'none (give one of them)'}")


def start_server(args) -> Server:
    extra = [a for a in args.vllm_args if a != "--"]
    name = args.served_model_name or (SERVED_NAME if args.model == DEFAULT_MODEL else None)  # (None: vLLM's, the path)
    flags = [*(["--served-model-name", name] if name else []), "--dtype", "float32", "--enforce-eager",
             "--gpu-memory-utilization", "0.15", "--max-model-len", "2048", "--max-num-seqs", "16"]
    if args.speculative_config:
        flags = ["--speculative-config", args.speculative_config, *flags]
    cmd = vllm_serve_command(args.model, *flags, *extra)
    server = Server(cmd, port=args.port, env={"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
                    ready_timeout=args.startup_timeout)
    print(f"$ {' '.join(server.cmd)}\n  (log: {server.log_path})", flush=True)
    t0 = time.time()
    server.start()
    server.wait_ready()
    print(f"server up (pid {server.pid}) in {time.time() - t0:.1f} s at {server.base_url}", flush=True)
    return server


def _scrape(server: Server) -> dict | None:
    """The server's speculative-decoding counters (:func:`spec_decode_metrics`), None where ``/metrics`` does not
    answer (a proxy, another server)."""
    try:
        return spec_decode_metrics(server.get("/metrics"))
    except (OSError, http.client.HTTPException):  # (urllib's HTTPError is an OSError)
        return None


def query(base_url: str, model_name: str, questions: list[str], max_tokens: int, concurrency: int):
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=600)

    def ask(q: str):
        r = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": q}],
                                           max_tokens=max_tokens, temperature=0)
        return r.choices[0].message.content, r.usage.completion_tokens

    t0 = time.time()
    with cf.ThreadPoolExecutor(max_workers=concurrency) as pool:
        answers = list(pool.map(ask, questions))
    elapsed = time.time() - t0
    # one streamed answer, token by token
    stream = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": questions[0]}],
                                            max_tokens=max_tokens, temperature=0, stream=True)
    streamed = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    return answers, elapsed, streamed


def main() -> int:
    args = parse_args()
    from vllm_specla.data import mtbench_questions

    questions = [q["turns"][0] for q in mtbench_questions()[: args.num_prompts]]
    server = None
    try:
        server = Server.attach(args.url) if args.url else start_server(args)
        if args.url:
            try:
                server.get("/health", timeout=10)
            except (OSError, http.client.HTTPException) as e:  # (also something that does not speak HTTP)
                why = " ".join(f"{type(e).__name__}: {e}".split())  # one line (a non-HTTP banner may hold \r\n)
                print(f"Error: --url {args.url}: no vLLM server answers /health there ({why})", file=sys.stderr)
                return 1
        try:
            name = served_model_name(server, args.served_model_name)
        except ValueError as e:
            print(f"Error: {e}", file=sys.stderr)
            return 1
        except (OSError, http.client.HTTPException) as e:
            why = " ".join(f"{type(e).__name__}: {e}".split())
            print(f"Error: {server.url}/v1/models did not answer ({why})", file=sys.stderr)
            return 1
        before = _scrape(server)  # (a running server's totals so far: --url)
        answers, elapsed, streamed = query(server.base_url, name, questions, args.max_tokens, args.concurrency)
        for i, (q, (a, _)) in enumerate(zip(questions, answers)):
            if i < args.show:
                print(f"\n### Q{i + 1}: {q}\n{a.strip()}")
        n_tok = sum(t for _, t in answers)
        print(f"\n{len(answers)} chat completions, {n_tok} tokens in {elapsed:.1f} s "
              f"({n_tok / max(elapsed, 1e-9):.1f} tok/s, up to {min(args.concurrency, len(questions))} concurrent)")
        print(f"streamed answer matches the non-streamed one: {streamed.strip() == answers[0][0].strip()}")
        after = _scrape(server)
        m = spec_decode_delta(after, before) if before is not None and after is not None else None  # this run's share
        if m is not None and min(m["num_drafts"], m["num_draft_tokens"], m["num_accepted_tokens"]) < 0:
            print("the server's /metrics counters went back during the run (a restart?): no acceptance to report")
        elif m is None:
            print("no /metrics on this server: no acceptance to report")
        elif m["num_drafts"]:
            print(f"SpecLA (from /metrics): {m['num_drafts']} verify steps with drafts, "
                  f"{m['num_accepted_tokens']}/{m['num_draft_tokens']} draft tokens accepted "
                  f"({100 * m['acceptance_rate']:.1f}%), mean acceptance length "
                  f"{m['mean_acceptance_length']:.2f} tokens/step (incl. bonus)")
            print("        accepted per draft position: " + " ".join(str(x) for x in m["accepted_per_pos"]))
        else:
            print("no speculative-decoding counters in /metrics (AR server?)")
        return 0
    except ServerStartError as e:  # (a refused config, a port in use, ...: the log's one line, not a traceback)
        print(f"Error: {e.one_line()}", file=sys.stderr)
        return 1
    finally:
        if server is not None and server.proc is not None:
            server.stop()
            print(f"server (pid {server.pid}) stopped")


if __name__ == "__main__":
    sys.exit(main())
