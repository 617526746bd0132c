#!/usr/bin/env python3
"""One-shot build of the embedded default pair ``models/specla-gdn-tiny/{target,drafter}`` on a GPU.

Runs in one process (so Triton kernels compile once): ``train_target.main`` until
``--target-until`` seconds after start, then ``train_drafter.main`` (self-distillation for
``--gen-seconds``, training until ``--drafter-until``, evaluation), and copies the results into
``--export`` as at most 6 files: the weight shards, ``meta.tar`` (configs, tokenizer, logs,
held-out slice) and nothing else. The tokenizer and the corpus are prepared beforehand on CPU::

    python examples/train_tokenizer.py --out .cache/specla/tokenizer
    python -c "import sys; sys.path.insert(0, 'examples'); from specla_train_lib import prepare_corpus; \\
               prepare_corpus('.cache/specla/tokenizer', '.cache/specla/corpus')"
    python examples/build_default_model.py --tokenizer .cache/specla/tokenizer \\
           --data .cache/specla/corpus --work .cache/specla/build --export "${OUT:-.cache/specla/export}"
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

T0 = time.time()


def export(work: str, dest: str) -> None:
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(os.path.join(dest, "meta.tar"), "w") as tar:
        for sub in ("target", "drafter"):
            d = os.path.join(work, sub)
            if not os.path.isdir(d):
                continue
            for f in sorted(os.listdir(d)):
                p = os.path.join(d, f)
                if f.endswith(".safetensors"):
                    shutil.copy(p, os.path.join(dest, f"{sub}__{f}"))
                else:
                    tar.add(p, arcname=f"{sub}/{f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--export", required=True)
    ap.add_argument("--target-until", type=float, default=290.0)
    ap.add_argument("--gen-seconds", type=float, default=30.0)
    ap.add_argument("--drafter-until", type=float, default=460.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (local smoke run)")
    ap.add_argument("--backend", choices=["ours", "fla"], default="ours")
    ap.add_argument("--oracle-until", type=float, default=0.0,
                    help="if > 0: run oracle_fla_check.py in a subprocess, killed at this many seconds")
    args = ap.parse_args(argv)
    import train_drafter  # noqa: PLC0415
    import train_target  # noqa: PLC0415

    tdir, ddir = os.path.join(args.work, "target"), os.path.join(args.work, "drafter")
    extra = ["--backend", args.backend] + (["--tiny"] if args.tiny else [])
    rc = 0
    try:
        train_target.main(["--tokenizer", args.tokenizer, "--data", args.data, "--out", tdir,
                           "--device", args.device, "--deadline", str(T0 + args.target_until), *extra])
    except Exception:
        traceback.print_exc()
        rc = 1
    export(args.work, args.export)
    print(f"[build] target stage done at {time.time() - T0:.0f}s", flush=True)
    have_target = os.path.exists(os.path.join(tdir, "config.json")) and any(
        f.endswith(".safetensors") for f in os.listdir(tdir))
    if have_target:
        try:
            train_drafter.main(["--target", tdir, "--data", args.data, "--out", ddir, "--device", args.device,
                                "--deadline", str(T0 + args.drafter_until), "--gen-seconds", str(args.gen_seconds),
                                *extra])
        except Exception:
            traceback.print_exc()
            rc = 2
        export(args.work, args.export)
    left = args.oracle_until - (time.time() - T0)
    if args.oracle_until > 0 and left > 10 and have_target:
        import subprocess  # noqa: PLC0415

        print(f"[build] fla oracle check, {left:.0f}s allowed", flush=True)
        try:
            subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "oracle_fla_check.py"),
                            "--ckpt", tdir, "--out", os.path.join(args.export, "oracle_fla.json"),
                            "--device", args.device], timeout=left)
        except subprocess.TimeoutExpired:
            print("[build] fla oracle check timed out", flush=True)
    print(f"[build] done rc={rc} at {time.time() - T0:.0f}s", flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
