"""Frequency-ranked draft vocabulary (``core/draft_vocab.py``, ``draft_vocab_size``), CPU, fp32.

The ranking and its file, the draft LM-head rows against the full logits' columns (exact in fp32: the same dot products), the config field's errors, and greedy
losslessness with a draft vocabulary in the vLLM-free core engine and the decode runtime.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter

import numpy as np
import pytest
import torch

pytest.importorskip("pydantic", reason="SpecLAConfig needs pydantic (the GPU machine has none; CI does)")

from vllm_specla.config import SpecLAConfig, SpecLAConfigError  # noqa: E402
from vllm_specla.core.draft_vocab import (  # noqa: E402
    TOKEN_COUNTS_FILE,
    DraftHead,
    count_tokens,
    draft_head,
    draft_logits_fn,
    draft_vocab_ids,
    load_token_counts,
    save_token_counts,
)

PAIR = "models/specla-gdn-tiny"


def test_ids_are_the_most_frequent_in_ascending_order_ties_to_lower_id():
    counts = [5, 0, 9, 5, 1, 9, 2, 5]
    assert draft_vocab_ids(counts, 1).tolist() == [2]
    assert draft_vocab_ids(counts, 2).tolist() == [2, 5]
    assert draft_vocab_ids(counts, 4).tolist() == [0, 2, 3, 5]  # 5 ties at ids 0, 3, 7: lower ids first
    assert draft_vocab_ids(counts, 8).tolist() == list(range(8))
    g = torch.Generator().manual_seed(0)
    c = torch.randint(0, 50, (300,), generator=g)
    ids = draft_vocab_ids(c, 40)
    assert ids.tolist() == sorted(ids.tolist()) and len(set(ids.tolist())) == 40
    assert int(c[ids].min()) >= int(c[[i for i in range(300) if i not in set(ids.tolist())]].max())
    for bad in (0, 9, 2.5, 2.0, True, "2", None):  # (2.5 was a TypeError from slicing, True taken as 1)
        with pytest.raises(ValueError, match=re.escape(f"size must be an integer 1..8 (the vocabulary size), "
                                                       f"got {bad!r}")):
            draft_vocab_ids(counts, bad)
    assert draft_vocab_ids(counts, np.int64(2)).tolist() == [2, 5]
    with pytest.raises(ValueError, match="non-negative"):
        draft_vocab_ids([1, -1], 1)


def test_count_tokens_and_file_round_trip(tmp_path):
    seqs = [[1, 2, 2, 7], [], [7, 7, 0]]
    counts = count_tokens(seqs, 9)
    ref = Counter(t for s in seqs for t in s)
    assert counts == [ref.get(i, 0) for i in range(9)]
    with pytest.raises(ValueError, match="outside 0..8"):
        count_tokens([[9]], 9)
    save_token_counts(str(tmp_path), counts, "unit test")
    raw = json.loads((tmp_path / TOKEN_COUNTS_FILE).read_text())
    assert raw["vocab_size"] == 9 and raw["total"] == 7 and raw["source"] == "unit test"
    assert load_token_counts(str(tmp_path), 9) == counts
    with pytest.raises(ValueError, match="counts 9 tokens but the target vocabulary has 10"):
        load_token_counts(str(tmp_path), 10)
    with pytest.raises(FileNotFoundError, match="count_tokens.py"):
        load_token_counts(str(tmp_path / "nowhere"))
    (tmp_path / TOKEN_COUNTS_FILE).write_text("{\"counts\": 3}")
    with pytest.raises(ValueError, match="not a token-counts file"):
        load_token_counts(str(tmp_path))
    save_token_counts(str(tmp_path), [0, 0, 0], "nothing")
    with pytest.raises(ValueError, match="not all zero"):
        load_token_counts(str(tmp_path))


def test_draft_logits_equal_the_full_logits_columns():
    g = torch.Generator().manual_seed(1)
    V, D, N = 50, 16, 7
    W = torch.randn(V, D, generator=g)
    ids = draft_vocab_ids(torch.randint(0, 100, (V,), generator=g), 12)
    head = DraftHead(W, ids, V)
    f = torch.randn(N, D, generator=g)
    full = f @ W.T
    dl = f @ head.weight.T
    # the head holds exactly the draft ids' rows; the two GEMMs (12 vs 50 output columns) may sum in another
    # order on some CPUs (a clean-clone CI run saw a 1-ulp difference), so the logits match to fp32 tolerance
    assert torch.equal(head.weight, W[ids])
    torch.testing.assert_close(dl, full[:, ids])
    masked = full.masked_fill(~torch.isin(torch.arange(V), ids), float("-inf"))
    # greedy draft token: the id of the draft argmax == the argmax of the masked full logits
    assert torch.equal(head.to_target(dl.argmax(-1)), masked.argmax(-1))
    # ties: the lowest id, as the masked full argmax (ids ascending)
    tied = torch.zeros(2, ids.numel())
    assert torch.equal(head.to_target(tied.argmax(-1)), torch.full((2,), int(ids[0])))
    # the two logits_fn forms (whole head on this process / None: a TP shard or quantized head,
    # the full logits' ids columns) agree
    full_fn = lambda x: x @ W.T  # noqa: E731
    whole = draft_logits_fn(full_fn, W, ids, V)
    shard = draft_logits_fn(full_fn, None, ids, V)
    torch.testing.assert_close(whole(f), full[:, ids])  # its own GEMM (above)
    assert torch.equal(shard(f), full[:, ids])  # the full logits' columns themselves
    # every id: no draft head (the full head serves, with no copy)
    assert draft_head(W, torch.arange(V), V) is None and draft_head(W, None, V) is None
    assert torch.equal(draft_head(W, ids, V).weight, W[ids])
    for bad in (torch.tensor([3, 3]), torch.tensor([5, 2]), torch.tensor([V]), torch.tensor([], dtype=torch.int64)):
        with pytest.raises(ValueError, match="strictly ascending"):
            DraftHead(W, bad, V)
        with pytest.raises(ValueError, match="strictly ascending"):
            draft_logits_fn(full_fn, None, bad, V)


def _cfg(**kw):
    return SpecLAConfig.parse(dict(num_speculative_tokens=3, drafter=f"{PAIR}/drafter", **kw))


def test_config_field(tmp_path):
    cfg = _cfg(draft_vocab_size=1024)
    assert cfg.check_drafter(8192) == "eagle"
    ids = cfg.draft_vocab_ids(8192, "eagle")
    counts = torch.tensor(load_token_counts(f"{PAIR}/drafter"))
    assert ids.numel() == 1024 and int(counts[ids].min()) >= int(counts.sort(descending=True).values[1023])
    assert _cfg().draft_vocab_ids(8192, "eagle") is None
    assert _cfg(draft_vocab_size=8192).draft_vocab_ids(8192, "eagle") is None  # the whole vocabulary: nothing to do
    for bad in (0, True, "abc"):
        with pytest.raises(SpecLAConfigError, match="draft_vocab_size"):
            _cfg(draft_vocab_size=bad)
    with pytest.raises(SpecLAConfigError, match=r"draft_vocab_size: size must be an integer 1..8192"):
        _cfg(draft_vocab_size=8193).check_drafter(8192)
    # an EAGLE drafter without token counts: the error says which file and how to write it
    d = tmp_path / "drafter"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"specla_drafter": "eagle", "vocab_size": 8192}))
    bad = SpecLAConfig.parse(dict(num_speculative_tokens=3, drafter=str(d), draft_vocab_size=64))
    with pytest.raises(SpecLAConfigError, match="token_counts.json.*count_tokens.py"):
        bad.check_drafter(8192)
    # a tree level needs tree_top_k distinct draft tokens
    with pytest.raises(SpecLAConfigError, match="draft_vocab_size=2 is below tree_top_k=4"):
        _cfg(draft_vocab_size=2, topology="tree", tree_top_k=4).check_drafter(8192)
    # a draft model reads its own LM head: no draft vocabulary
    dm = SpecLAConfig.parse(dict(num_speculative_tokens=3, drafter=f"{PAIR}/target", draft_vocab_size=64))
    with pytest.raises(SpecLAConfigError, match="only EAGLE drafters"):
        dm.check_drafter(8192)


def test_embedded_drafter_ships_token_counts():
    raw = json.load(open(os.path.join(PAIR, "drafter", TOKEN_COUNTS_FILE)))
    assert raw["vocab_size"] == len(raw["counts"]) == 8192 and raw["total"] == sum(raw["counts"]) > 10_000_000
    assert "ShareGPT" in raw["source"]


@pytest.fixture(scope="module")
def models():
    from vllm_specla.models.drafter import load_eagle_drafter
    from vllm_specla.models.gdn import load_fla_checkpoint

    return load_fla_checkpoint(f"{PAIR}/target"), load_eagle_drafter(f"{PAIR}/drafter")


def _prompts(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(7, 8000, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.mark.parametrize("size", [64, 1024])
def test_core_engine_greedy_equals_ar_with_draft_vocab(models, size):
    from helpers import assert_greedy_equal
    from vllm_specla.core.drafting import EagleDrafterRunner
    from vllm_specla.runtime.engine import SpecLAEngine

    tm, dm = models
    prompts, max_tokens = _prompts(4, 3), [20, 9, 16, 12]
    ar = SpecLAEngine(tm, max_batch=4).generate(prompts, max_tokens)
    ids = _cfg(draft_vocab_size=size).draft_vocab_ids(8192, "eagle")
    runner = EagleDrafterRunner.for_target(dm, tm, 4, draft_vocab=ids)
    drafted = []
    inner = runner._run

    def spy(*a, **kw):
        f, lg = inner(*a, **kw)
        assert lg.shape[-1] == size  # logits over the draft vocabulary only
        drafted.append(runner.draft_ids[lg.argmax(-1)])
        return f, lg

    runner._run = spy
    eng = SpecLAEngine(tm, runner, num_speculative_tokens=3, max_batch=4)
    out = eng.generate(prompts, max_tokens)
    assert assert_greedy_equal(tm, prompts, ar, out) == 0
    assert bool(torch.isin(torch.cat(drafted), ids).all())  # every draft token is in the draft vocabulary
    assert eng.stats.mean_acceptance_length > 1.0
    if size == 64:  # the same ids as a list / numpy array (used to fail on .numel()): the same drafts
        for same in (ids.tolist(), ids.numpy()):
            r2 = EagleDrafterRunner.for_target(dm, tm, 4, draft_vocab=same)
            assert torch.equal(r2.draft_ids, ids)
            assert SpecLAEngine(tm, r2, num_speculative_tokens=3, max_batch=4).generate(prompts, max_tokens) == out
        for bad in ([1.0, 2.0], [True, False], [3, 2], "abc", [[1, 2], [3]]):
            with pytest.raises(ValueError, match="strictly ascending integer ids"):
                EagleDrafterRunner.for_target(dm, tm, 4, draft_vocab=bad)
        for bad in (0, -1, 2.0, True):
            with pytest.raises(ValueError, match=rf"max_requests={bad!r}: must be an int >= 1"):
                EagleDrafterRunner.for_target(dm, tm, bad)


def test_count_tokens_script(tmp_path, capsys):
    """``examples/count_tokens.py`` on a text file: the counts file loads at the target's vocabulary
    size (from its config.json) and its counts equal the tokenizer's ids of the text."""
    import sys

    from tokenizers import Tokenizer

    sys.path.insert(0, "examples")
    import count_tokens as ct

    text = "The quick brown fox. The lazy dog; the end.\n" * 3
    (tmp_path / "a.txt").write_text(text)
    out = tmp_path / "drafter"
    out.mkdir()
    ct.main(["--tokenizer", f"{PAIR}/target", "--text", str(tmp_path / "a.txt"), "--out", str(out)])
    counts = load_token_counts(str(out), 8192)
    ids = Tokenizer.from_file(f"{PAIR}/target/tokenizer.json").encode(text, add_special_tokens=False).ids
    assert counts == count_tokens([ids], 8192) and sum(counts) == len(ids) > 0
    args = ["--tokenizer", f"{PAIR}/target", "--text", str(tmp_path / "a.txt"), "--out", str(out)]
    (tmp_path / "b.jsonl").write_text('{"text": "x"}\n{"no": 1}\n')
    (tmp_path / "empty.txt").write_text("")
    for bad, msg in ((args, "exists; pass --force"),  # never overwrite a counts file silently
                     (args[:4] + ["--out", str(tmp_path / "no")], "is not a directory"),
                     (["--tokenizer", str(tmp_path)] + args[2:] + ["--force"], "no tokenizer.json"),
                     (args[:2] + ["--text", str(tmp_path / "b.jsonl"), "--out", str(out), "--force"], "b.jsonl:2"),
                     (args[:2] + ["--text", str(tmp_path / "nope.txt"), "--out", str(out), "--force"], "nope.txt"),
                     (args[:2] + ["--text", str(tmp_path / "empty.txt"), "--out", str(out), "--force"], "no tokens"),
                     (args + ["--force", "--limit", "3"], "--limit applies to --sharegpt only"),
                     (args + ["--force", "--vocab-size", "0"], "argument --vocab-size: must be an integer >= 1, "
                                                               "got '0'"),
                     (args + ["--force", "--vocab-size", "10"], "the tokenizer has 8192 ids but the vocabulary size "
                                                                "is 10 (--vocab-size)"),
                     (["--sharegpt", "--limit", "-1"] + args[:2] + args[4:] + ["--force"],
                      "argument --limit: must be an integer >= 1, got '-1'")):
        with pytest.raises(SystemExit):
            ct.main(bad)
        assert msg in capsys.readouterr().err
    ct.main(args + ["--force"])
    assert load_token_counts(str(out), 8192) == counts


def test_core_tree_with_draft_vocab_smaller_than_top_k(models):
    """A draft vocabulary smaller than the tree's top_k: the core engine refuses it as the vLLM config does
    (draft_vocab_size >= tree_top_k; it used to run, accepting ~1.04 tokens a step), naming both; equal sizes run
    lossless. The drafter on its own still makes no nodes of the -inf logits outside its vocabulary."""
    from helpers import assert_greedy_equal
    from vllm_specla.core.drafting import DraftRow, EagleDrafterRunner, TreeSpec
    from vllm_specla.runtime.engine import SpecLAEngine

    tm, dm = models
    prompts, max_tokens = _prompts(3, 4), [14, 9, 11]
    spec = TreeSpec(top_k=4, max_depth=3)
    ids = _cfg(draft_vocab_size=2).draft_vocab_ids(8192, "eagle")
    runner = EagleDrafterRunner.for_target(dm, tm, 3, draft_vocab=ids)
    with pytest.raises(ValueError, match=re.escape("drafter: its draft vocabulary has 2 tokens (draft_vocab), fewer "
                                                   "than tree.top_k=4: a tree level needs top_k distinct draft "
                                                   "tokens")):
        SpecLAEngine(tm, runner, num_speculative_tokens=3, max_batch=3, tree=spec)
    SpecLAEngine(tm, runner, num_speculative_tokens=3, max_batch=3)  # (chains: any draft vocabulary)
    runner.enable_trees(spec.top_k)
    rows = []
    for i, p in enumerate(prompts):
        with torch.no_grad():
            f = tm.hidden_sequence(torch.tensor([p]))[0]
        rows.append(DraftRow(slot=i, tokens=p[1:] + [int(tm.compute_logits(f[-1:]).argmax())], feats=f, fresh=True,
                             num_drafts=3))
    nodes = [t for tr in runner.step_tree(rows, spec) for t in tr.tokens[1:]]
    assert nodes and set(nodes) <= set(ids.tolist())
    ar = SpecLAEngine(tm, max_batch=3).generate(prompts, max_tokens)
    ids4 = _cfg(draft_vocab_size=4).draft_vocab_ids(8192, "eagle")
    eng = SpecLAEngine(tm, EagleDrafterRunner.for_target(dm, tm, 3, draft_vocab=ids4), num_speculative_tokens=3,
                       max_batch=3, tree=spec)
    assert assert_greedy_equal(tm, prompts, ar, eng.generate(prompts, max_tokens)) == 0


def test_runtime_draft_vocab_lossless_and_full_size_is_identity(models):
    from vllm_specla.runtime.decode import DecodeRuntime
    from vllm_specla.runtime.fused_model import FusedEagle, FusedTarget

    from helpers import runtime_ar_outputs

    tm, dm = models
    tgt = FusedTarget(tm, torch.float32, "cpu")
    B, K = 3, 3
    prompts = torch.randint(7, 8000, (B, 6), generator=torch.Generator().manual_seed(5))
    ref = runtime_ar_outputs(tgt, prompts, 30, 40)
    outs, taus = {}, {}
    ids512 = _cfg(draft_vocab_size=512).draft_vocab_ids(8192, "eagle")
    for name, ids in (("none", None), ("full", torch.arange(8192)), ("512", ids512)):
        dr = FusedEagle(dm, tgt, torch.float32, "cpu", draft_vocab=ids)
        assert dr.draft_vocab_size == (8192 if ids is None else ids.numel())
        rt = DecodeRuntime(tgt, B, "specla", K, dr, output_capacity=40)
        rt.prefill(prompts)
        r = rt.run(8)
        outs[name], taus[name] = rt.outputs(), r.mean_acceptance_length
        for a, b in zip(ref, outs[name]):
            n = min(len(a), len(b))
            assert n >= 9 and a[:n] == b[:n]
        if ids is not None:
            assert bool(torch.isin(rt.window[:, 1:].flatten(), ids).all())
    assert outs["full"] == outs["none"] and taus["full"] == taus["none"]  # Vd = V drafts the same tokens
    small = FusedEagle(dm, tgt, torch.float32, "cpu", draft_vocab=ids512[:3])
    with pytest.raises(ValueError, match="tree_width=4 exceeds the drafter's draft vocabulary"):
        DecodeRuntime(tgt, B, "specla", K, small, tree_width=4)


def test_proposer_reads_the_lm_head_rows_only_when_it_holds_all_of_them():
    """The vLLM proposer's choice (``SpeclaProposer._whole_lm_head``): the LM-head weight at tensor
    parallelism 1 with an unquantized head (vLLM's ``UnquantizedEmbeddingMethod``); None (the full
    logits' columns) under TP or a quantized head."""
    from types import SimpleNamespace

    from vllm_specla.worker.proposer import SpeclaProposer

    class UnquantizedEmbeddingMethod:  # the class names vLLM uses
        pass

    class Fp8LinearMethod:
        pass

    w = torch.zeros(4, 2)

    def whole(tp, quant):
        self = SimpleNamespace(vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(tensor_parallel_size=tp)))
        head = SimpleNamespace(weight=w, quant_method=quant)
        return SpeclaProposer._whole_lm_head(self, SimpleNamespace(lm_head=head))

    assert whole(1, UnquantizedEmbeddingMethod()) is w
    assert whole(2, UnquantizedEmbeddingMethod()) is None
    assert whole(1, Fp8LinearMethod()) is None
    assert whole(1, None) is w  # a plain module without a quant method
