"""The end-to-end benchmark's code paths on the CPU (tiny shape, eager): every mode runs, every run
is lossless against the AR trace, the auto policy's pick is recorded, and the table script reads
the records. Keeps ``benchmarks/bench_e2e.py`` from rotting between GPU sessions."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("flags,want", [(["--shapes", "nope"], "--shapes: each must be one of flame, map, tiny, got 'nope'"),
                                        (["--batches", "1,0"],
                                         "--batches: expected comma-separated integers >= 1, got '1,0'"),
                                        (["--ks", "0"], "--ks: expected comma-separated integers >= 1, got '0'"),
                                        (["--shapes", "flame,"], None), (["--shapes", ""], "--shapes: each must be one of "
                                                                                          "flame, map, tiny, got ''"),
                                        (["--cuda-csrc", "--no-cuda-csrc"],
                                         "argument --no-cuda-csrc: not allowed with argument --cuda-csrc"),
                                        (["--ks", "abc"], "--ks: expected comma-separated integers >= 1, got 'abc'"),
                                        (["--alphas", "0.8,nan"], "--alphas: expected comma-separated finite "
                                                                  "numbers in [0, 1], got '0.8,nan'"),
                                        (["--steps", "0"], "--steps and --prompt-len: each must be an int >= 1, "
                                                           "got 0 / 16"),
                                        (["--out", "no_such_dir/x.jsonl"], "--out no_such_dir/x.jsonl: its folder "
                                         "does not exist (the results would be lost after the run)")])
def test_bench_e2e_bad_flags_are_one_line_errors(flags, want):
    """(they were tracebacks: KeyError, ZeroDivisionError, ValueError; --steps 0 ran 512 steps; a missing --out
    folder failed after the whole run)"""
    if want is None:  # accepted (a trailing comma is no shape): the --draft-weights check after it fails
        flags, want = [*flags, "--draft-weights", "bogus"], "--draft-weights: each must be one of model, fp8, got bogus"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_e2e.py"), *flags],
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == f"bench_e2e.py: error: {want}"
    assert "Traceback" not in r.stderr


def test_bench_e2e_trained_prompts_are_checked_up_front(tmp_path):
    """``--trained --prompts``: a missing file, bad JSON, ``[]`` and out-of-vocabulary ids are one-line errors before
    any model is built (they were tracebacks: FileNotFoundError, JSONDecodeError, a ZeroDivisionError / IndexError)."""
    files = {"missing": None, "bad": "[[1, 2", "empty": "[]", "oov": "[[1, 2], [3, 8192]]", "flat": "[5, 6]"}
    wants = {"missing": "cannot read a JSON list of token lists (FileNotFoundError",
             "bad": "cannot read a JSON list of token lists (JSONDecodeError",
             "empty": "expected a non-empty JSON list of token lists",
             "oov": "prompt 1 must be a non-empty list of token ids in [0, 8192), got [3, 8192]",
             "flat": "prompt 0 must be a non-empty list of token ids in [0, 8192), got 5"}
    for name, text in files.items():
        path = tmp_path / f"{name}.json"
        if text is not None:
            path.write_text(text)
        r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_e2e.py"), "--trained",
                            "--prompts", str(path), "--out", str(tmp_path / "o.jsonl")],
                           env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=300)
        last = r.stderr.strip().splitlines()[-1]
        assert r.returncode == 2 and last.startswith(f"bench_e2e.py: error: --prompts {path}: ") and wants[name] in last
        assert "Traceback" not in r.stderr and not (tmp_path / "o.jsonl").exists()
    (tmp_path / "ok.json").write_text("[[1, 2]]")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_e2e.py"), "--trained", "--prompts",
                        str(tmp_path / "ok.json"), "--draft-vocabs", "64,99999"],
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        "bench_e2e.py: error: --draft-vocabs: each must be <= the trained pair's vocabulary (8192; 0 = full), "
        "got 64,99999")


@pytest.mark.parametrize("script,flags,want", [
    ("bench_kernels", ["--shapes", "6x256x512,bogus"], "--shapes: unknown bogus; allowed: 6x256x512, 8x256x256"),
    ("bench_kernels", ["--batches", ""], "--batches: give at least one value, got ''"),
    ("bench_kernels", ["--recover-configs", "8"], "--recover-configs: expected BV/num_warps pairs of powers of "
                                                  "two such as 8/2, got '8'"),
    ("bench_kernels", ["--recover-configs", "8/2,6/2"], "--recover-configs: expected BV/num_warps pairs of powers "
                                                        "of two such as 8/2, got '6/2'"),  # (tl.arange's BV)
    ("bench_kernels", [], "no CUDA device: this benchmark times GPU kernels; on a CPU, --dry-cpu runs every path "
                          "once"),
    ("bench_tree", ["--trees", "binary,oak"], "--trees: unknown oak; allowed: binary, beam4, chain_heavy, fork2, "
                                              "fork4"),
    ("bench_tree", ["--nodes", "4,16", "--pending", "17"], "--pending: allowed 0 .. 16 (the factor banks' length: the "
                                                           "largest tree of --nodes), got 17"),
    ("bench_tree", ["--dry-cpu", "--pending", "7"], "--pending: allowed 0 .. 6 (the factor banks' length: the largest "
                                                    "tree of --nodes, 6 with --dry-cpu), got 7"),
    ("bench_tree", [], "no CUDA device: this benchmark times GPU kernels; on a CPU, --dry-cpu runs every path once"),
])
def test_kernel_benchmarks_bad_flags_are_one_line_errors(script, flags, want):
    """(a bogus shape was a KeyError, a bad list a ValueError, no GPU a CUDA assert deep in a kernel)"""
    if want.startswith("no CUDA") and torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA (on a GPU it would run the benchmark)")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", f"{script}.py"), *flags],
                       env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == f"{script}.py: error: {want}"
    assert "Traceback" not in r.stderr


def test_bench_e2e_dry_cpu(tmp_path):
    out = tmp_path / "e2e.jsonl"
    env = dict(os.environ, PYTHONPATH=ROOT)
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_e2e.py"), "--dry-cpu", "--auto",
                    "--out", str(out)], check=True, env=env, capture_output=True, timeout=600)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    modes = {r["mode"] for r in recs}
    assert {"ar", "specla", "snapshot", "specla-auto", "specla-tree"} <= modes
    # the full vocabulary (512) and a 64-token draft vocabulary, for SpecLA and snapshots
    assert {(r["mode"], r["draft_vocab"]) for r in recs if "draft_vocab" in r} == {
        (m, v) for m in ("specla", "snapshot") for v in (512, 64)}
    for r in recs:
        if "lossless_rows" in r:
            done, total = r["lossless_rows"].split("/")
            assert done == total, r
        if r["mode"] == "specla":
            assert r["state_bytes_per_request"]["factors"] > 0 and r["tau"] >= 1.0
        if "draft_weights" in r:  # the dry grid's batch 2 is within the float8 batch limit
            assert r["draft_passes"] == r["draft_weights"], r
        if r["mode"] == "specla-tree":
            assert r["tree_alpha_model"] == "siblings" and r["tau_expected"] > 1.0
    png = tmp_path / "speedup.png"
    table = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "plot_e2e.py"), str(out), "--png",
                            str(png), "--label", "dry run"],
                           check=True, env=env, capture_output=True, text=True, timeout=120).stdout
    assert "| shape | B | alpha |" in table
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


_OOM_DRIVER = """
import sys, torch
sys.path.insert(0, {bench!r})
import bench_e2e
real = bench_e2e.DecodeRuntime
in_auto = []
class OOMRuntime(real):  # runs out of device memory where the test says
    def __init__(self, *a, **kw):
        mode = a[2] if len(a) > 2 else kw.get("mode")
        if {when}:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (test)")
        super().__init__(*a, **kw)
bench_e2e.DecodeRuntime = OOMRuntime
real_auto = bench_e2e.run_auto
def run_auto(*a, **kw):
    in_auto.append(1)
    return real_auto(*a, **kw)
bench_e2e.run_auto = run_auto
sys.argv = ["bench_e2e.py", "--dry-cpu", "--auto", "--out", {out!r}]
bench_e2e.main()
"""


@pytest.mark.parametrize("when,skipped", [
    ('kw.get("tree_width")', {"specla-tree"}),  # a tree run: skipped, the other modes and auto still run
    ('mode == "ar" and not in_auto', {"ar"}),  # the AR run (trace and baseline): the batch is skipped
    ("in_auto", {"specla-auto"}),  # the auto run (whatever K it picked)
])
def test_bench_e2e_out_of_memory_is_skipped(tmp_path, when, skipped):
    """Issue 6: a configuration that does not fit the card is skipped and listed. Where the size check's
    estimate misses and a run raises ``torch.OutOfMemoryError`` (the AR run, a tree run, an auto run,
    as well as the SpecLA / snapshot runs; here the AR, a tree and the auto run), ``bench_e2e.py`` records ``"skipped": "out of memory: ..."``
    for it and goes on with the grid instead of ending the process (s37b's first run lost the rest of
    its grid that way). A stand-in runtime raises it on the CPU dry run."""
    out = tmp_path / "e2e.jsonl"
    code = _OOM_DRIVER.format(bench=os.path.join(ROOT, "benchmarks"), when=when, out=str(out))
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    gone = [x for x in recs if "skipped" in x]
    assert {x["mode"] for x in gone} == skipped, gone
    assert all(x["skipped"].startswith("out of memory: CUDA out of memory.") for x in gone)
    ran = {x["mode"] for x in recs if "skipped" not in x}
    if skipped == {"ar"}:
        assert ran == set()  # nothing of the batch runs without its trace
        assert "other runs, which need its trace and baseline, not run" in gone[0]["skipped"]
    elif skipped == {"specla-auto"}:
        assert {"ar", "specla", "snapshot", "specla-tree"} <= ran and "specla-auto" not in ran
        assert [x["alpha"] for x in gone] == [0.8]
    else:
        assert {"ar", "specla", "snapshot", "specla-auto"} <= ran and "specla-tree" not in ran
        tree = [x for x in gone if x["mode"] == "specla-tree"]
        assert [(x["K"], x["tree_width"], x["nodes"]) for x in tree] == [(2, 2, 5)]


def test_plot_panel_title_names_the_recorded_gpu():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import plot_e2e  # noqa: PLC0415

    recs = [{"shape": "flame", "gpu": "NVIDIA H100 80GB HBM3"}, {"shape": "flame", "gpu": "NVIDIA H100 80GB HBM3"},
            {"shape": "map", "gpu": "NVIDIA H200"}]
    assert plot_e2e.panel_title("flame", recs, "s36a") == (
        "flame: NVIDIA H100 80GB HBM3, CUDA graphs, greedy, acceptance-controlled drafter; s36a")
    assert plot_e2e.panel_title("map", recs).startswith("map: NVIDIA H200, ")
    assert "GPU not recorded" in plot_e2e.panel_title("tiny", recs)


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


def test_bench_blas_dry_cpu(tmp_path):
    """``bench_blas.py``'s settings on tiny CPU tensors (the row GEMV under Triton's interpreter): every
    requested setting is recorded and agrees with the default GEMMs (fp32, tolerance 1e-4). One layer
    (``--layers 1`` of the tiny shape's 2) and row-GEMV configs of 8 output rows per program (the
    interpreter runs programs one by one: BN = 1 took most of this test's 246 s in session 36's CI)
    cover every setting's code path in ~40 s."""
    out = tmp_path / "blas.json"
    env = dict(os.environ, PYTHONPATH=ROOT, TRITON_INTERPRET="1")
    subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_blas.py"), "--dry-cpu", "--shapes", "tiny",
                    "--ms", "1,5", "--layers", "1", "--settings",
                    "default,no_reduced,w_x,rows:8:1024:8,rows:8:0:4,rows-nopdl:8:512:4", "--out",
                    str(out)],
                   check=True, env=env, capture_output=True, timeout=600)
    recs = json.loads(out.read_text())
    got = {(r["M"], r["setting"]) for r in recs}
    assert got == {(1, s) for s in ("default", "no_reduced", "w_x", "rows:8:1024:8", "rows:8:0:4", "rows-nopdl:8:512:4")} | {
        (5, s) for s in ("default", "no_reduced", "rows:8:1024:8", "rows:8:0:4", "rows-nopdl:8:512:4")}
    assert max(r["max_abs_diff_vs_default"] for r in recs) < 1e-4


@pytest.mark.parametrize("var,mod,attr,msg", [
    ("VLLM_SPECLA_GEMV_ROWS", "fused", "USE_GEMV_ROWS", "VLLM_SPECLA_GEMV_ROWS must be '0'"),
    ("VLLM_SPECLA_PDL", "pdl", "ENABLED", "VLLM_SPECLA_PDL must be '0'"),
    ("VLLM_SPECLA_SKINNY_GEMM", "fused", "USE_SKINNY_GEMM", "VLLM_SPECLA_SKINNY_GEMM must be '0'")])
def test_env_switches(var, mod, attr, msg):
    """``VLLM_SPECLA_GEMV_ROWS`` (the row GEMV), ``VLLM_SPECLA_PDL`` (programmatic dependent launch) and
    ``VLLM_SPECLA_SKINNY_GEMM`` (the CUDA skinny GEMM once built):
    unset or empty -> on, ``0`` -> off, anything else -> a ValueError naming the variable and its
    allowed values."""
    code = f"import vllm_specla.ops.{mod} as f; print(f.{attr})"

    def run(val):
        env = dict(os.environ, PYTHONPATH=ROOT)
        env.pop(var, None)
        if val is not None:
            env[var] = val
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)

    assert run(None).stdout.strip() == "True"
    assert run("").stdout.strip() == "True"  # set but empty: the default (the vLLM model imports ops/fused.py)
    assert run("0").stdout.strip() == "False"
    bad = run("yes")
    assert bad.returncode != 0 and msg in bad.stderr


def test_skinny_config_flags():
    """``bench_e2e.py --skinny-gemm`` and ``bench_blas.py skinny:W:U`` take exactly the op's configs
    (``_cpp._SKINNY_CONFIGS``), checked before the build; ``bench_blas.py`` refuses unknown setting
    names and malformed row-GEMV configs too (they used to be timed as cuBLAS under the bogus name)."""
    import argparse  # noqa: PLC0415

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import bench_e2e  # noqa: PLC0415

    for ok in ("on", "off", "8,8", "16,4", "0,0"):
        assert bench_e2e.skinny_flag(ok) == ok
    for bad in ("16,2", "8,8,0", "8", "a,b", "0,4", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="'W,U'"):
            bench_e2e.skinny_flag(bad)
    narrow = bench_e2e.narrow_config_flag("--fp8-narrow")
    assert [narrow(v) for v in ("off", "8,2048,8", "8,0,4")] == ["off", "8,2048,8", "8,0,4"]
    for bad in ("on", "8,2048", "3,2048,8", "8,3000,8", "8,2048,64", "0,2048,8", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="--fp8-narrow must be 'off' or BN,BK,warps"):
            narrow(bad)
    assert [bench_e2e.conv_step_flag(v) for v in ("on", "off", "4,1,256", "16,4,32")] == ["on", "off", "4,1,256",
                                                                                           "16,4,32"]
    for bad in ("yes", "4,1", "3,1,256", "4,64,256", "4,1,0", "4,1,256,1", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="--conv-step must be 'on', 'off' or BV,warps,KI"):
            bench_e2e.conv_step_flag(bad)
    assert [bench_e2e.prefetch_flag(v) for v in ("0", "4", "64")] == [0, 4 << 20, 64 << 20]
    for bad in ("-1", "65", "1.5", "4M", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="--skinny-prefetch must be whole MiB"):
            bench_e2e.prefetch_flag(bad)
    import bench_blas  # noqa: PLC0415

    bench_blas.check_settings(["default", "rows:8:1024:8", "rows-nopdl:4:0:4", "skinny:8:8", "skinny-pf:0:0:4"])
    for bad in ("skinny:16:2", "skinny:8:8:0", "skinny-nopdl:8", "bogus", "", "rows:4:x:4", "rows:4:512",
                "skinny-pf:8:8", "skinny-pf:8:8:0", "skinny-pf:16:2:4"):
        with pytest.raises(SystemExit, match=f"setting {bad!r}"):
            bench_blas.check_settings(["default", bad])
    env = dict(os.environ, PYTHONPATH=ROOT)  # the script checks them before anything else (one run of it)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_blas.py"), "--dry-cpu", "--shapes",
                        "tiny", "--settings", "default,skinny:16:2"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "setting 'skinny:16:2'" in r.stderr


def test_bench_blas_prefetch_chain(monkeypatch):
    """``bench_blas.py skinny-pf:W:U:MB``: every GEMM of the step prefetches the next launched weight
    (layer by layer, the LM head the first layer's, for the next replay), at most MB MiB of it,
    rounded down to 16 bytes; plain ``skinny:W:U`` passes no prefetch. (A stand-in records the calls:
    the op itself is CUDA-only.)"""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import bench_blas  # noqa: PLC0415

    from vllm_specla.ops import _cpp  # noqa: PLC0415

    calls = []

    def fake(x, w, residual=None, out=None, warps=0, unroll=0, pdl=None, prefetch=None, prefetch_bytes=None):
        calls.append((w, prefetch, prefetch_bytes, warps, unroll, pdl))
        y = x @ w.t() + (residual if residual is not None else 0)
        return out.copy_(y) if out is not None else y

    monkeypatch.setattr(_cpp, "skinny_gemm", fake)
    D, F = 32, 48
    layers = [(torch.randn(3 * D, D), torch.randn(D, D), torch.randn(2 * F, D), torch.randn(D, F)) for _ in range(2)]
    head = torch.randn(100, D)
    order = [w for ws in layers for w in ws] + [head]
    for form, mib in (("skinny-pf:8:4:1", 1), ("skinny:8:4", 0)):
        calls.clear()
        fn, _, _ = bench_blas.make_step(layers, head, 5, D, form, "cpu", torch.float32)
        fn()
        assert [c[0] for c in calls] == order and all(c[3:] == (8, 4, True) for c in calls)
        if mib:
            assert [c[1] for c in calls] == order[1:] + order[:1]
            assert [c[2] for c in calls] == [min(mib << 20, n.numel() * 4) // 16 * 16 for n in order[1:] + order[:1]]
        else:
            assert all(c[1] is None and c[2] is None for c in calls)


def test_ncu_sass_stalls_summary(tmp_path):
    """``benchmarks/ncu_sass_stalls.py`` on a small export in Nsight Compute's source-page CSV form: samples
    summed per reason and kernel, the instruction with the most samples of the ranked reason first, a
    reason that is not a column named in the error with the allowed ones, a file without a kernel block
    refused."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import ncu_sass_stalls as ns  # noqa: PLC0415

    hdr = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_long_sb",
           "stall_selected", "stall_long_sb (Not Issued)"]
    rows = [["Kernel Name", "kern_a"], hdr, ["0x10", "LDG.E R1, [R2]", "3", "8", "0", "3", "0"],
            ["0x20", "SHF.L.U32 R3, R1, 0x10, RZ", "9", "1,024", "7", "2", "7"],
            ["0x30", "FSEL R4, R4, RZ, P1", "4", "8", "4", "0", "4"],
            ["Kernel Name", "kern_b"], hdr, ["0x10", "MOV R1, R2", "5", "16", "1", "4", "1"]]
    path = tmp_path / "src.csv"
    path.write_text("\n".join(",".join(f'"{c}"' for c in r) for r in rows) + "\n")
    a, b = [ns.summarise(k, "stall_long_sb", 2) for k in ns.read_kernels(str(path))]
    assert (a["kernel"], a["samples"], a["instructions_executed"]) == ("kern_a", 16, 1040)
    assert a["by_reason"] == {"stall_long_sb": 11, "stall_selected": 5}  # the "(Not Issued)" column not summed
    assert [t["address"] for t in a["top"]] == ["0x20", "0x30"]
    assert a["top"][0]["executed"] == 1024
    assert b["by_reason"] == {"stall_selected": 4, "stall_long_sb": 1}
    with pytest.raises(ValueError, match="stall_bogus.*stall_long_sb, stall_selected"):
        ns.summarise(ns.read_kernels(str(path))[0], "stall_bogus", 2)
    (tmp_path / "empty.csv").write_text('"Address","Source"\n')
    with pytest.raises(ValueError, match="no kernel block"):
        ns.read_kernels(str(tmp_path / "empty.csv"))


def test_ncu_details_metrics(tmp_path):
    """``benchmarks/ncu_details.py`` on a small details-page export: kernel names with commas parsed whole (labelled
    per kernel family), only the wanted metrics, the first of a repeated (launch, metric, unit), ncu's note lines
    before the table skipped; a file without the table refused."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import ncu_details as nd  # noqa: PLC0415

    hdr = ["ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
    rows = [hdr, ["0", "void chain_verify_rg_ar_kernel<bf16, 8, 1, 32>(Params)", "SOL", "Duration", "us", "7.90"],
            ["0", "void chain_verify_rg_ar_kernel<bf16, 8, 1, 32>(Params)", "SOL", "Duration", "us", "9.99"],
            ["0", "void chain_verify_rg_ar_kernel<bf16, 8, 1, 32>(Params)", "SOL", "Registers", "reg", "154"],
            ["1", "_chain_verify_kernel", "Mem", "L2 Hit Rate", "%", "54.7"]]
    path = tmp_path / "d.csv"
    path.write_text("==PROF== note\n" + "\n".join(",".join(f'"{c}"' for c in r) for r in rows) + "\n")
    got = nd.read_metrics(str(path), {"Duration", "L2 Hit Rate"})
    assert got == [("0", "cuda_ar", "Duration", "7.90", "us"), ("1", "triton", "L2 Hit Rate", "54.7", "%")]
    (tmp_path / "bad.csv").write_text('"Address","Source"\n')
    with pytest.raises(ValueError, match="Metric Name"):
        nd.read_metrics(str(tmp_path / "bad.csv"), {"Duration"})


def test_step_breakdown_graph_increments():
    """``step_breakdown.timeline_stats``: each kernel's increment is what it adds to the replay's span
    (overlapped work adds nothing, a gap counts toward the kernel after it), the increments sum to the span,
    families and names are summed per replay, and uneven event counts are reported, not divided."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import step_breakdown as sb  # noqa: PLC0415

    one = [(0.0, 10.0, "void gemv_rows_kernel<8>(float*)"), (8.0, 12.0, "_conv4_verify_kernel"),
           (11.0, 15.0, "_chain_verify_kernel"), (17.0, 30.0, "void gemv_rows_kernel<8>(float*)")]
    evs = one + [(s + 100.0, e + 100.0, n) for s, e, n in one]
    r = sb.timeline_stats(evs, 2)
    assert r["graph_span_us"] == 30.0 and r["graph_kernels"] == 4
    assert r["graph_increments"] == {"gemv_rows_kernel": 25.0, "_conv4_verify_kernel": 2.0,
                                     "_chain_verify_kernel": 3.0}
    assert abs(sum(r["graph_increments"].values()) - 30.0) < 1e-9
    assert r["graph_families"] == {"gemm": 25.0, "conv": 2.0, "recurrent": 3.0}
    assert r["graph_calls"]["gemv_rows_kernel"] == 2.0
    assert r["graph_timeline"][1] == ("_conv4_verify_kernel", 8.0, 12.0)
    assert "graph_error" in sb.timeline_stats(evs[:-1], 2)


def test_bench_vllm_ab_engine_options():
    """``--engine NAME=SPEC[:force_k=K][:resync=W]``: options in any order after the SPEC (whose
    JSON may hold colons), ``resync=none``; a bad value names the option. ``_k_diff``: a round's
    K histogram from the cumulative one."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import bench_vllm_ab as ab
    finally:
        sys.path.pop(0)
    spec = '{"method": "specla", "num_speculative_tokens": "auto", "drafter": "/x:y"}'
    assert ab.parse_engine("ar=none") == ("ar", None, {})
    assert ab.parse_engine(f"a={spec}:resync=32:force_k=0") == ("a", {"method": "specla", "num_speculative_tokens":
                                                                      "auto", "drafter": "/x:y"},
                                                                 {"force_k": 0, "resync": 32})
    assert ab.parse_engine("b=none:resync=none") == ("b", None, {"resync": None})
    hyph = '{"method": "specla", "num-speculative-tokens": "auto", "max-num-speculative-tokens": 12}'
    assert ab.parse_engine(f"h={hyph}:force_k=10")[2] == {"force_k": 10}  # (hyphenated keys, as vLLM takes them)
    fixed = '{"method": "specla", "num_speculative_tokens": 4, "drafter": "/x"}'
    # (force_k on a fixed-K config, or past K_max, used to fail in the worker after the engine's ~30 s start)
    for arg, msg in (("a=none:resync=x", "resync must be an integer or none"),
                     ("a=none:force_k=none", "force_k must be an integer"), ("noequals", "expected NAME=SPEC"),
                     ("a=none:resync=-1", "resync must be an int >= 0 or none, got -1"),
                     ("a=none:force_k=1", r"force_k needs a num_speculative_tokens: \"auto\" config, got none"),
                     (f"a={fixed}:force_k=1", r"force_k needs .* config, got 4"),
                     (f"a={spec}:force_k=9", r"force_k must be in 0..8 \(max_num_speculative_tokens\), got 9"),
                     (f"a={spec}:force_k=-1", r"force_k must be in 0..8"),
                     ("a=[1, 2]", "SPEC must be a JSON object, got list"),
                     ("a=nothere.json", "SPEC 'nothere.json' is no file here; SPEC is none, a JSON file or inline "
                                        "JSON"),  # (was json's "Expecting value: line 1 column 1 (char 0)")
                     ('a={"method": ', "SPEC is none, a JSON file or inline JSON"),
                     ('a={"num-speculative-tokens": "auto", "max-num-speculative-tokens": "12"}:force_k=1',
                      "max_num_speculative_tokens must be an int for force_k, got '12'")):
        with pytest.raises(argparse.ArgumentTypeError, match=msg):
            ab.parse_engine(arg)
    # one round's K histogram per batch bucket: cumulative counts now minus before, zeros dropped
    before = {16: {0: 10, 1: 2}, 4: {2: 3}}
    now = {16: {0: 25, 1: 2, 2: 1}, 4: {2: 3}, 1: {4: 5}}
    assert ab._k_diff(now, before) == {"16": {"0": 15, "2": 1}, "1": {"4": 5}}
    assert ab._k_diff(now, None) == {"16": {"0": 25, "1": 2, "2": 1}, "4": {"2": 3}, "1": {"4": 5}}
    assert ab._k_diff(None, before) == {}


@pytest.mark.vllm
def test_bench_vllm_ab_small(tmp_path):
    """The vLLM A/B script runs its engines round by round, pins "auto" engines at K = 1 / 0 with
    force_k, counts each engine's drafts, checks outputs against the first engine and writes
    per-round ratios and the policy's model; a malformed
    --engine is a one-line argparse error."""
    pytest.importorskip("vllm")
    script = os.path.join(ROOT, "benchmarks", "bench_vllm_ab.py")
    env = dict(os.environ, PYTHONPATH=ROOT, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="WARNING")
    auto = json.dumps({"method": "specla", "num_speculative_tokens": "auto", "max_num_speculative_tokens": 2,
                       "drafter": "models/specla-gdn-tiny/drafter"})
    out = tmp_path / "ab.json"
    subprocess.run([sys.executable, script, "--rounds", "2", "--num-prompts", "3", "--max-tokens", "6",
                    "--max-num-seqs", "2", "--engine", "ar=none", "--engine", f"k1={auto}:force_k=1",
                    "--engine", f"k0={auto}:force_k=0:resync=0",
                    "--json-out", str(out)], check=True, env=env, capture_output=True, timeout=600)
    rec = json.loads(out.read_text())
    ar, k1, k0 = rec["engines"]
    assert [ar["engine"], k1["engine"], k0["engine"]] == ["ar", "k1", "k0"] and k0["identical"] and k1["identical"]
    assert len(k0["seconds"]) == len(k0["speed_vs_base"]) == 2 and ar["speed_vs_base"] == [1.0, 1.0]
    assert k0["output_tokens"] == ar["output_tokens"] == 3 * 6
    assert k0["draft_tokens"] == 0 and ar["draft_tokens"] is None  # force_k=0 pinned the policy
    # per engine (the worker's counters), though the K = 0 engine started last: every request of
    # each round (3 prompts x 2 rounds) drafts at least once before its 6 tokens are out
    assert k1["draft_tokens"] >= 2 * 3
    assert rec["args"]["engine"][2].endswith(":force_k=0:resync=0")
    # the policy's model as the worker ends (force_k pins choose(), not the cost model), and the K
    # histogram per round (empty while pinned: the pinned choice does not reach the policy)
    assert ar["policy_model"] is None and ar["k_by_batch_per_round"] is None
    assert k1["k_by_batch_per_round"] == [{}, {}]
    pm = k1["policy_model"]
    assert set(pm) == {"by_batch", "step_costs", "draft_costs", "switch_costs", "alpha"} and len(pm["alpha"]) == 2
    assert set(pm["by_batch"]["1"]["rate_vs_ar"]) == {"1", "2"}
    assert any("2" in row for row in pm["step_costs"].values())  # K = 1 verify steps were timed
    bad = subprocess.run([sys.executable, script, "--engine", "no-equals-sign"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "expected NAME=SPEC[:force_k=K]" in bad.stderr
    # checked before any engine starts (a duplicate name merged two engines' timings; --rounds 0 failed on an empty
    # median after the engines' start; a missing --json-out folder after the whole run)
    for flags, msg in ((["--engine", "a=none", "--engine", "a=none"],
                        "--engine: names must differ, got a more than once"),
                       (["--engine", "a=none", "--rounds", "0"], "--rounds: must be an int >= 1, got 0"),
                       (["--engine", "a=none", "--num-prompts", "81"],
                        "--num-prompts: must be an int in 1..80, got 81"),
                       (["--engine", "a=none", "--json-out", "no_such_dir/x.json"],
                        "--json-out no_such_dir/x.json: its folder does not exist")):
        bad = subprocess.run([sys.executable, script, *flags], env=env, capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and msg in bad.stderr.strip().splitlines()[-1], bad.stderr[-500:]


@pytest.mark.parametrize("datasets,message", [("mtbnech", "'mtbnech': allowed datasets: mtbench, humaneval"),
                                              ("mtbench,", "'': allowed datasets: mtbench, humaneval"),
                                              (["--ks", "4,0"], "argument --ks: '4,0': comma-separated ints in 1..16"),
                                              (["--temperatures", "0,x"], "argument --temperatures: '0,x': "
                                                                          "comma-separated finite numbers >= 0 (0 = "
                                                                          "greedy)"),
                                              (["--max-tokens", "0"], "argument --max-tokens: '0': an int >= 1"),
                                              (["--json", "no_such_dir/a.json"], "--json no_such_dir/a.json: its "
                                               "folder does not exist (the results would be lost after the run)")])
def test_acceptance_script_refuses_unknown_datasets(datasets, message):
    """``acceptance.py --datasets`` names its choices: a misspelt name used to run HumanEval's prompts under it.
    The other flags too, before any engine starts (a bad --ks / --temperatures used to fail after the first engine's
    start and its first K's runs; a missing --json folder after the whole run)."""
    flags = datasets if isinstance(datasets, list) else ["--datasets", datasets]
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "acceptance.py"), *flags],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(message), r.stderr[-2000:]
