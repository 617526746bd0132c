"""CPU smoke run of the default-model training scripts (tokenizer -> target -> drafter), so they don't rot.

Runs ``examples/train_tokenizer.py --tiny``, ``examples/train_target.py --device cpu --tiny
--steps 2`` (our plain-torch model) and ``examples/train_drafter.py --device cpu --tiny --steps 2``
as subprocesses and loads what they wrote with the library loaders.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EX = REPO / "examples"


def _data_available() -> bool:
    try:
        from vllm_specla.data import fetch

        fetch("sharegpt")
        fetch("shakespeare")
        fetch("mtbench")
        fetch("humaneval")
        return True
    except Exception:
        return False


def _run(args: list[str], timeout: float = 120) -> str:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="2")
    r = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{args[0]} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.mark.skipif(not _data_available(), reason="pinned data artifacts unavailable (offline)")
def test_train_scripts_smoke(tmp_path):
    import torch

    tok, data, tgt, dr = tmp_path / "tok", tmp_path / "data", tmp_path / "target", tmp_path / "drafter"
    _run([str(EX / "train_tokenizer.py"), "--out", str(tok), "--tiny"])
    assert (tok / "tokenizer.json").exists() and (tok / "tokenizer_config.json").exists()
    out = _run([str(EX / "train_target.py"), "--tokenizer", str(tok), "--data", str(data), "--out", str(tgt),
                "--device", "cpu", "--tiny", "--steps", "2"])
    assert "val:" in out
    log = json.loads((tgt / "train_log.json").read_text())
    assert log["steps"] == 2 and log["backend"] == "ours" and log["fast_vs_reference"]["rel_err"] < 1e-4
    _run([str(EX / "train_drafter.py"), "--target", str(tgt), "--data", str(data), "--out", str(dr),
          "--device", "cpu", "--tiny", "--steps", "2"])
    dlog = json.loads((dr / "drafter_log.json").read_text())
    assert dlog["steps"] == 2 and "chain_mtbench" in dlog["eval"]

    from vllm_specla.models.drafter import load_eagle_drafter
    from vllm_specla.models.gdn import load_fla_checkpoint

    t = load_fla_checkpoint(str(tgt))
    d = load_eagle_drafter(str(dr))
    ids = torch.tensor([json.loads((tgt / "heldout_val.json").read_text())["ids"][0]])
    f = t.hidden_sequence(ids)
    assert d.forward_sequence(ids[:, 1:], f[:, :-1], t.model.embeddings).shape == f[:, 1:].shape
