"""The end-to-end benchmark's code paths on the CPU (tiny shape, eager): every mode runs, every run
is lossless against the AR trace, the auto policy's pick is recorded, and the table script reads
the records. Keeps ``benchmarks/bench_e2e.py`` from rotting between GPU sessions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_e2e_dry_cpu(tmp_path):
    out = tmp_path / "e2e.jsonl"
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_e2e.py"), "--dry-cpu", "--auto",
                    "--out", str(out)], check=True, env=env, capture_output=True, timeout=600)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    modes = {r["mode"] for r in recs}
    assert {"ar", "specla", "snapshot", "specla-auto", "specla-tree"} <= modes
    for r in recs:
        if "lossless_rows" in r:
            done, total = r["lossless_rows"].split("/")
            assert done == total, r
        if r["mode"] == "specla":
            assert r["state_bytes_per_request"]["factors"] > 0 and r["tau"] >= 1.0
    table = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "plot_e2e.py"), str(out)],
                           check=True, env=env, capture_output=True, text=True, timeout=120).stdout
    assert "| shape | B | alpha |" in table


def test_csrc_bench_forced_variants_set_the_switches(monkeypatch):
    """``bench_csrc_cuda`` A/B columns: each forced CUDA layout / UT build variant sets exactly the
    binding's switches while the op runs (read at graph capture) and clears them afterwards. A
    parsing slip here once ran the default kernel in every ``utvN`` column (RESULTS.md session 6)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import bench_csrc_cuda as bc  # noqa: PLC0415

    seen = []
    keys = ("VLLM_SPECLA_CUDA_LAYOUT", "VLLM_SPECLA_CUDA_UT_NW", "VLLM_SPECLA_CUDA_UT_VAR", "VLLM_SPECLA_CUDA_BV",
            "VLLM_SPECLA_CUDA_REGCAP", "VLLM_SPECLA_CUDA_UT_P5", "VLLM_SPECLA_CUDA_UT_ROWCOPY")
    monkeypatch.setattr(bc._cpp, "chain_verify", lambda *a, **kw: seen.append({k: os.environ.get(k) for k in keys}))
    for k in keys:
        monkeypatch.delenv(k, raising=False)
    for layout in ("utv1", "utv2", "utv3", "ut1", "ut", "utp0", "rs", "auto", "utp1", "utrow"):
        bc._with_env(0, True, layout)()
    assert [s["VLLM_SPECLA_CUDA_UT_VAR"] for s in seen] == ["1", "2", "3"] + [None] * 7
    assert [s["VLLM_SPECLA_CUDA_LAYOUT"] for s in seen] == ["ut"] * 6 + ["rs", None, "ut", "ut"]
    assert [s["VLLM_SPECLA_CUDA_UT_NW"] for s in seen] == [None, None, None, "1"] + [None] * 6
    assert [s["VLLM_SPECLA_CUDA_UT_P5"] for s in seen] == [None] * 5 + ["0", None, None, "1", None]
    assert [s["VLLM_SPECLA_CUDA_UT_ROWCOPY"] for s in seen] == [None] * 9 + ["1"]
    bc._with_env(4, False, "auto")()
    assert seen[-1]["VLLM_SPECLA_CUDA_BV"] == "4" and seen[-1]["VLLM_SPECLA_CUDA_REGCAP"] == "0"
    assert all(os.environ.get(k) is None for k in keys)
