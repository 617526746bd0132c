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
