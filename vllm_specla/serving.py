"""Start, query and stop a vLLM OpenAI server (and a local Ray cluster) with SpecLA.

Used by ``examples/serve_and_query.py``, ``examples/ray_serve.py`` and the serving tests. No vLLM
import here: the server is a child process (``vllm serve``), talked to over HTTP on 127.0.0.1.

* :func:`vllm_serve_command` — the ``vllm serve MODEL ...`` command line (the ``vllm`` console
  script next to this interpreter; ``python -m vllm.entrypoints.cli.main`` if it is missing).
* :class:`Server` — start in its own session, wait for ``/health`` (bounded), stop by PID
  (SIGTERM, bounded wait, then SIGKILL to the process group it created).
* :func:`spec_decode_metrics` — vLLM's speculative-decoding counters scraped from ``/metrics``.
* :class:`RayCluster` — a throw-away local Ray head (``ray start --head --block``) advertising
  the ``vllm_cpu`` resource that CPU Ray support needs (``worker/ray_cpu.py``), stopped the
  same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _bin(name: str) -> str | None:
    p = os.path.join(os.path.dirname(sys.executable), name)
    return p if os.path.exists(p) else shutil.which(name)


def vllm_serve_command(model: str, *args: str) -> list[str]:
    """``vllm serve MODEL ARGS...`` (vLLM's own CLI; on vLLM-CPU it starts thanks to
    ``vllm_specla.compat``)."""
    exe = _bin("vllm")
    head = [exe] if exe else [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    return [*head, "serve", model, *args]


def _kill_group(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM ``proc``; after ``timeout`` s SIGKILL the process group it leads (which we created
    with ``start_new_session``), then reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of our own session only
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


class ServerStartError(RuntimeError):
    """A server that exited, or never answered ``/health``, before it served.

    Attributes: ``status`` (the exit status; None after a timeout), ``reason`` (one line: the last ``Error: ...`` line
    of its log, which is what the plugin prints for a refused config, else the last exception line, else the last
    line), ``log_path``. ``str()`` keeps the log's last 40 lines."""

    def __init__(self, what: str, status: int | None, log_path: str, tail: str):
        self.status, self.log_path = status, log_path
        self.reason = startup_error_line(tail)  # (from up to 400 lines: an engine's cause precedes its shutdown)
        super().__init__(f"{what}:\n" + "\n".join(tail.splitlines()[-40:]))

    def one_line(self) -> str:
        """``vllm serve exited with status 1 before it served: <reason> (log: <path>)``: for a CLI's last line."""
        what = (f"exited with status {self.status}" if self.status is not None
                else "did not answer /health in time (stopped)")
        why = self.reason.removeprefix("Error: ") or "its log is empty"
        return f"vllm serve {what} before it served: {why} (log: {self.log_path})"


# vLLM's front-end summary of an engine that died while starting: the cause is on an earlier line
_GENERIC_STARTUP_ERRORS = ("Engine core initialization failed", "See root cause above", "Worker failed with error",
                           "WorkerProc initialization failed")


def startup_error_line(log: str) -> str:
    """The one line of a failed server log that says why: the last line starting ``Error: `` (the plugin's
    one-line refusals, ``worker/patches.py``); else the last exception line (``SomethingError: ...``, also behind
    vLLM's ``(EngineCore pid=...) ERROR ...`` prefixes) that is not vLLM's generic "engine core initialization
    failed" summary; else that summary; else the last non-empty line; ``""`` for an empty log."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    hits = [ln for ln in lines if ln.startswith("Error: ")]
    if hits:
        return hits[-1]
    hits = [ln for ln in lines if re.search(r"\b[\w.]*(Error|Exception): ", ln)]
    specific = [ln for ln in hits if not any(g in ln for g in _GENERIC_STARTUP_ERRORS)]
    if specific or hits:
        return (specific or hits)[-1]
    return lines[-1] if lines else ""


class Server:
    """A vLLM OpenAI-compatible server child process on 127.0.0.1.

    ``Server(vllm_serve_command(model, "--speculative-config", "specla.json"))`` — ``--host`` and
    ``--port`` are appended. Use as a context manager or call :meth:`start` / :meth:`stop`.
    """

    def __init__(self, cmd: list[str], port: int | None = None, env: dict | None = None,
                 log_path: str | None = None, cwd: str | None = None, ready_timeout: float = 600):
        self.host = HOST
        self.port = port or free_port()
        self.cmd = [*cmd, "--host", HOST, "--port", str(self.port)]
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.ready_timeout = ready_timeout
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="vllm_server_", suffix=".log")
            os.close(fd)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @classmethod
    def attach(cls, url: str) -> "Server":
        """A handle on a server someone else started (``http://host:port``); :meth:`stop` is a no-op."""
        host, _, port = url.split("://", 1)[-1].split("/", 1)[0].rpartition(":")
        srv = cls([], port=int(port), log_path=os.devnull)
        srv.host, srv.cmd = host, []
        return srv

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def start(self) -> "Server":
        log = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         cwd=self.cwd, start_new_session=True)
        finally:
            log.close()
        return self

    def wait_ready(self, timeout: float | None = None) -> "Server":
        """Poll ``/health`` until 200 (bounded).

        Raises:
            ServerStartError: the server exited (``status`` its exit status) or did not answer within ``timeout``
                (default ``ready_timeout``; ``status`` None, the server stopped); it carries the log tail and its
                one-line ``reason``."""
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(f"server exited with status {self.proc.returncode}", self.proc.returncode,
                                       self.log_path, self.log_tail(400))
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise ServerStartError(f"server not healthy after {timeout or self.ready_timeout} s", None, self.log_path,
                               self.log_tail(400))

    def alive(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def get(self, path: str, timeout: float = 30) -> str:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return r.read().decode()

    def post(self, path: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
        """POST JSON; returns ``(status, json)`` also for HTTP errors (e.g. 400)."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read().decode())
        except urllib.error.HTTPError as e:
            raw = e.read().decode(errors="replace")
            try:
                return e.code, json.loads(raw)
            except json.JSONDecodeError:
                return e.code, {"raw": raw}

    def metrics(self) -> dict:
        return spec_decode_metrics(self.get("/metrics"))

    def stop(self, timeout: float = 30) -> None:
        if self.proc is not None:
            _kill_group(self.proc, timeout)

    def __enter__(self) -> "Server":
        self.start()
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def spec_decode_metrics(text: str) -> dict:
    """vLLM's speculative-decoding counters from a Prometheus ``/metrics`` text (summed over engines).

    Returns ``num_drafts`` (verify steps with drafts), ``num_draft_tokens``,
    ``num_accepted_tokens``, ``accepted_per_pos`` (list by draft position), and the derived
    ``acceptance_rate`` (accepted / draft tokens) and ``mean_acceptance_length`` (tokens per
    verify step including the bonus token).
    """
    sums: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:spec_decode_") or "_created" in line.split("{")[0]:
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{")[0].removeprefix("vllm:spec_decode_").removesuffix("_total")
        try:
            v = float(value)
        except ValueError:
            continue
        if name == "num_accepted_tokens_per_pos":
            pos = name_labels.split('position="', 1)[-1].split('"', 1)[0]
            per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + v
        else:
            sums[name] = sums.get(name, 0.0) + v
    return _with_rates({"num_drafts": int(sums.get("num_drafts", 0.0)),
                        "num_draft_tokens": int(sums.get("num_draft_tokens", 0.0)),
                        "num_accepted_tokens": int(sums.get("num_accepted_tokens", 0.0)),
                        "accepted_per_pos": [int(per_pos[k]) for k in sorted(per_pos)]})


def _with_rates(d: dict) -> dict:
    """``d`` with ``acceptance_rate`` and ``mean_acceptance_length`` derived from its counters (0.0 without drafts)."""
    d["acceptance_rate"] = d["num_accepted_tokens"] / d["num_draft_tokens"] if d["num_draft_tokens"] else 0.0
    d["mean_acceptance_length"] = 1.0 + d["num_accepted_tokens"] / d["num_drafts"] if d["num_drafts"] else 0.0
    return d


def spec_decode_delta(after: dict, before: dict) -> dict:
    """The counters of :func:`spec_decode_metrics` accrued between two scrapes (``after`` minus ``before``: one
    run's share of a server's lifetime totals), with ``acceptance_rate`` and ``mean_acceptance_length`` recomputed
    from the differences (0.0 where no draft was verified in between)."""
    d = {k: after[k] - before.get(k, 0) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
    old = before.get("accepted_per_pos", [])
    d["accepted_per_pos"] = [a - (old[i] if i < len(old) else 0) for i, a in enumerate(after["accepted_per_pos"])]
    return _with_rates(d)


class RayCluster:
    """A local, throw-away Ray head node for CPU serving (``ray start --head --block``).

    Advertises ``num_workers`` units of the ``vllm_cpu`` resource (one per vLLM worker, see
    ``vllm_specla/worker/ray_cpu.py``), uses free ports and its own temp dir, and is stopped by
    PID (its process group) — never ``ray stop``, which would stop every Ray cluster on the
    machine. :attr:`env` holds what a vLLM process needs to use it (``RAY_ADDRESS``,
    ``VLLM_SPECLA_CPU_RAY=1``, and ``RAY_AUTH_MODE=token`` with ``RAY_AUTH_TOKEN``, the cluster's own token:
    Ray 2.60's ``ray start --head`` turns token authentication on whenever it finds a token, e.g. a
    ``~/.ray/auth_token`` another cluster left, while a client without ``RAY_AUTH_MODE`` sent none, so the
    engine's start failed with "Authentication token is missing or incorrect" (session 52); with both set on
    the head and its clients, the cluster authenticates with its own token whatever ``~/.ray`` holds).
    """

    def __init__(self, num_workers: int = 2, num_cpus: int | None = None, log_path: str | None = None):
        self.num_workers = num_workers
        self.num_cpus = num_cpus if num_cpus is not None else max(num_workers, os.cpu_count() or 1)
        self.port = free_port()
        # short path: Ray's unix sockets live under the temp dir (108-byte limit); the default
        # /tmp is short on Linux, VLLM_SPECLA_RAY_TMPDIR picks another folder
        self.temp_dir = tempfile.mkdtemp(prefix="rs", dir=os.environ.get("VLLM_SPECLA_RAY_TMPDIR", "/tmp"))
        self.log_path = log_path or os.path.join(self.temp_dir, "ray_start.log")
        self.proc: subprocess.Popen | None = None
        self.auth_token = secrets.token_hex(32)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def env(self) -> dict:
        return {"RAY_ADDRESS": self.address, "VLLM_SPECLA_CPU_RAY": "1", "RAY_USAGE_STATS_ENABLED": "0",
                **self._auth_env}

    @property
    def _auth_env(self) -> dict:
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.auth_token}

    def start(self, timeout: float = 120) -> "RayCluster":
        ray = _bin("ray")
        if ray is None:
            raise RuntimeError("the `ray` command is not installed (pip install ray)")
        cmd = [ray, "start", "--head", "--block", f"--node-ip-address={HOST}", f"--port={self.port}",
               f"--ray-client-server-port={free_port()}", f"--dashboard-port={free_port()}",
               f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
               f"--num-cpus={self.num_cpus}", "--num-gpus=0",
               "--resources=" + json.dumps({"vllm_cpu": self.num_workers}),
               f"--temp-dir={self.temp_dir}", "--disable-usage-stats", "--include-dashboard=false"]
        log = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **self._auth_env})
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {self.proc.returncode}:\n{self._log()}")
            if "Ray runtime started" in self._log():
                return self
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"Ray head not up after {timeout} s:\n{self._log()}")

    def _log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self, timeout: float = 30) -> None:
        if self.proc is not None:
            _kill_group(self.proc, timeout)
            self.proc = None
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> "RayCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
