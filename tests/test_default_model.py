"""The embedded default pair ``models/specla-gdn-tiny/{target,drafter}`` (CPU, fast).

Checks that the shipped checkpoint loads through our fla-format loaders, that the target still
reaches its measured perplexity on the shipped held-out slice, that the drafter is aligned with
it, that the tokenizer round-trips and renders its chat template, and the size budget.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent / "models" / "specla-gdn-tiny"
TARGET, DRAFTER = ROOT / "target", ROOT / "drafter"

# Measured on this checkpoint (fp32, plain-torch reference path; CPU and GPU agree to 1e-5):
# first 4 held-out sequences (4 x 257 tokens): ppl 28.87; all 32: ppl 35.26. Threshold = x1.1.
HELDOUT_N = 4
PPL_MAX = 31.8
# Teacher-forced depth-1 top-1 agreement of drafter vs target on the first 4 held-out
# sequences, measured 0.550 (0.524 on 64 held-out ShareGPT conversations on GPU).
AGREE_MIN = 0.45

pytestmark = pytest.mark.skipif(not (TARGET / "config.json").exists(), reason="default model not present")


@pytest.fixture(scope="module")
def target():
    from vllm_specla.models.gdn import load_fla_checkpoint

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    return load_fla_checkpoint(str(TARGET), torch.float32, "cpu")


@pytest.fixture(scope="module")
def heldout():
    return json.loads((TARGET / "heldout_val.json").read_text())


@pytest.fixture(scope="module")
def feats(target, heldout):
    """``(ids [4, 257], final features [4, 257, D])`` of the first held-out sequences."""
    ids = torch.tensor(heldout["ids"][:HELDOUT_N])
    with torch.no_grad():
        return ids, target.hidden_sequence(ids)


def test_checkpoints_load(target):
    from vllm_specla.models.drafter import load_eagle_drafter

    cfg = json.loads((TARGET / "config.json").read_text())
    assert cfg["model_type"] == "gated_deltanet" and cfg["vocab_size"] == 8192
    assert cfg["eos_token_id"] == 2 and cfg["bos_token_id"] == 1
    assert json.loads((TARGET / "generation_config.json").read_text())["eos_token_id"] == 2
    assert target.config.num_hidden_layers == 8 and target.lm_head.weight is target.model.embeddings.weight
    dr = load_eagle_drafter(str(DRAFTER), torch.float32, "cpu")
    assert dr.config.num_hidden_layers == 1 and dr.config.hidden_size == target.config.hidden_size
    assert dr.fc.weight.shape == (384, 768)


@torch.no_grad()
def test_heldout_perplexity(target, heldout, feats):
    ids, f = feats
    assert ids.shape == (HELDOUT_N, heldout["seqlen"])
    logits = target.compute_logits(f)
    nll = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).item()
    ppl = math.exp(nll)
    assert math.isfinite(ppl) and ppl < PPL_MAX, ppl


@torch.no_grad()
def test_drafter_agrees_with_target(target, feats):
    from vllm_specla.models.drafter import load_eagle_drafter

    dr = load_eagle_drafter(str(DRAFTER), torch.float32, "cpu")
    ids, f = feats
    fh = dr.forward_sequence(ids[:, 1:], f[:, :-1], target.model.embeddings)
    agree = (target.compute_logits(fh).argmax(-1) == target.compute_logits(f[:, 1:]).argmax(-1)).float().mean().item()
    print(f"teacher-forced depth-1 agreement {agree:.3f}")
    assert agree > AGREE_MIN, agree


def test_tokenizer_roundtrip_and_chat_template():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TARGET))
    assert (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id, tok.pad_token_id) == (1, 2, 0, 3)
    assert len(tok) == 8192
    text = "Hello, world!\ndef f(x):\n    return x ** 2  # ü 日本 🙂"
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(ids) == text
    assert tok(text).input_ids[0] == 1  # bos added by the post-processor
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    s = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert s == ("<s><|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello!</s>\n"
                 "<|user|>\nBye\n<|assistant|>\n")
    enc = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    enc = enc["input_ids"] if isinstance(enc, dict) or hasattr(enc, "keys") else enc
    assert enc[0] == 1 and enc.count(1) == 1 and 2 in enc
    assert enc[-2:] == tok("<|assistant|>\n", add_special_tokens=False).input_ids


def test_size_budget():
    files = [p for p in ROOT.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= 48_000_000
    for p in files:
        if p.suffix == ".safetensors":
            assert p.stat().st_size <= 15_000_000, p
    assert (TARGET / "heldout_val.json").stat().st_size <= 200_000
