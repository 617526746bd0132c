"""End-to-end decode benchmark on one GPU: AR vs SpecLA chain vs per-token snapshots (issue 6).

Runs the vLLM-free runtime (``vllm_specla/runtime/decode.py``) with every step captured in a CUDA
graph, side by side in one process: for each model shape and batch size it records the AR greedy
trace of random prompts, times AR, then times SpecLA (and the snapshot baseline) with the
acceptance-controlled drafter for each K and alpha, checks that every run emitted exactly the AR
tokens, and appends one JSON record per run to ``--out``.

Shapes (GPU_BASELINE.md, DATA.md §3): ``flame`` = fla/flame GDN 1B (21 layers, 6 x 256 x 512
heads), ``map`` = m-a-p 1.3B pure GDN (24 layers, 8 x 256 x 256 heads); hidden 2048, MLP 5632,
vocab 32000, bf16 weights, fp32 states. Random weights: normal(0.02) projections, residual
projections (``o_proj``, ``down_proj``) scaled by 1/sqrt(2 * layers), embedding normal(1) and an LM
head that is the embedding of a fixed permutation, so the greedy next token is a permutation of the
current token with a large logit margin: the AR trace is then stable under the bf16 reassociation
differences between a T = 1 and a T = 1 + K forward (kernel costs do not depend on weight values).
The drafter is an EAGLE block at the target's width (its cost is real, its tokens are replaced:
alpha = per-position acceptance, ALGORITHMS.md §9b).

``--trained``: the embedded trained pair (``models/specla-gdn-tiny``) with its own drafter (real
acceptance) on pre-tokenized prompts (``--prompts FILE``: JSON list of token lists).

Usage (one device call each, < 10 min): ``python benchmarks/bench_e2e.py --shapes flame --out
$OUT/e2e.json``; ``--dry-cpu`` runs a tiny shape eagerly on the CPU (every code path once).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (_flags; runpy.run_path does not add it)

from _flags import check_out, parse_list  # noqa: E402
from vllm_specla.core.policy import chain_tau  # noqa: E402
from vllm_specla.models.config import GatedDeltaNetConfig  # noqa: E402
from vllm_specla.models.drafter import EagleDrafter, drafter_config_from_target  # noqa: E402
from vllm_specla.models.gdn import GatedDeltaNetForCausalLM  # noqa: E402
from vllm_specla.runtime.decode import SNAPSHOT_PREFILL_BYTES, DecodeRuntime, controlled_tree_tau  # noqa: E402
from vllm_specla.runtime.fused_model import FusedEagle, FusedTarget  # noqa: E402

SHAPES = {
    "flame": dict(hidden_size=2048, num_hidden_layers=21, num_heads=6, head_dim=256, expand_v=2.0,
                  intermediate_size=5632, vocab_size=32000),
    "map": dict(hidden_size=2048, num_hidden_layers=24, num_heads=8, head_dim=256, expand_v=1.0,
                intermediate_size=5632, vocab_size=32000),
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_heads=2, head_dim=32, expand_v=2.0,
                 intermediate_size=256, vocab_size=512),
}


def shape_config(name: str) -> GatedDeltaNetConfig:
    return GatedDeltaNetConfig(**SHAPES[name], conv_size=4, use_gate=True, use_short_conv=True, norm_eps=1e-6,
                               tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


@torch.no_grad()
def random_init_(model: torch.nn.Module, layers: int, seed: int) -> None:
    """The random weights described in the module docstring, drawn on the model's device."""
    torch.manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.uniform_(1, 16).log_()
        elif name.endswith("dt_bias"):
            dt = torch.exp(torch.rand_like(p) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
            p.copy_(dt + torch.log(-torch.expm1(-dt)))
        elif "norm" in name:
            p.fill_(1.0)
        elif "conv1d" in name:
            p.normal_(0, p.shape[-1] ** -0.5)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            p.normal_(0, 0.02 / math.sqrt(2 * layers))
        elif "embeddings" in name:
            p.normal_(0, 1.0)
        else:
            p.normal_(0, 0.02)


def build(shape: str, device: str, dtype: torch.dtype, seed: int = 0):
    """(config, FusedTarget, FusedEagle) with random weights (see module docstring)."""
    cfg = shape_config(shape)
    perm = torch.randperm(cfg.vocab_size, generator=torch.Generator().manual_seed(seed)).to(device)
    with torch.device(device):
        tm = GatedDeltaNetForCausalLM(cfg).to(dtype)
        random_init_(tm, cfg.num_hidden_layers, seed)
        # greedy next token of x = perm[x]: lm_head row perm[x] = embedding of x
        tm.lm_head.weight.data[perm] = tm.model.embeddings.weight.data.clone()
        dm = EagleDrafter(drafter_config_from_target(cfg)).to(dtype)
        random_init_(dm, 1, seed + 1)
    tgt = FusedTarget(tm, dtype, device)
    dr = FusedEagle(dm, tgt, dtype, device)
    del tm, dm
    return cfg, tgt, dr


def fits(bytes_needed: int, device: str, margin: float = 8e9) -> bool:
    if device != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info()
    return bytes_needed + margin < free


def spec_state_bytes(cfg: GatedDeltaNetConfig, K: int, mode: str) -> int:
    """Per-request target state bytes of a mode (computed before allocating)."""
    L, HV, V, Kd = cfg.num_hidden_layers, cfg.n_v_heads, cfg.head_v_dim, cfg.head_k_dim
    H, C, W, T = cfg.num_heads, 2 * cfg.num_heads * cfg.head_k_dim + cfg.n_v_heads * cfg.head_v_dim, cfg.conv_size, K + 1
    ssm, conv = HV * V * Kd * 4, (W - 1) * C * 4
    banks = 2 * T * (H * Kd + HV * V + HV + C) * 4
    if mode == "ar":
        return L * (ssm + conv)
    if mode == "specla":
        return L * (ssm + conv + banks)
    return L * (T * ssm + conv + 2 * T * C * 4)


DRY = False  # --dry-cpu


def steps_for(steps: int, batch: int) -> int:
    """Timed steps per run: at least ``steps``, more at small batch so that the measured acceptance
    length averages over ~1000 row-steps (512 at batch 1; tau of a row is a random draw per step).
    The committed H200 records used ``max(steps, min(128, 1024 // batch))`` (each records its
    ``steps``)."""
    return steps if DRY else max(steps, min(512, -(-1024 // batch)))


def timed_runtime(rt: DecodeRuntime, prompts, steps: int):
    rt.prefill(prompts)
    return rt.run(steps)


SETTINGS: dict = {}


def record(out_path, rec):
    rec = dict(rec, **SETTINGS)
    print(json.dumps(rec), flush=True)
    if out_path:
        with open(out_path, "a") as f:
            f.write(json.dumps(rec) + "\n")


def skip_oom(out_path, rec: dict, err: BaseException, note: str = "") -> bool:
    """Record the configuration ``rec`` as skipped for running out of device memory (the first line
    of ``err``, then ``note``) so the grid can go on (issue 6: configurations that do not fit the card
    are skipped and listed); returns True. The caller frees the failed run after its ``except``
    block (:func:`free_memory`): inside it the traceback still holds the run's tensors."""
    msg = (str(err).splitlines() or [""])[0][:160]
    record(out_path, dict(rec, skipped=f"out of memory: {msg}{note}"))
    return True


def free_memory(device: str) -> None:
    """Collect what a finished or failed run left and return the cached blocks to the device."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def bench_shape(args, shape: str, device: str) -> None:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    t0 = time.time()
    cfg, tgt, dr = build(shape, device, dtype)
    # random weights have no token frequencies: the first Vd ids (the cost does not depend on which)
    variants = [(dv, dw) for dv in args.draft_vocabs for dw in args.draft_weights]
    bases = {dw: dr.with_draft_weights(dw) for dw in args.draft_weights}  # (float8 copies made once)
    drs = {(dv, dw): bases[dw].with_draft_vocab(torch.arange(dv) if dv else None) for dv, dw in variants}
    dr = drs[variants[0]]
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"# {shape}: built in {time.time() - t0:.1f}s on {gpu}", flush=True)
    kmax = max(args.ks)
    for B in args.batches:
        prompts = torch.randint(3, cfg.vocab_size, (B, args.prompt_len), generator=torch.Generator().manual_seed(B))
        steps = steps_for(args.steps, B)
        L = steps * (kmax + 1) + kmax + 4
        base = dict(shape=shape, batch=B, gpu=gpu, steps=steps, prompt_len=args.prompt_len)
        # ---- AR: trace, then the timed run (every other run of this batch needs both) ----
        ar, oom = None, False
        try:
            ar = DecodeRuntime(tgt, B, "ar", output_capacity=L + 2)
            ar.capture()
            ar.prefill(prompts)
            ar.run(L)
            trace = torch.stack([torch.tensor(o[: L + 1]) for o in ar.outputs()]).to(device)
            r_ar = timed_runtime(ar, prompts, steps)
        except torch.OutOfMemoryError as e:
            oom = skip_oom(args.out, dict(base, mode="ar", K=0), e,
                           "; this batch's other runs, which need its trace and baseline, not run")
        if oom:
            ar = None
            free_memory(device)
            continue
        ar_tps = r_ar.tokens_per_s
        record(args.out, dict(base, mode="ar", K=0, alpha=None, step_ms=1e3 * r_ar.seconds / r_ar.steps,
                              tokens_per_s=ar_tps, ms_per_token=r_ar.ms_per_token(B), tau=1.0, speedup=1.0,
                              state_bytes_per_request=ar.state_bytes_per_request()))
        del ar
        step_s = {1: r_ar.seconds / r_ar.steps}  # window T -> seconds per step (drafting included)
        outcomes = {}  # alpha -> per-step accepted drafts per row, from the K = max run
        for K, mode, dv in ((K, m, dv) for K in args.ks for m in ("specla", "snapshot") for dv in variants):
            if mode == "snapshot" and K not in args.snapshot_ks:
                continue
            need = B * (spec_state_bytes(cfg, K, mode) + 2 * spec_state_bytes(cfg, 0, "ar") // cfg.num_hidden_layers)
            if mode == "snapshot":  # the prefill's plain state, in chunks of rows (runtime/decode.py)
                need += min(B * spec_state_bytes(cfg, 0, "ar"), max(SNAPSHOT_PREFILL_BYTES, spec_state_bytes(cfg, 0, "ar")))
            if not fits(need, device):
                record(args.out, dict(base, mode=mode, K=K, skipped=f"needs {need / 2**30:.1f} GiB of state"))
                continue
            alphas = args.alphas if mode == "specla" else args.snapshot_alphas
            try:
                rt = DecodeRuntime(tgt, B, mode, K, drs[dv], output_capacity=L + 2, alpha=alphas[0], trace=trace)
                rt.capture()
                for a in alphas:
                    rt.set_alpha(a)
                    torch.manual_seed(1000 + B + K)
                    r = timed_runtime(rt, prompts, steps)
                    outs = rt.outputs()
                    ok = sum(o == trace[b, : len(o)].tolist() for b, o in enumerate(outs))
                    if mode == "specla" and dv == variants[0]:
                        step_s[K + 1] = min(step_s.get(K + 1, 1e9), r.seconds / r.steps)
                        if K == kmax:
                            outcomes[a] = rt.acceptance_outcomes()
                    record(args.out, dict(
                        base, mode=mode, K=K, alpha=a, draft_vocab=drs[dv].draft_vocab_size,
                        draft_weights=drs[dv].draft_weights, draft_passes=_draft_passes(drs[dv], B),
                        step_ms=1e3 * r.seconds / r.steps, tokens_per_s=r.tokens_per_s,
                        ms_per_token=r.ms_per_token(B), tau=r.mean_acceptance_length,
                        tau_expected=chain_tau(a, K), speedup=r.tokens_per_s / ar_tps,
                        lossless_rows=f"{ok}/{B}", state_bytes_per_request=rt.state_bytes_per_request()))
            except torch.OutOfMemoryError as e:  # the size check above estimates: skip, list, go on
                rt = None
                skip_oom(args.out, dict(base, mode=mode, K=K, draft_vocab=drs[dv].draft_vocab_size,
                                        draft_weights=drs[dv].draft_weights), e)
            del rt
            free_memory(device)
            for W in (args.tree_widths if mode == "specla" and dv == variants[0] else ()):
                # draft trees: W branches of depth K sharing the root
                rt = None
                try:
                    rt = DecodeRuntime(tgt, B, "specla", K, drs[dv], output_capacity=L + 2, alpha=args.alphas[0],
                                       trace=trace, tree_width=W, tree_alpha_model=args.tree_alpha_model)
                    rt.capture()
                    for a in args.alphas:
                        rt.set_alpha(a)
                        torch.manual_seed(3000 + B + K + W)
                        r = timed_runtime(rt, prompts, steps)
                        ok = sum(o == trace[b, : len(o)].tolist() for b, o in enumerate(rt.outputs()))
                        record(args.out, dict(
                            base, mode="specla-tree", K=K, tree_width=W, nodes=1 + W * K, alpha=a,
                            tree_alpha_model=args.tree_alpha_model,
                            step_ms=1e3 * r.seconds / r.steps, tokens_per_s=r.tokens_per_s,
                            ms_per_token=r.ms_per_token(B), tau=r.mean_acceptance_length,
                            tau_expected=controlled_tree_tau(a, K, W, args.tree_alpha_model),
                            speedup=r.tokens_per_s / ar_tps, lossless_rows=f"{ok}/{B}",
                            state_bytes_per_request=rt.state_bytes_per_request()))
                except torch.OutOfMemoryError as e:
                    rt = None
                    skip_oom(args.out, dict(base, mode="specla-tree", K=K, tree_width=W, nodes=1 + W * K), e)
                del rt
                free_memory(device)
        if args.auto:
            run_auto(args, base, tgt, dr, B, prompts, trace, steps, step_s, outcomes, ar_tps, L)
    del tgt, dr, drs
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def agree_rows(outs: list[list[int]], ref: list[list[int]]) -> int:
    """Rows whose tokens equal the AR run's over their common length (the lossless count)."""
    return sum(o[: min(len(o), len(a))] == a[: min(len(o), len(a))] for o, a in zip(outs, ref))


def _draft_passes(dr, batch: int) -> str:
    """The weights a chain's one-token draft passes read at ``batch`` requests: ``"fp8"`` or ``"model"``
    (``draft_weights="fp8"`` drafts on the model weights above ``fused_model.FP8_MAX_BATCH`` rows)."""
    from vllm_specla.runtime import fused_model  # noqa: PLC0415

    return "fp8" if dr.draft_weights == "fp8" and batch <= fused_model.FP8_MAX_BATCH else "model"


def trained_vocab_size() -> int:
    """The embedded trained pair's vocabulary size (its target's ``config.json``)."""
    with open(os.path.join(os.path.dirname(__file__), "..", "models", "specla-gdn-tiny", "target",
                           "config.json")) as f:
        return json.load(f)["vocab_size"]


def read_prompts(ap, path: str) -> list[list[int]]:
    """``--prompts``: a JSON list of non-empty token-id lists, each id an int in the trained pair's vocabulary.

    Calls ``ap.error`` (one line naming ``--prompts``) on a missing / unreadable file, bad JSON, an empty list, or a
    prompt that is not a non-empty list of such ids (they were tracebacks after the models were built).
    """
    try:
        with open(path) as f:
            prompts = json.load(f)
    except (OSError, ValueError) as e:
        ap.error(f"--prompts {path}: cannot read a JSON list of token lists ({type(e).__name__}: {e})")
    vocab = trained_vocab_size()
    if not isinstance(prompts, list) or not prompts:
        ap.error(f"--prompts {path}: expected a non-empty JSON list of token lists")
    for i, p in enumerate(prompts):
        if not (isinstance(p, list) and p and all(type(t) is int and 0 <= t < vocab for t in p)):
            ap.error(f"--prompts {path}: prompt {i} must be a non-empty list of token ids in [0, {vocab}), "
                     f"got {str(p)[:60]}")
    return prompts


def build_trained(device):
    """The embedded trained pair (``models/specla-gdn-tiny``) as runtime modules, fp32: ``(target, drafter)``."""
    from vllm_specla.models.drafter import load_eagle_drafter  # noqa: PLC0415
    from vllm_specla.models.gdn import load_fla_checkpoint  # noqa: PLC0415

    root = os.path.join(os.path.dirname(__file__), "..", "models", "specla-gdn-tiny")
    dtype = torch.float32
    tm = load_fla_checkpoint(os.path.join(root, "target"), dtype, device)
    dm = load_eagle_drafter(os.path.join(root, "drafter"), dtype, device)
    tgt = FusedTarget(tm, dtype, device)
    return tgt, FusedEagle(dm, tgt, dtype, device)


def auto_k(kmax: int, B: int, step_s: dict, outcomes: list):
    """The draft length ``num_speculative_tokens: "auto"`` picks (``core/policy.py``; 0 = AR) from this
    batch size's measured seconds per step by window ``T`` (``step_s``) and the per-step accepted
    drafts per row of a ``K = kmax`` run (``outcomes``); returns ``(K, policy)``."""
    from vllm_specla.core.policy import DraftLengthPolicy, StepCostModel  # noqa: PLC0415

    pol = DraftLengthPolicy(k_max=kmax, costs=StepCostModel({B: step_s}, draft_seconds_per_token=0.0, learn=False),
                            explore_every=0)
    for acc in outcomes:
        pol.observe_acceptance([kmax] * B, acc)
    return pol.best(B), pol


def run_auto(args, base, tgt, dr, B, prompts, trace, steps, step_s, outcomes, ar_tps, L) -> None:
    """``num_speculative_tokens: "auto"``: the draft-length policy (``core/policy.py``) gets this
    batch size's measured step costs (AR and each K of the grid; other K interpolated in T) and
    the acceptance outcomes of the K = max run at each alpha, picks K (0 = AR), and that choice
    is measured again in its own run."""
    kmax = max(args.ks)
    for a in args.alphas:
        K, pol = auto_k(kmax, B, step_s, outcomes.get(a, []))
        rt, oom = None, False
        try:
            if K == 0:
                rt = DecodeRuntime(tgt, B, "ar", output_capacity=L + 2)
            else:
                rt = DecodeRuntime(tgt, B, "specla", K, dr, output_capacity=L + 2, alpha=a, trace=trace)
            rt.capture()
            torch.manual_seed(2000 + B + K)
            r = timed_runtime(rt, prompts, steps)
        except torch.OutOfMemoryError as e:
            oom = skip_oom(args.out, dict(base, mode="specla-auto", K=K, alpha=a), e)
        if oom:
            rt = None
            free_memory(trace.device.type)
            continue
        ok = sum(o == trace[b, : len(o)].tolist() for b, o in enumerate(rt.outputs()))
        record(args.out, dict(base, mode="specla-auto", K=K, alpha=a, step_ms=1e3 * r.seconds / r.steps,
                              tokens_per_s=r.tokens_per_s, ms_per_token=r.ms_per_token(B), tau=r.mean_acceptance_length,
                              speedup=r.tokens_per_s / ar_tps, lossless_rows=f"{ok}/{B}",
                              policy=dict(alpha_est=round(pol.acceptance.pooled, 4),
                                          cost_table_ms={t: round(1e3 * v, 4) for t, v in sorted(step_s.items())})))
        del rt


def bench_trained(args, device: str) -> None:
    """The embedded trained pair, its own drafter (real acceptance), fp32, on ``--prompts``."""
    from vllm_specla.core.draft_vocab import draft_vocab_ids, load_token_counts  # noqa: PLC0415

    tgt, dr = build_trained(device)
    counts = load_token_counts(os.path.join(os.path.dirname(__file__), "..", "models", "specla-gdn-tiny", "drafter")) \
        if any(args.draft_vocabs) else None  # (only read when a draft vocabulary is asked for)
    variants = [(dv, dw) for dv in args.draft_vocabs for dw in args.draft_weights]
    bases = {dw: dr.with_draft_weights(dw) for dw in args.draft_weights}  # (float8 copies made once)
    drs = {(dv, dw): bases[dw].with_draft_vocab(draft_vocab_ids(counts, dv) if dv else None) for dv, dw in variants}
    dr = drs[variants[0]]
    all_prompts = args.prompt_ids  # (read and checked by main before any model is built)
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    for B in args.trained_batches:
        prompts = [all_prompts[i % len(all_prompts)] for i in range(B)]
        steps = steps_for(args.steps, B)
        cap = steps * (max(args.ks) + 1) + 16
        ar = DecodeRuntime(tgt, B, "ar", output_capacity=cap)
        ar.capture()
        r_ar = timed_runtime(ar, prompts, steps * (max(args.ks) + 1))
        ar_out = ar.outputs()
        base = dict(shape="specla-gdn-tiny (trained pair)", batch=B, gpu=gpu, dtype="fp32", steps=steps,
                    prompts=os.path.basename(args.prompts))
        record(args.out, dict(base, mode="ar", K=0, step_ms=1e3 * r_ar.seconds / r_ar.steps,
                              tokens_per_s=r_ar.tokens_per_s, tau=1.0, speedup=1.0))
        step_s, outcomes = {1: r_ar.seconds / r_ar.steps}, []  # for --auto, as bench_shape
        for K in args.ks:
            for dv in variants:
                rt = DecodeRuntime(tgt, B, "specla", K, drs[dv], output_capacity=cap)
                rt.capture()
                r = timed_runtime(rt, prompts, steps)
                outs = rt.outputs()
                ok = agree_rows(outs, ar_out)
                record(args.out, dict(base, mode="specla", K=K, draft_vocab=drs[dv].draft_vocab_size,
                                      draft_weights=drs[dv].draft_weights, draft_passes=_draft_passes(drs[dv], B),
                                      step_ms=1e3 * r.seconds / r.steps, tokens_per_s=r.tokens_per_s,
                                      tau=r.mean_acceptance_length, speedup=r.tokens_per_s / r_ar.tokens_per_s,
                                      lossless_rows=f"{ok}/{B}"))
                if dv == variants[0]:
                    step_s[K + 1] = r.seconds / r.steps
                    if K == max(args.ks):
                        outcomes = rt.acceptance_outcomes()
                del rt
            for W in args.tree_widths:  # the drafter's top-W first tokens, each branch greedy to depth K
                rt = DecodeRuntime(tgt, B, "specla", K, dr, output_capacity=cap, tree_width=W)
                rt.capture()
                r = timed_runtime(rt, prompts, steps)
                outs = rt.outputs()
                ok = agree_rows(outs, ar_out)
                record(args.out, dict(base, mode="specla-tree", K=K, tree_width=W, nodes=1 + W * K,
                                      step_ms=1e3 * r.seconds / r.steps, tokens_per_s=r.tokens_per_s,
                                      tau=r.mean_acceptance_length, speedup=r.tokens_per_s / r_ar.tokens_per_s,
                                      lossless_rows=f"{ok}/{B}"))
                del rt
        if args.auto:  # the policy's pick from these costs and the real acceptance, measured in its own run
            K, pol = auto_k(max(args.ks), B, step_s, outcomes)
            rt = DecodeRuntime(tgt, B, "ar", output_capacity=cap) if K == 0 else \
                DecodeRuntime(tgt, B, "specla", K, dr, output_capacity=cap)
            rt.capture()
            r = timed_runtime(rt, prompts, steps if K else steps * (max(args.ks) + 1))
            outs = rt.outputs()
            ok = agree_rows(outs, ar_out)
            record(args.out, dict(base, mode="specla-auto", K=K, step_ms=1e3 * r.seconds / r.steps,
                                  tokens_per_s=r.tokens_per_s, tau=r.mean_acceptance_length,
                                  speedup=r.tokens_per_s / r_ar.tokens_per_s, lossless_rows=f"{ok}/{B}",
                                  policy=dict(alpha_est=round(pol.acceptance.pooled, 4),
                                              cost_table_ms={t: round(1e3 * v, 4) for t, v in sorted(step_s.items())})))
            del rt


def prefetch_flag(v: str) -> int:
    """``--skinny-prefetch``: whole MiB, 0..64, as bytes."""
    if not v.isdigit() or int(v) > 64:
        raise argparse.ArgumentTypeError(f"--skinny-prefetch must be whole MiB in 0..64 (0: off), got {v!r}")
    return int(v) << 20


def skinny_flag(v: str) -> str:
    """``--skinny-gemm``: ``on``, ``off`` or ``W,U`` of ``ops/_cpp.py`` ``skinny_gemm`` (checked
    before the ~1 minute build)."""
    from vllm_specla.ops import _cpp  # noqa: PLC0415

    if v in ("on", "off"):
        return v
    try:
        cfg = tuple(int(p) for p in v.split(","))
    except ValueError:
        cfg = ()
    if len(cfg) != 2 or cfg not in _cpp._SKINNY_CONFIGS:
        raise argparse.ArgumentTypeError(f"--skinny-gemm must be 'on', 'off' or 'W,U' with W in 4 / 8 / 16 and U in "
                                         f"4 / 8, or 8,16 / 8,20 (or 0,0: automatic), got {v!r}")
    return v


def gemv_config_flag(v: str) -> str:
    """``--fp8-config``: three positive integers ``BN,BK,warps`` (checked before any run)."""
    parts = v.split(",")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"--fp8-config must be BN,BK,warps (three positive integers), got {v!r}")
    return v


def narrow_config_flag(flag: str):
    """The parser of ``--gemv-rows-narrow`` / ``--fp8-narrow`` (``flag``): ``off``, or ``BN,BK,warps``
    as ``triton_fused.gemv_rows`` takes them (BN a power of two, BK 0 = one tile or a power of two,
    warps a power of two up to 32), checked before any run."""
    def parse(v: str) -> str:
        parts = v.split(",")
        pow2 = lambda n: n > 0 and n & (n - 1) == 0  # noqa: E731
        if v == "off" or (len(parts) == 3 and all(p.isdigit() for p in parts)
                          and pow2(int(parts[0])) and (int(parts[1]) == 0 or pow2(int(parts[1])))
                          and pow2(int(parts[2])) and int(parts[2]) <= 32):
            return v
        raise argparse.ArgumentTypeError(f"{flag} must be 'off' or BN,BK,warps (BN a power of two, BK 0 or a power of "
                                         f"two, warps a power of two <= 32), got {v!r}")
    return parse


def conv_step_flag(v: str) -> str:
    """``--conv-step``: ``on``, ``off`` or ``BV,warps,KI`` (powers of two; checked before any run)."""
    parts = v.split(",")
    pow2 = lambda n: n > 0 and n & (n - 1) == 0  # noqa: E731
    if v in ("on", "off") or (len(parts) == 3 and all(p.isdigit() and pow2(int(p)) for p in parts)
                              and int(parts[1]) <= 32):
        return v
    raise argparse.ArgumentTypeError(f"--conv-step must be 'on', 'off' or BV,warps,KI (powers of two, warps <= 32), "
                                     f"got {v!r}")


def positive_int(v: str) -> int:
    if not v.isdigit() or int(v) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v!r}")
    return int(v)


def add_kernel_flags(ap: argparse.ArgumentParser) -> None:
    """The decode-GEMM / launch switches shared by this script and ``step_breakdown.py``."""
    ap.add_argument("--gemv-rows", default=None,
                    help="BN,BK,warps[,pro]: the row GEMV (triton_fused.gemv_rows) for one-row GEMMs at this config "
                         "(bench_blas.py; since session 31 only those --gemv-rows-narrow does not cover, unless it is "
                         "'off'), ',pro': its fused prologues (fused.GEMV_ROWS_PROLOGUE); 'off': cuBLAS")
    ap.add_argument("--gemv-rows-narrow", default=None, type=narrow_config_flag("--gemv-rows-narrow"),
                    help="BN,BK,warps of the row GEMV for bf16 one-row GEMMs of <= 2048 outputs (o_proj, down_proj; "
                         "triton_fused.GEMV_ROWS_CONFIG_NARROW, default 8,2048,8), or 'off': the --gemv-rows config")
    ap.add_argument("--fp8-narrow", default=None, type=narrow_config_flag("--fp8-narrow"),
                    help="BN,BK,warps of the row GEMV for float8 one-row GEMMs of <= 2048 outputs "
                         "(triton_fused.GEMV_ROWS_FP8_CONFIG_NARROW, default 8,4096,8; --draft-weights fp8), or 'off': "
                         "the --fp8-config config")
    ap.add_argument("--fp8-config", default=None, type=gemv_config_flag,
                    help="BN,BK,warps of the row GEMV on float8 weights (triton_fused.GEMV_ROWS_FP8_CONFIG; "
                         "--draft-weights fp8)")
    ap.add_argument("--draft-glue", default=None, choices=["fused", "separate"],
                    help="the drafter's embedding gather and final norm as the row GEMV's prologues, or their own "
                         "launches (fused.DRAFT_GLUE_PROLOGUES)")
    ap.add_argument("--absorb-rows", default=None, choices=["fp8", "model", "off"],
                    help="the drafter's absorb pass past its recurrence on each request's accepted row only, its "
                         "GEMMs on the float8 weights (with --draft-weights fp8) or the absorb pass's own, or on every "
                         "row of the window (runtime/decode.py ABSORB_ACCEPTED_ROWS, fused_model.ABSORB_ROWS_FP8)")
    ap.add_argument("--fp8-gather", default=None, choices=["one", "split"],
                    help="the absorb's gathered float8 o_proj as one row-GEMV launch on the float32 recurrence output, "
                         "or gather + norm + GEMV launches (fused.FP8_GATHER_ONE_LAUNCH)")
    ap.add_argument("--skinny-fp8", default=None, choices=["on", "off"],
                    help="float8 GEMMs of 2-8 rows (the absorb pass with --fp8-max-tokens > 1) on the skinny GEMM's "
                         "float8 form instead of the row GEMV (fused.USE_SKINNY_FP8; needs --skinny-gemm)")
    ap.add_argument("--fp8-max-tokens", type=positive_int, default=None,
                    help="drafter passes of at most this many tokens per row read the float8 weights with "
                         "--draft-weights fp8 (runtime/fused_model.py FP8_MAX_TOKENS; 1: draft passes only)")
    ap.add_argument("--fp8-max-batch", type=positive_int, default=None,
                    help="with --draft-weights fp8: drafter passes of at most this many rows (requests; requests x "
                         "branches for a tree) read the float8 weights, larger ones the model weights "
                         "(runtime/fused_model.py FP8_MAX_BATCH, default 2)")
    ap.add_argument("--conv-step", default=None, type=conv_step_flag,
                    help="on / off, or BV,warps,KI (on at that config): one-token steps (AR, the drafter's one-token "
                         "passes) run the conv and the recurrence as one Triton launch (ops/chain_verify.py CONV_STEP, "
                         "triton_chain.conv_chain_step; default off, VLLM_SPECLA_CONV_STEP) instead of two")
    ap.add_argument("--rows-max-m", type=int, default=None,
                    help="token rows up to which GEMMs run the row GEMV (triton_fused.GEMV_ROWS_MAX_M; 1..16)")
    ap.add_argument("--gating-epilogue", default=None, choices=["on", "off"],
                    help="the GDN gating as the row GEMV's epilogue (fused.GEMV_ROWS_GATING)")
    ap.add_argument("--pdl", default=None, choices=["on", "off"],
                    help="programmatic dependent launch of the Triton kernels (ops/pdl.py ENABLED)")
    ap.add_argument("--skinny-gemm", default=None, type=skinny_flag,
                    help="on, or W,U (its warps, unroll: fused.SKINNY_CONFIG): JIT-build the CUDA skinny GEMM (ops/_cpp.py "
                         "load_cuda_gemm, needs nvcc) so 2-8-row GEMMs run it instead of cuBLAS (fused.USE_SKINNY_GEMM), "
                         "or exit if it does not build; off: cuBLAS; unset: the default, on where it builds "
                         "(ops/_cpp.py load_cuda_kernels)")
    ap.add_argument("--skinny-max-m", default=None, type=int, choices=range(2, 17), metavar="{2..16}",
                    help="token rows up to which bf16 GEMMs run the skinny GEMM (fused.SKINNY_MAX_M, default 8; 9-16: "
                         "two 8-token tiles, slower than cuBLAS in session 30)")
    ap.add_argument("--skinny-prefetch", default=None, type=prefetch_flag,
                    help="MiB of the next GEMM's weight the skinny GEMM prefetches into L2 (fused.SKINNY_PREFETCH_BYTES; "
                         "0: off)")
    ap.add_argument("--accept-kernel", default=None, choices=["triton", "torch"],
                    help="the step's bookkeeping after the verify as one Triton launch or torch ops "
                         "(runtime/step_kernels.py USE_TRITON_ACCEPT; RESULTS.md session 24)")
    ap.add_argument("--glue-kernels", default=None, choices=["triton", "torch"],
                    help="the embedding gather (fused.USE_TRITON_EMBED) and the acceptance-controlled drafts "
                         "(runtime/step_kernels.py USE_TRITON_CONTROL) as Triton launches or torch ops (RESULTS.md "
                         "session 25)")
    ap.add_argument("--argmax", default=None, choices=["triton", "torch"],
                    help="greedy tokens by our Triton argmax or torch's (fused.USE_TRITON_ARGMAX)")


def _fp8_limits() -> dict:
    from vllm_specla.runtime import fused_model  # noqa: PLC0415

    return dict(fp8_max_tokens=fused_model.FP8_MAX_TOKENS, fp8_max_batch=fused_model.FP8_MAX_BATCH)


def apply_kernel_flags(args, device: str) -> dict | None:
    """Set the switches of :func:`add_kernel_flags`; returns their state after the flags (stored
    in every record) on CUDA, None elsewhere (the row GEMV and PDL are CUDA-only)."""
    from vllm_specla.ops import fused  # noqa: PLC0415

    if args.gemv_rows:
        fused.USE_GEMV_ROWS = args.gemv_rows != "off"
    if args.gating_epilogue:
        fused.GEMV_ROWS_GATING = args.gating_epilogue == "on"
    if args.argmax:
        fused.USE_TRITON_ARGMAX = args.argmax == "triton"
    from vllm_specla.runtime import step_kernels as _steps  # noqa: PLC0415

    if getattr(args, "accept_kernel", None):
        _steps.USE_TRITON_ACCEPT = args.accept_kernel == "triton"
    if getattr(args, "glue_kernels", None):
        fused.USE_TRITON_EMBED = _steps.USE_TRITON_CONTROL = args.glue_kernels == "triton"
    if getattr(args, "skinny_fp8", None):
        fused.USE_SKINNY_FP8 = args.skinny_fp8 == "on"
    if getattr(args, "fp8_gather", None):
        fused.FP8_GATHER_ONE_LAUNCH = args.fp8_gather == "one"
    if getattr(args, "draft_glue", None):
        fused.DRAFT_GLUE_PROLOGUES = args.draft_glue == "fused"
    from vllm_specla.runtime import decode as _decode, fused_model  # noqa: PLC0415

    if getattr(args, "fp8_max_tokens", None) is not None:  # (the CPU path reads it too)
        fused_model.FP8_MAX_TOKENS = args.fp8_max_tokens
    if getattr(args, "fp8_max_batch", None) is not None:
        fused_model.FP8_MAX_BATCH = args.fp8_max_batch
    if getattr(args, "absorb_rows", None):
        _decode.ABSORB_ACCEPTED_ROWS = args.absorb_rows != "off"
        fused_model.ABSORB_ROWS_FP8 = args.absorb_rows == "fp8"
    if device != "cuda":
        for flag in ("skinny_gemm", "skinny_prefetch", "skinny_max_m"):
            if getattr(args, flag, None) is not None:
                print(f"--{flag.replace('_', '-')} {getattr(args, flag)}: ignored on {device} (a CUDA kernel)",
                      file=sys.stderr)
        return None
    from vllm_specla.ops import pdl, triton_fused  # noqa: PLC0415

    if args.gemv_rows and fused.USE_GEMV_ROWS:
        cfg = args.gemv_rows.split(",")
        fused.GEMV_ROWS_PROLOGUE = cfg[3:] == ["pro"]
        triton_fused.GEMV_ROWS_CONFIG = tuple(int(v) for v in cfg[:3])
    if args.rows_max_m is not None:
        triton_fused.GEMV_ROWS_MAX_M = args.rows_max_m
    if getattr(args, "gemv_rows_narrow", None):
        triton_fused.GEMV_ROWS_CONFIG_NARROW = (None if args.gemv_rows_narrow == "off"
                                                else tuple(int(v) for v in args.gemv_rows_narrow.split(",")))
    if getattr(args, "fp8_narrow", None):
        triton_fused.GEMV_ROWS_FP8_CONFIG_NARROW = (None if args.fp8_narrow == "off"
                                                    else tuple(int(v) for v in args.fp8_narrow.split(",")))
    if getattr(args, "fp8_config", None):
        triton_fused.GEMV_ROWS_FP8_CONFIG = tuple(int(v) for v in args.fp8_config.split(","))
    if args.pdl:
        pdl.ENABLED = args.pdl == "on"
    from vllm_specla.ops import chain_verify as _cv, triton_chain as _tc  # noqa: PLC0415

    if getattr(args, "conv_step", None):
        _cv.CONV_STEP = args.conv_step != "off"
        if args.conv_step not in ("on", "off"):
            _tc.STEP_CONFIG_OVERRIDE = tuple(int(v) for v in args.conv_step.split(","))
    from vllm_specla.ops import _cpp  # noqa: PLC0415

    sg = getattr(args, "skinny_gemm", None)
    if sg not in (None, "off") and not _cpp.load_cuda_gemm():
        raise SystemExit("--skinny-gemm: the CUDA skinny GEMM did not build (ops/_cpp.py load_cuda_gemm)")
    if sg not in (None, "off"):
        if sg != "on":
            fused.SKINNY_CONFIG = tuple(int(v) for v in sg.split(","))
    if sg is not None:  # (unset: VLLM_SPECLA_SKINNY_GEMM as it is: on where load_cuda_kernels built the kernel)
        fused.USE_SKINNY_GEMM = sg != "off"
    if getattr(args, "skinny_prefetch", None) is not None:
        fused.SKINNY_PREFETCH_BYTES = args.skinny_prefetch
    if getattr(args, "skinny_max_m", None) is not None:
        fused.SKINNY_MAX_M = args.skinny_max_m
    # (s11e's records had None for both the default and "off": the state is read back here)
    return dict(on=fused.USE_GEMV_ROWS, prologue=fused.GEMV_ROWS_PROLOGUE, config=list(triton_fused.GEMV_ROWS_CONFIG),
                max_m=triton_fused.GEMV_ROWS_MAX_M,
                narrow_config=list(triton_fused.GEMV_ROWS_CONFIG_NARROW or ()) or None,
                fp8_narrow_config=list(triton_fused.GEMV_ROWS_FP8_CONFIG_NARROW or ()) or None,
                fp8_config=list(triton_fused.GEMV_ROWS_FP8_CONFIG),
                **_fp8_limits(), pdl=pdl.enabled(torch.empty(0, device="cuda")),
                gating=fused.GEMV_ROWS_GATING, draft_glue_prologues=fused.DRAFT_GLUE_PROLOGUES,
                skinny_fp8=fused.USE_SKINNY_FP8, fp8_gather_one_launch=fused.FP8_GATHER_ONE_LAUNCH,
                absorb_rows=(("fp8" if fused_model.ABSORB_ROWS_FP8 else "model") if _decode.ABSORB_ACCEPTED_ROWS
                             else "off"),
                triton_argmax=fused.USE_TRITON_ARGMAX,
                small=[fused.GEMV_ROWS_SMALL_MAX_M, fused.GEMV_ROWS_SMALL_BYTES],
                skinny=list(fused.SKINNY_CONFIG) if fused.USE_SKINNY_GEMM and _cpp.GEMM_LOADED else None,
                skinny_prefetch=fused.SKINNY_PREFETCH_BYTES if fused.USE_SKINNY_GEMM and _cpp.GEMM_LOADED else None,
                skinny_max_m=fused.SKINNY_MAX_M if fused.USE_SKINNY_GEMM and _cpp.GEMM_LOADED else None,
                triton_accept=_steps.USE_TRITON_ACCEPT, triton_glue=fused.USE_TRITON_EMBED and _steps.USE_TRITON_CONTROL,
                conv_step=(list(_tc.STEP_CONFIG_OVERRIDE or _tc.STEP_CONFIG) if _cv.CONV_STEP else None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="flame,map")
    ap.add_argument("--batches", default=None,
                    help="batch sizes of the --shapes runs (default 1,16,64,256; --trained takes --trained-batches)")
    ap.add_argument("--ks", default="2,4,6,8")
    ap.add_argument("--alphas", default="0.7,0.8,0.9")
    ap.add_argument("--snapshot-ks", default="4")
    ap.add_argument("--tree-widths", default="", help="also run draft trees of these widths (W branches of depth K)")
    ap.add_argument("--tree-alpha-model", default="siblings", choices=["siblings", "iid"],
                    help="how alpha controls a tree's drafts (runtime/decode.py controlled_tree_tau): one first-level "
                         "sibling can match (default), or every node independently (sessions 3-13)")
    ap.add_argument("--snapshot-alphas", default="0.8")
    ap.add_argument("--steps", type=int, default=24,
                    help="timed steps per run, at least (small batches run more, up to 512 at batch 1, so that the "
                         "measured acceptance length averages ~1000 row-steps: steps_for)")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--verify-kernel", default=None, choices=["serial", "ut", "auto"],
                    help="chain verify kernel on CUDA (ops/chain_verify.py VERIFY_KERNEL)")
    csrc = ap.add_mutually_exclusive_group()
    csrc.add_argument("--cuda-csrc", action="store_true",
                      help="require the CUDA csrc chain verify (exit, naming the cause, if it does not build). It is "
                           "the default anyway where it builds (ops/_cpp.py load_cuda_kernels; needs nvcc, and a C++ "
                           "compiler where the C++ CPU extension is not built); the dispatcher uses it where faster "
                           "(ops/chain_verify.py)")
    csrc.add_argument("--no-cuda-csrc", action="store_true",
                      help="run the Triton chain kernels only (chain_verify.USE_CUDA_CSRC = False), for A/B runs")
    ap.add_argument("--cuda-pdl", default="1", choices=["0", "1"],
                    help="the CUDA csrc kernels with programmatic dependent launch (1, the default) or "
                         "plainly (0; the Triton kernels keep VLLM_SPECLA_PDL's setting, read at import)")
    add_kernel_flags(ap)
    ap.add_argument("--tag", default="", help="label stored in every record (A/B runs)")
    ap.add_argument("--auto", action="store_true", help="also run the automatic draft-length policy per batch/alpha")
    ap.add_argument("--trained", action="store_true", help="run the embedded trained pair instead of --shapes")
    ap.add_argument("--prompts", default=None, help="JSON list of token lists (with --trained)")
    ap.add_argument("--trained-batches", default="1,16", help="batch sizes of the --trained runs (default 1,16)")
    ap.add_argument("--draft-vocabs", default="0",
                    help="draft vocabulary sizes (frequency-ranked, core/draft_vocab.py) to run SpecLA and snapshots "
                         "with; 0 = the full vocabulary; the first also feeds --auto and trees. Random shapes take "
                         "the first Vd ids (no frequencies; the cost is the same), the trained pair its token counts")
    ap.add_argument("--draft-weights", default="model",
                    help="comma list of the drafter's one-token-pass weights to run SpecLA and snapshots with: "
                         "'model' (the model dtype) and / or 'fp8' (float8 with per-row scales for passes of at "
                         "most --fp8-max-batch rows, runtime/fused_model.py FusedEagle); crossed with --draft-vocabs, "
                         "the first pair feeds --auto and trees")
    ap.add_argument("--out", default=None, help="append JSON lines here")
    ap.add_argument("--dry-cpu", action="store_true", help="tiny shape, eager, CPU: every code path once, on a fixed grid that replaces the grid flags' "
                    "values (--shapes, --batches, --ks, --steps, alphas, snapshot Ks, tree widths, draft vocabularies "
                    "and weights)")
    args = ap.parse_args()
    if args.trained and args.batches is not None:
        ap.error("--batches is not used with --trained: give the trained pair's batch sizes as --trained-batches")
    args.batches = "1,16,64,256" if args.batches is None else args.batches
    args.batches, args.ks = parse_list(ap, "--batches", args.batches), parse_list(ap, "--ks", args.ks)
    args.snapshot_ks = parse_list(ap, "--snapshot-ks", args.snapshot_ks, allow_empty=True)
    args.alphas, args.snapshot_alphas = (parse_list(ap, flag, v, kind=float, lo=0, hi=1, allow_empty=True)
                                         for flag, v in (("--alphas", args.alphas),
                                                         ("--snapshot-alphas", args.snapshot_alphas)))
    if not args.alphas and not args.trained:  # (was an IndexError after the models were built)
        ap.error("--alphas: give at least one value (the controlled drafter's acceptance), got ''")
    if args.snapshot_ks and not args.snapshot_alphas:
        ap.error("--snapshot-alphas: give at least one value for the --snapshot-ks rows, got ''")
    args.trained_batches = parse_list(ap, "--trained-batches", args.trained_batches, allow_empty=not args.trained)
    args.tree_widths = parse_list(ap, "--tree-widths", args.tree_widths, lo=2, allow_empty=True)
    args.draft_vocabs = parse_list(ap, "--draft-vocabs", args.draft_vocabs, lo=0, allow_empty=True) or [0]
    if args.steps < 1 or args.prompt_len < 1:
        ap.error(f"--steps and --prompt-len: each must be an int >= 1, got {args.steps} / {args.prompt_len}")
    check_out(ap, "--out", args.out)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    bad = [s for s in shapes if s not in SHAPES]
    if (bad or not shapes) and not (args.dry_cpu or args.trained):
        ap.error(f"--shapes: each must be one of {', '.join(SHAPES)}, got {args.shapes!r}")
    args.shapes = ",".join(shapes)
    if args.trained:
        if not args.prompts:
            ap.error("--trained needs --prompts FILE (a JSON list of token lists)")
        args.prompt_ids = read_prompts(ap, args.prompts)
        if max(args.draft_vocabs) > trained_vocab_size():  # (was a traceback after the models were built)
            ap.error(f"--draft-vocabs: each must be <= the trained pair's vocabulary ({trained_vocab_size()}; "
                     f"0 = full), got {','.join(map(str, args.draft_vocabs))}")
    from vllm_specla.runtime.fused_model import DRAFT_WEIGHTS  # noqa: PLC0415

    args.draft_weights = [w for w in args.draft_weights.split(",") if w] or ["model"]
    bad = [w for w in args.draft_weights if w not in DRAFT_WEIGHTS]
    if bad:
        ap.error(f"--draft-weights: each must be one of {', '.join(DRAFT_WEIGHTS)}, got {', '.join(bad)}")
    device = "cuda" if torch.cuda.is_available() and not args.dry_cpu else "cpu"
    big = [s for s in shapes if s != "tiny"]
    if device == "cpu" and not args.dry_cpu and not args.trained and big:
        raise SystemExit(f"bench_e2e.py: no CUDA device: the {','.join(big)} shape(s) would be built and timed on "
                         "the CPU; run --dry-cpu (tiny shape, every code path once) instead")
    from vllm_specla.ops import chain_verify as cv_mod  # noqa: PLC0415

    if args.verify_kernel:
        cv_mod.VERIFY_KERNEL = args.verify_kernel
    csrc_on = False
    if device == "cuda":
        from vllm_specla.ops import _cpp, fused as _fused  # noqa: PLC0415

        if args.no_cuda_csrc:  # (switched off before the build: load_cuda_kernels skips it)
            cv_mod.USE_CUDA_CSRC = False
        if getattr(args, "skinny_gemm", None) == "off":
            _fused.USE_SKINNY_GEMM = False
        _cpp.load_cuda_kernels()  # (what DecodeRuntime does; here first, so the settings below see it)
        if args.cuda_csrc and not _cpp.CUDA_LOADED:
            try:  # (again, to name the cause: under VLLM_SPECLA_CUDA_KERNELS=0 nothing was tried)
                _cpp._ensure_cpu_extension()
                _cpp.load_cuda()
            except Exception as e:  # noqa: BLE001
                raise SystemExit(f"--cuda-csrc: the CUDA csrc chain verify did not build: {e}") from None
        csrc_on = cv_mod.USE_CUDA_CSRC and _cpp.CUDA_LOADED
        if args.cuda_pdl == "0":  # the CUDA binding reads VLLM_SPECLA_PDL per call; ops/pdl.py read it at import
            os.environ["VLLM_SPECLA_PDL"] = "0"
    gemv_rows = apply_kernel_flags(args, device)
    global SETTINGS
    SETTINGS = dict(gemv_rows=gemv_rows, verify_kernel=cv_mod.VERIFY_KERNEL, cuda_csrc=csrc_on,
                    cuda_pdl=csrc_on and args.cuda_pdl == "1", tag=args.tag)
    if args.dry_cpu:  # a fixed tiny grid: every code path once (the grid flags are not used)
        global DRY
        DRY = True
        args.batches, args.ks, args.steps = [2], [2], 3
        args.alphas = args.snapshot_alphas = [0.8]
        args.snapshot_ks = [2]
        args.tree_widths = [2]
        args.draft_vocabs = [0, 64]
        args.draft_weights = ["model", "fp8"]
        args.shapes = "tiny"
    if args.trained:
        bench_trained(args, device)
        return
    for shape in args.shapes.split(","):
        bench_shape(args, shape, device)


if __name__ == "__main__":
    main()
