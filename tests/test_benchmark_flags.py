"""Benchmark scripts check their flags before any model loads or engine starts: a bad value is one argparse-style
line naming the flag and what it allows (exit 2), not a traceback deep in the runtime, a run on nothing, or a
result lost after the run. Each case runs the script as a subprocess that must stop before it loads a model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT)


def run(script: str, *flags: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *flags], env=ENV, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def assert_refused(r: subprocess.CompletedProcess, script: str, want: str) -> None:
    """Exit 2 with ``want`` as the last stderr line (after ``script: error: ``), and no traceback."""
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert r.stderr.strip().splitlines()[-1] == f"{script}: error: {want}"


@pytest.fixture
def prompts_file(tmp_path):
    """A valid ``--prompts`` file (two short prompts of the embedded pair's token ids)."""
    p = tmp_path / "prompts.json"
    p.write_text(json.dumps([[1, 2, 3], [4, 5]]))
    return str(p)


# ---- chain_vs_tree.py: had no parser (--help ran the benchmark and overwrote the committed JSON) ----

def test_chain_vs_tree_help_does_not_run_the_benchmark():
    committed = os.path.join(ROOT, "benchmarks", "chain_vs_tree_cpu.json")
    before = os.stat(committed).st_mtime_ns
    # (a short timeout: without a parser the benchmark runs ~1 min, then overwrites the committed file)
    r = run("chain_vs_tree.py", "--help", timeout=30)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("usage: chain_vs_tree.py [-h] [--out OUT]")
    assert "Chain vs tree on the embedded pair" in r.stdout and "chain_vs_tree_cpu.json" in r.stdout
    assert "topology" not in r.stdout and os.stat(committed).st_mtime_ns == before


@pytest.mark.parametrize("out,want", [
    ("{tmp}/no_such_dir/x.json",
     "--out {tmp}/no_such_dir/x.json: its folder does not exist (the results would be lost after the run)"),
    ("{tmp}", "--out {tmp}: is a folder, not a file name"),
])
def test_chain_vs_tree_bad_out(tmp_path, out, want):
    r = run("chain_vs_tree.py", "--out", out.format(tmp=tmp_path), timeout=30)  # (see above)
    assert_refused(r, "chain_vs_tree.py", want.format(tmp=tmp_path))


# ---- resync_acceptance.py ----

@pytest.mark.parametrize("flags,want", [
    (["--prompts", "0"], "--prompts: must be an int >= 1, got 0"),  # (ran on no prompts: "lossless True")
    (["--prompts", "-2"], "--prompts: must be an int >= 1, got -2"),  # (was all but the last 2 questions)
    (["--max-tokens", "0"], "--max-tokens: must be an int >= 1, got 0"),
    (["--batch", "0"], "--batch: must be an int >= 1, got 0"),  # (engine ValueError after the models loaded)
    (["--k", "0"], "--k: must be an int in 1..64, got 0"),  # (measured no drafting at all)
    (["--k", "65"], "--k: must be an int in 1..64, got 65"),
    (["--hold-steps", "-1"], "--hold-steps: must be an int >= 0, got -1"),
    (["--cap", "0"], "--cap: must be an int >= 1, got 0"),
    (["--windows", "bogus"], "--windows: comma-separated ints >= 0 or 'none', got 'bogus'"),  # (raw ValueError)
    (["--windows", "none,-8"], "--windows: comma-separated ints >= 0 or 'none', got 'none,-8'"),
    (["--json", "{tmp}/no_such_dir/r.json"],  # (failed after the whole run)
     "--json {tmp}/no_such_dir/r.json: its folder does not exist (the results would be lost after the run)"),
])
def test_resync_acceptance_bad_flags(tmp_path, flags, want):
    r = run("resync_acceptance.py", *(f.format(tmp=tmp_path) for f in flags))
    assert_refused(r, "resync_acceptance.py", want.format(tmp=tmp_path))


# ---- make_prompts.py ----

@pytest.mark.parametrize("flags,want", [
    (["--every", "0"], "--every: must be an int >= 1 (keep every n-th question, in question order), got 0"),
    (["--every", "-1"],  # (wrote the questions reversed)
     "--every: must be an int >= 1 (keep every n-th question, in question order), got -1"),
])
def test_make_prompts_bad_every(tmp_path, flags, want):
    out = tmp_path / "p.json"
    assert_refused(run("make_prompts.py", *flags, "--out", str(out)), "make_prompts.py", want)
    assert not out.exists()


def test_make_prompts_writes_every_nth_question(tmp_path):
    from vllm_specla.data import ARTIFACTS  # noqa: PLC0415 (stdlib only: no model, no download)

    cache = os.environ.get("VLLM_SPECLA_DATA") or os.path.join(ROOT, ".cache", "data")
    if not os.path.exists(os.path.join(cache, ARTIFACTS["mtbench"][1])):
        pytest.skip("MT-Bench data not cached (make_prompts.py would download it)")
    out = tmp_path / "new_dir" / "p.json"  # (--out's folder is created, as the docstring's .devdata/)
    r = run("make_prompts.py", "--every", "5", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    prompts = json.loads(out.read_text())
    assert len(prompts) == 16 and all(p and all(type(t) is int and 0 <= t < 8192 for t in p) for p in prompts)
    assert r.stdout.strip().splitlines()[-1] == f"16 prompts, {sum(map(len, prompts))} tokens -> {out}"


# ---- draft_format_acceptance.py ----

@pytest.mark.parametrize("flags,want", [
    # (each was a traceback deep in the runtime, or after the trained pair was built)
    (["--formats", "model,bogus"], "--formats: each must be one of model, fp8, int4-row, int4-gG (G an int >= 1 "
                                   "dividing the draft passes' input widths 384, 512, 768, 1024), got 'bogus'"),
    (["--formats", "int4-g256,int4-g0"], "--formats: each must be one of model, fp8, int4-row, int4-gG (G an int >= 1 "
                                         "dividing the draft passes' input widths 384, 512, 768, 1024), got "
                                         "'int4-g256', 'int4-g0'"),
    (["--ks", "0"], "--ks: comma-separated ints >= 1, got '0'"),
    (["--ks", "4,x"], "--ks: comma-separated ints >= 1, got '4,x'"),
    (["--batch", "0"], "--batch: must be an int >= 1, got 0"),
    (["--steps", "0"], "--steps: must be an int >= 1, got 0"),
    (["--out", "{tmp}/no_such_dir/f.jsonl"],
     "--out {tmp}/no_such_dir/f.jsonl: its folder does not exist (the records would be lost after the run)"),
])
def test_draft_format_acceptance_bad_flags(tmp_path, prompts_file, flags, want):
    r = run("draft_format_acceptance.py", "--prompts", prompts_file, *(f.format(tmp=tmp_path) for f in flags))
    assert_refused(r, "draft_format_acceptance.py", want.format(tmp=tmp_path))


@pytest.mark.parametrize("content,want", [
    (None, "cannot read a JSON list of token lists (FileNotFoundError: [Errno 2] No such file or directory: "
           "'{path}')"),
    ("[[1, 2", "cannot read a JSON list of token lists (JSONDecodeError: Expecting ',' delimiter: line 1 column 7 "
               "(char 6))"),
    ("[]", "expected a non-empty JSON list of token lists"),
    ("[[1, 2], []]", "prompt 1 must be a non-empty list of token ids in [0, 8192), got []"),
    ("[[1, 8192]]", "prompt 0 must be a non-empty list of token ids in [0, 8192), got [1, 8192]"),
])
def test_draft_format_acceptance_bad_prompts(tmp_path, content, want):
    path = tmp_path / "prompts.json"
    if content is not None:
        path.write_text(content)
    r = run("draft_format_acceptance.py", "--prompts", str(path))
    assert_refused(r, "draft_format_acceptance.py", f"--prompts {path}: " + want.format(path=path))


# ---- plot_e2e.py ----

RECORDS = [{"shape": "tiny", "batch": 2, "gpu": "cpu", "mode": "ar", "K": 0, "alpha": None, "tokens_per_s": 100.0,
            "tau": 1.0, "speedup": 1.0},
           {"shape": "tiny", "batch": 2, "gpu": "cpu", "mode": "specla", "K": 2, "alpha": 0.8, "tokens_per_s": 150.0,
            "tau": 2.4, "speedup": 1.5}]


@pytest.mark.parametrize("content,want", [
    (None, "cannot read it (FileNotFoundError: [Errno 2] No such file or directory: '{path}')"),
    ('{"shape":\n', "line 1: not JSON (Expecting value at column 10); expected bench_e2e.py JSON lines, one record "
                    "object per line"),
    ("[]\n", "line 1: expected a JSON object (one bench_e2e.py record per line), got list"),
    (json.dumps(RECORDS) + "\n", "line 1: expected a JSON object (one bench_e2e.py record per line), got list"),
    ("", "no bench_e2e.py records of shape flame, map, tiny (the shapes plotted), got 0 records"),
    ('{"shape": "specla-gdn-tiny (trained pair)", "mode": "ar"}\n',
     "no bench_e2e.py records of shape flame, map, tiny (the shapes plotted), got 1 records"),
    (json.dumps(RECORDS[0]) + "\n" + json.dumps({"shape": "map", "mode": "specla", "speedup": 1.2, "K": 2}) + "\n",
     "line 2: a map record with a speedup needs mode, batch, K, tau, tokens_per_s, alpha; it has no batch, tau, "
     "tokens_per_s, alpha"),
])
def test_plot_e2e_bad_input(tmp_path, content, want):
    path = tmp_path / "e2e.jsonl"
    if content is not None:
        path.write_text(content)
    assert_refused(run("plot_e2e.py", str(path)), "plot_e2e.py", f"jsonl {path}: " + want.format(path=path))


def test_plot_e2e_png_folder_and_valid_table(tmp_path):
    path = tmp_path / "e2e.jsonl"
    path.write_text("".join(json.dumps(r) + "\n\n" for r in RECORDS))  # (blank lines are skipped)
    png = tmp_path / "no_such_dir" / "x.png"
    assert_refused(run("plot_e2e.py", str(path), "--png", str(png)), "plot_e2e.py",
                   f"--png {png}: its folder does not exist")
    r = run("plot_e2e.py", str(path))
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "| tiny | 2 | 0.8 | 2 | 2.40 | 150 | 100 | 1.50 | - | - |"
