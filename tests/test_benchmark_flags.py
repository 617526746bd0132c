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
    (["--prompts", "0"], "--prompts: must be an int in 1..80, got 0"),  # (ran on no prompts: "lossless True")
    (["--prompts", "-2"], "--prompts: must be an int in 1..80, got -2"),  # (was all but the last 2 questions)
    (["--prompts", "81"], "--prompts: must be an int in 1..80, got 81"),  # (MT-Bench has 80: ran on 80 silently)
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
    (["--ks", "0"], "--ks: expected comma-separated integers >= 1, got '0'"),
    (["--ks", "4,x"], "--ks: expected comma-separated integers >= 1, got '4,x'"),
    (["--batch", "0"], "--batch: must be an int >= 1, got 0"),
    (["--steps", "0"], "--steps: must be an int >= 1, got 0"),
    (["--out", "{tmp}/no_such_dir/f.jsonl"],
     "--out {tmp}/no_such_dir/f.jsonl: its folder does not exist (the results would be lost after the run)"),
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


# ---- benchmarks/_flags.py: the list / tuple / output checks every script shares ----

def _parser():
    import argparse  # noqa: PLC0415

    class Refused(Exception):
        pass

    class P(argparse.ArgumentParser):
        def error(self, message):  # (argparse prints and exits 2; the message is what the scripts show)
            raise Refused(message)

    return P(), Refused


def test_flags_parse_list_and_tuple(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    from _flags import check_out, parse_list, parse_tuple  # noqa: PLC0415

    ap, refused = _parser()
    assert parse_list(ap, "--b", " 1, 16 ,,64 ") == [1, 16, 64]
    assert parse_list(ap, "--t", "", allow_empty=True) == []
    assert parse_list(ap, "--w", "0,8", lo=0) == [0, 8]
    assert parse_list(ap, "--a", "0,0.8,1", kind=float, lo=0, hi=1) == [0.0, 0.8, 1.0]
    assert parse_list(ap, "--m", "ar,verify", choices=("verify", "ar")) == ["ar", "verify"]
    assert parse_list(ap, "--s", "default, rows:8:0:4,", kind=str) == ["default", "rows:8:0:4"]
    assert parse_tuple(ap, "--heads", "8x256", 2, sep="x") == (8, 256)
    assert parse_tuple(ap, "--c", "4/1/0/0", 4, lo=0, sep="/") == (4, 1, 0, 0)
    assert parse_tuple(ap, "--c", "4/1/0/0", 4, lo=(1, 1, 0, 0), sep="/") == (4, 1, 0, 0)
    for call, want in [
        (lambda: parse_list(ap, "--b", ""), "--b: give at least one value, got ''"),
        (lambda: parse_list(ap, "--b", " , "), "--b: give at least one value, got ' , '"),
        (lambda: parse_list(ap, "--b", "1,0"), "--b: expected comma-separated integers >= 1, got '1,0'"),
        (lambda: parse_list(ap, "--b", "1,2.5"), "--b: expected comma-separated integers >= 1, got '1,2.5'"),
        (lambda: parse_list(ap, "--k", "9", hi=8), "--k: expected comma-separated integers in [1, 8], got '9'"),
        (lambda: parse_list(ap, "--a", "0.8,nan", kind=float, lo=0, hi=1),
         "--a: expected comma-separated finite numbers in [0, 1], got '0.8,nan'"),
        (lambda: parse_list(ap, "--a", "inf", kind=float, lo=None),
         "--a: expected comma-separated finite numbers, got 'inf'"),
        (lambda: parse_list(ap, "--a", "1.5", kind=float, lo=0, hi=1),
         "--a: expected comma-separated finite numbers in [0, 1], got '1.5'"),
        (lambda: parse_list(ap, "--m", "ar,x,y", choices=("verify", "ar")), "--m: unknown x, y; allowed: verify, ar"),
        (lambda: parse_tuple(ap, "--heads", "8x", 2, sep="x", what="HV x V"),
         "--heads: expected 2 'x'-separated integers >= 1 (HV x V), got '8x'"),
        (lambda: parse_tuple(ap, "--c", "4/1/0", 4, lo=0, sep="/"),
         "--c: expected 4 '/'-separated integers >= 0, got '4/1/0'"),
        (lambda: parse_tuple(ap, "--c", "4/0", 2, sep="/"), "--c: expected 2 '/'-separated integers >= 1, got '4/0'"),
        (lambda: parse_tuple(ap, "--c", "0/1/0/0", 4, lo=(1, 1, 0, 0), sep="/"),
         "--c: expected 4 '/'-separated integers each >= 1/1/0/0, got '0/1/0/0'"),
        (lambda: parse_tuple(ap, "--h", "6,256", 3, what="H,K,V"),
         "--h: expected 3 comma-separated integers >= 1 (H,K,V), got '6,256'"),
        (lambda: parse_list(ap, "--s", ",", kind=str), "--s: give at least one value, got ','"),
        (lambda: check_out(ap, "--out", ROOT), f"--out {ROOT}: is a folder, not a file name"),
        (lambda: check_out(ap, "--out", os.path.join(ROOT, "no_such_dir", "x.json")),
         f"--out {os.path.join(ROOT, 'no_such_dir', 'x.json')}: its folder does not exist (the results would be lost "
         "after the run)"),
    ]:
        with pytest.raises(refused) as e:
            call()
        assert str(e.value) == want
    check_out(ap, "--out", None)
    check_out(ap, "--out", os.path.join(ROOT, "not_written_here.json"))  # (checked, not created)
    assert not os.path.exists(os.path.join(ROOT, "not_written_here.json"))


# ---- the GPU benchmarks and profilers: their flags are checked before any CUDA call (a bad list was a ValueError
# traceback, a missing --out folder lost the results after the run, no GPU a CUDA error deep in a kernel) ----

@pytest.mark.parametrize("script,flags,want", [
    ("ar_breakdown.py", ["--batches", "1,x"], "--batches: expected comma-separated integers >= 1, got '1,x'"),
    ("bench_norms.py", ["--heads", "8x256,8x"], "--heads: expected 2 'x'-separated integers >= 1 (HV x V), got '8x'"),
    ("bench_norms.py", ["--heads", ","], "--heads: give at least one value, got ','"),
    ("bench_conv.py", ["--modes", "verify,bogus"], "--modes: unknown bogus; allowed: verify, ar"),
    ("bench_conv.py", ["--out", "{tmp}/no_such_dir/c.json"],
     "--out {tmp}/no_such_dir/c.json: its folder does not exist (the results would be lost after the run)"),
    ("gemm_nsweep.py", ["--tiles", "8,0"], "--tiles: expected comma-separated integers >= 1, got '8,0'"),
    ("ncu_chain.py", ["--heads", "6,256"], "--heads: expected 3 comma-separated integers >= 1 (H,K,V), got '6,256'"),
    ("bench_prefill.py", ["--ops", "chunk,bogus"], "--ops: unknown bogus; allowed: chunk, conv"),
    ("bench_prefill.py", ["--device", "cpu", "--lens", "512,0"],
     "--lens: expected comma-separated integers >= 1, got '512,0'"),
    ("bench_ut.py", ["--ser-configs", "4/1/32"],
     "--ser-configs: expected 4 '/'-separated integers each >= 1/1/0/0 (BV/WARPS/KI/PREFETCH), got '4/1/32'"),
    ("bench_ut.py", ["--ser-configs", "4/1/32/1,0/0/0/0"],
     "--ser-configs: expected 4 '/'-separated integers each >= 1/1/0/0 (BV/WARPS/KI/PREFETCH), got '0/0/0/0'"),
    ("bench_ut.py", ["--kinds", "ar,steps"], "--kinds: unknown steps; allowed: ar, verify, step, fused, sep, replay"),
    ("bench_ut.py", ["--impls", "", "--ut-configs", ""],
     "--impls / --ut-configs / --ser-configs: give at least one kernel to time"),
    ("step_breakdown.py", ["--modes", "ar,bogus"], "--modes: unknown bogus; allowed: ar, specla, snapshot"),
    ("step_breakdown.py", ["--alpha", "nan"], "--graph must be >= 0 and --alpha in [0, 1], got 0 / nan"),
    ("bench_commit_cuda.py", ["--impls", "cuda,bogus"],
     "--impls: unknown bogus; allowed: cuda, cuda_ut, cuda_ut1, cuda_utv1, cuda_utv2, cuda_utv3, cuda_utp0, "
     "cuda_utp1, cuda_utp2, cuda_utrow, triton, ut"),
    ("bench_commit_cuda.py", ["--recover-config", "8"],
     "--recover-config: expected 2 '/'-separated integers >= 1 (BV/num_warps), got '8'"),
    ("bench_fp8_gemv.py", ["--shapes", "flame,big"], "--shapes: unknown big; allowed: flame, map, tiny"),
    ("bench_blas.py", ["--ms", "1,0"], "--ms: expected comma-separated integers >= 1, got '1,0'"),
    ("bench_csrc_cuda.py", ["--bv", "0,2"], "--bv: unknown 2; allowed: 0, 4, 8"),
    ("bench_csrc_cuda.py", ["--bank-t", "4"],
     "--bank-t: -1 (max(8, largest T)), 0 (each T) or an int >= the largest --Ts (8), got 4"),
])
def test_gpu_benchmarks_check_flags_first(tmp_path, script, flags, want):
    r = run(script, *[f.format(tmp=tmp_path) for f in flags], timeout=120)
    assert_refused(r, script, want.format(tmp=tmp_path))


@pytest.mark.parametrize("script,want", [
    ("ar_breakdown.py", "no CUDA device: this benchmark times a CUDA-graph AR step"),
    ("bench_conv.py", "no CUDA device: this benchmark times GPU kernels"),
    ("bench_ut.py", "no CUDA device: this benchmark times GPU kernels; on a CPU, --dry-cpu runs every path once"),
    ("bench_commit_cuda.py", "no CUDA device: this benchmark times GPU kernels"),
    ("bench_csrc_cuda.py", "no CUDA device: this benchmark times the CUDA chain verify"),
    ("step_breakdown.py", "no CUDA device: this profiles GPU steps; on a CPU, --dry-cpu runs the code path once"),
    ("bench_norms.py", "no CUDA device: this benchmark times GPU kernels"),
    ("gemm_nsweep.py", "no CUDA device: this benchmark times the CUDA skinny GEMM"),
    ("ncu_chain.py", "no CUDA device: this script runs the chain kernels for Nsight Compute"),
    ("bench_fp8_gemv.py", "no CUDA device: this benchmark times GPU GEMVs (sm_89+ for float8)"),
    ("bench_blas.py", "no CUDA device: this benchmark times GPU GEMMs; on a CPU, --dry-cpu runs every setting once"),
    ("bench_prefill.py", "no CUDA device: --device cuda times fla's chunk kernel (--device cpu: the conv rows only)"),
])
def test_gpu_benchmarks_without_cuda_say_so(script, want):
    import torch  # noqa: PLC0415

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA (on a GPU it would run the benchmark)")
    assert_refused(run(script, timeout=120), script, want)


def test_bench_blas_two_shapes_dry_cpu(tmp_path):
    """``bench_blas.py`` over two shapes and two row counts (the list of row counts and the per-setting time once
    shared a name: the second shape crashed, ``'float' object is not iterable``); the dry run builds the tiny shape
    under each name."""
    out = tmp_path / "b.json"
    r = run("bench_blas.py", "--dry-cpu", "--shapes", "flame,map", "--ms", "1,5", "--settings", "default",
            "--layers", "1", "--out", str(out), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [(x["shape"], x["M"]) for x in json.loads(out.read_text())] == [("flame", 1), ("flame", 5), ("map", 1),
                                                                         ("map", 5)]


def test_resync_acceptance_question_count_matches_the_data(monkeypatch):
    """``resync_acceptance.py --prompts`` is bounded by a constant (so a bad flag needs no data download): it must
    be MT-Bench's question count."""
    try:
        from vllm_specla.data import mtbench_questions  # noqa: PLC0415

        n = len(mtbench_questions())
    except Exception as e:  # noqa: BLE001 - the pinned MT-Bench wheel is not cached and cannot be fetched
        pytest.skip(f"MT-Bench questions unavailable: {e}")
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    import resync_acceptance  # noqa: PLC0415

    assert resync_acceptance.MT_BENCH_QUESTIONS == n == 80


@pytest.mark.parametrize("flags,want", [
    (["--alphas", ""], "--alphas: give at least one value (the controlled drafter's acceptance), got ''"),
    (["--snapshot-ks", "4", "--snapshot-alphas", ","], "--snapshot-alphas: give at least one value for the "
                                                       "--snapshot-ks rows, got ''"),
    (["--trained", "--trained-batches", ""], "--trained-batches: give at least one value, got ''"),
])
def test_bench_e2e_empty_grids_refused(flags, want):
    """(an empty --alphas / --snapshot-alphas was an IndexError after the models were built)"""
    assert_refused(run("bench_e2e.py", *flags, timeout=120), "bench_e2e.py", want)
