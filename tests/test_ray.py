"""Ray: ``vllm serve ... --tensor-parallel-size 2 --distributed-executor-backend ray`` with SpecLA on CPU.

The test starts its own local Ray head (``vllm_specla.serving.RayCluster``: free ports, own temp
dir, two units of the ``vllm_cpu`` resource) and stops it by PID; CPU Ray support is the plugin's
opt-in ``VLLM_SPECLA_CPU_RAY=1`` (``vllm_specla/worker/ray_cpu.py``). GDN heads, their states and
factor banks are split over the two ranks; the EAGLE drafter runs on both ranks and must propose
identical drafts. Greedy output must equal the single-process AR reference.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from test_serving import MODEL_NAME, SERVER_ENV, Reference, _ids, _rpc, make_served_model, random_prompts, serve_args
from vllm_specla.serving import RayCluster, Server, spec_decode_metrics, vllm_serve_command

pytestmark = pytest.mark.vllm

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_served(tmp_path_factory, tiny_dir):
    root = tmp_path_factory.mktemp("ray_served")
    model, _ = make_served_model(root, tiny_dir, drafter="random_eagle", k=3)
    # inline JSON this time (test_serving.py serves from a file)
    spec = json.dumps({"method": "specla", "num_speculative_tokens": 3, "drafter": str(root / "drafter")})
    cluster = RayCluster(num_workers=2, log_path=str(root / "ray.log"))
    cluster.start()
    try:
        # the model path relative to the server's working directory, as the README's command gives it:
        # Ray workers run elsewhere, so the plugin must make it absolute (a hub repo id otherwise)
        cmd = vllm_serve_command(os.path.relpath(model, root), *serve_args(spec, "--tensor-parallel-size", "2",
                                                    "--distributed-executor-backend", "ray"))
        env = {**SERVER_ENV, **cluster.env, "OMP_NUM_THREADS": "1"}
        with Server(cmd, env=env, log_path=str(root / "server.log"), cwd=str(root)) as server:
            yield {"server": server, "model": model, "ref": Reference(model), "cluster": cluster}
        pgid = cluster.proc.pid
    finally:
        cluster.stop()
    with pytest.raises(ProcessLookupError):  # nothing of the Ray cluster survives
        os.killpg(pgid, signal.SIGCONT)


def test_tp2_over_ray_matches_single_process_ar(ray_served):
    from openai import OpenAI

    server, ref = ray_served["server"], ray_served["ref"]
    client = OpenAI(base_url=server.base_url, api_key="EMPTY", max_retries=0, timeout=300)
    prompts = random_prompts(8, seed=11)
    prompts[0] = prompts[0][:1]
    r = client.completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=20, temperature=0,
                                  extra_body={"return_token_ids": True, "ignore_eos": True})
    got = [_ids(c) for c in sorted(r.choices, key=lambda c: c.index)]
    assert got == ref(prompts, 20)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "the water"}],
                                            max_tokens=12, temperature=0, stream=True, extra_body={"ignore_eos": True})
    assert "".join((c.choices[0].delta.content or "") for c in stream if c.choices).strip()
    m = spec_decode_metrics(server.get("/metrics"))
    assert m["num_drafts"] > 0 and m["num_draft_tokens"] > 0


def test_tp2_ranks_split_heads_and_draft_identically(ray_served):
    server = ray_served["server"]
    pages = _rpc(server, "specla_state_page")
    assert len(pages) == 2 and pages[0] == pages[1]
    hv_per_rank = pages[0]["shapes"][1][0]  # ssm [HV/tp, V, K]
    assert hv_per_rank == 2  # tiny model: 4 value heads over 2 ranks
    digests = _rpc(server, "specla_draft_digest")
    assert len(digests) == 2 and digests[0] == digests[1] and int(digests[0]) != 0
    counters = _rpc(server, "specla_counters")
    assert counters[0] == counters[1] and counters[0]["verify_rows"] > 0


@pytest.mark.skipif(os.environ.get("SPECLA_TEST_RAY_DP") != "1",
                    reason="data-parallel replicas over Ray start two engines (~2-3 min here); SPECLA_TEST_RAY_DP=1")
def test_dp2_replicas_over_ray(tmp_path, tiny_dir):
    model, spec = make_served_model(tmp_path, tiny_dir, drafter="perturbed", k=3)
    prompts = random_prompts(6, seed=12)
    with RayCluster(num_workers=2, log_path=str(tmp_path / "ray.log")) as cluster:
        cmd = vllm_serve_command(model, *serve_args(spec, "--data-parallel-size", "2",
                                                    "--data-parallel-backend", "ray"))
        env = {**SERVER_ENV, **cluster.env, "OMP_NUM_THREADS": "1"}
        with Server(cmd, env=env, log_path=str(tmp_path / "server.log")) as server:
            outs = []
            for p in prompts:  # one at a time: the front end spreads them over both engines
                status, body = server.post("/v1/completions", {"model": MODEL_NAME, "prompt": p, "max_tokens": 16,
                                                               "temperature": 0, "ignore_eos": True,
                                                               "return_token_ids": True})
                assert status == 200, body
                outs.append(body["choices"][0]["token_ids"])
            metrics_text = server.get("/metrics")
    assert outs == Reference(model)(prompts, 16)
    assert 'engine="1"' in metrics_text and spec_decode_metrics(metrics_text)["num_drafts"] > 0


def test_relative_local_model_path_made_absolute(tmp_path, monkeypatch):
    """``ray_cpu.absolute_local_paths``: a relative local directory becomes absolute (the served name
    stays as given); hub ids, absolute paths and an explicit served name are left alone."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_specla.worker.ray_cpu import absolute_local_paths

    (tmp_path / "models" / "target").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    args = EngineArgs(model="models/target", tokenizer="models/target")
    absolute_local_paths(args)
    assert args.model == str(tmp_path / "models" / "target")
    assert args.tokenizer == str(tmp_path / "models" / "target")
    assert args.served_model_name == "models/target"

    named = EngineArgs(model="models/target", served_model_name="mine")
    absolute_local_paths(named)
    assert named.model == str(tmp_path / "models" / "target") and named.served_model_name == "mine"

    hub = EngineArgs(model="org/not-here")
    absolute_local_paths(hub)
    assert hub.model == "org/not-here" and hub.served_model_name is None

    empty = EngineArgs(model="models/target", served_model_name=[])
    absolute_local_paths(empty)
    assert empty.served_model_name == "models/target"


def test_engine_args_hook_builds_an_absolute_model_config(tmp_path, monkeypatch, tiny_dir):
    """The hook ``install()`` puts on ``EngineArgs.create_model_config``: the model config that is
    shipped to the workers holds the absolute path, and the served name is the one typed."""
    import shutil

    from vllm.engine.arg_utils import EngineArgs

    from vllm_specla.worker.ray_cpu import _patch_engine_args

    shutil.copytree(tiny_dir["target"], tmp_path / "target")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(EngineArgs, "create_model_config", EngineArgs.create_model_config)  # undone after
    _patch_engine_args()
    _patch_engine_args()  # idempotent: one wrapper
    assert getattr(EngineArgs.create_model_config, "_specla_abs_paths", False)
    mc = EngineArgs(model="target", skip_tokenizer_init=True, dtype="float32").create_model_config()
    assert mc.model == str(tmp_path / "target")
    assert mc.served_model_name == "target"


def test_ray_cluster_authenticates_with_its_own_token(tmp_path, monkeypatch):
    """A ``~/.ray/auth_token`` left by another cluster made Ray 2.60's ``ray start --head`` turn token
    authentication on while the engine's Ray client sent no token: every Ray test's server failed to start
    ("Authentication token is missing or incorrect", session 52). ``RayCluster`` gives the head and, through
    :attr:`RayCluster.env`, its clients one token of its own; a client connects with a stale token file in HOME, and
    no token file is written there."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0" * 64)  # another cluster's token
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    code = "import ray; ray.init(address='auto'); print('vllm_cpu', ray.cluster_resources().get('vllm_cpu'))"
    with RayCluster(num_workers=1, log_path=str(tmp_path / "ray.log")) as cluster:
        assert cluster.env["RAY_AUTH_MODE"] == "token" and len(cluster.env["RAY_AUTH_TOKEN"]) == 64
        r = subprocess.run([sys.executable, "-c", code], env={**os.environ, **cluster.env}, capture_output=True,
                           text=True, timeout=120)
    assert r.returncode == 0 and "vllm_cpu 1.0" in r.stdout, r.stderr[-2000:]
    assert (home / ".ray" / "auth_token").read_text() == "0" * 64
