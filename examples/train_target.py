#!/usr/bin/env python3
"""Train the default small Gated DeltaNet target LM on ShareGPT (+ a little Shakespeare).

Backends (same fla 0.6.0 parameter names, so either one's checkpoint loads in the other):

* ``--backend fla`` (default on CUDA): fla's ``GatedDeltaNetForCausalLM`` with its Triton kernels,
  fp32 master weights under bf16 autocast.
* ``--backend ours`` (default on CPU): :class:`vllm_specla.models.gdn.GatedDeltaNetForCausalLM`
  (``hidden_sequence``/``forward_sequence``, plain torch) - slow, for the CI smoke test
  (``--device cpu --tiny --steps 3``).

Data: ``--data DIR/corpus.npz.xz`` from :func:`specla_train_lib.prepare_corpus` (built on the
fly from ``--tokenizer`` when missing). Training samples random ``--seqlen`` windows of the
shuffled train stream; validation uses the held-out 1 % of conversations.

Output (``--out``): fla-format checkpoint - ``config.json`` (``model_type: gated_deltanet``, fla
field names), bf16 ``model-0000i-of-0000N.safetensors`` shards (<= ``--shard-mb``) + index,
``generation_config.json``, tokenizer files, ``heldout_val.json`` (a held-out token slice with
its measured perplexity) and ``train_log.json``. On CUDA with fla the run also compares our
plain-torch model's logits with fla's on the saved checkpoint (the issue-2 oracle check).

Usage::

    python examples/train_target.py --tokenizer T --data D --out models/specla-gdn-tiny/target --device cuda
    python examples/train_target.py --tokenizer T --data D --out .cache/specla/smoke_target --device cpu --tiny --steps 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from specla_train_lib import (  # noqa: E402
    CORPUS_FILE,
    TinyShape,
    load_corpus,
    lr_at,
    prepare_corpus,
    random_windows,
    unragged,
    write_json,
)

FULL_SHAPE = dict(hidden_size=384, num_hidden_layers=8, num_heads=4, head_dim=64, expand_v=2.0)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_DROP_KEYS = ("id2label", "label2id", "problem_type", "_name_or_path", "chunk_size_feed_forward",
              "is_encoder_decoder", "output_attentions", "output_hidden_states", "return_dict",
              "transformers_version", "dtype", "torch_dtype")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def maybe_shim(backend: str, device: str) -> None:
    """fla on CPU: swap its Triton ops for torch (plumbing tests); ours: batched chunk GDN."""
    if backend == "fla" and (device == "cpu" or os.environ.get("SPECLA_FLA_CPU_SHIM") == "1"):
        import fla_cpu_shim  # noqa: PLC0415

        fla_cpu_shim.install()
    if backend == "ours":
        import fast_gdn  # noqa: PLC0415

        fast_gdn.install()


# ---- model construction / loading / saving ---------------------------------------------------


def model_fields(shape: dict, vocab_size: int) -> dict:
    """The checkpoint config fields (fla ``GatedDeltaNetConfig`` names)."""
    return dict(
        attn_mode="chunk", hidden_size=shape["hidden_size"], num_hidden_layers=shape["num_hidden_layers"],
        num_heads=shape["num_heads"], head_dim=shape["head_dim"], expand_v=shape["expand_v"],
        num_v_heads=None, use_gate=True, use_short_conv=True, conv_size=4, allow_neg_eigval=False,
        hidden_ratio=4, intermediate_size=None, hidden_act="swish", norm_eps=1e-6,
        max_position_embeddings=4096, vocab_size=vocab_size, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=None, initializer_range=0.02,
    )


def config_dict(fields: dict, **extra) -> dict:
    from vllm_specla.models.config import GatedDeltaNetConfig  # noqa: PLC0415

    d = GatedDeltaNetConfig(**fields).to_dict()
    for k in _DROP_KEYS:
        d.pop(k, None)
    d.update(model_type="gated_deltanet", architectures=["GatedDeltaNetForCausalLM"], torch_dtype="bfloat16")
    d.update(extra)
    return d


def build_model(backend: str, fields: dict, seed: int):
    torch.manual_seed(seed)
    if backend == "fla":
        from fla.models import GatedDeltaNetConfig as FlaConfig  # noqa: PLC0415
        from fla.models import GatedDeltaNetForCausalLM as FlaLM  # noqa: PLC0415

        model = FlaLM(FlaConfig(**fields))
        if model.lm_head.weight is not model.model.embeddings.weight:
            model.lm_head.weight = model.model.embeddings.weight
        return model
    from vllm_specla.models.config import GatedDeltaNetConfig  # noqa: PLC0415
    from vllm_specla.models.gdn import GatedDeltaNetForCausalLM  # noqa: PLC0415

    return GatedDeltaNetForCausalLM(GatedDeltaNetConfig(**fields)).init_weights(seed)


def load_model(backend: str, path: str, device) -> torch.nn.Module:
    """Load a saved checkpoint (fp32) into either backend's model class."""
    if backend == "ours":
        from vllm_specla.models.gdn import load_fla_checkpoint  # noqa: PLC0415

        return load_fla_checkpoint(path, torch.float32, device)
    from vllm_specla.models.gdn import iter_safetensors  # noqa: PLC0415

    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "torch_dtype")}
    model = build_model("fla", fields, 0)
    sd = dict(iter_safetensors(path))
    if raw.get("tie_word_embeddings"):
        sd.setdefault("lm_head.weight", sd["model.embeddings.weight"])
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if missing or unexpected:
        raise KeyError(f"fla load of {path}: missing {missing[:4]} unexpected {unexpected[:4]}")
    return model.to(device=device, dtype=torch.float32).eval()


def hidden_fn(model, backend: str):
    """``ids [B, T] -> final-normed features [B, T, D]`` (the LM head's input)."""
    if backend == "fla":
        return lambda ids: model.model(input_ids=ids, use_cache=False).last_hidden_state
    return model.hidden_sequence


def save_weights(state: dict[str, torch.Tensor], out: str, shard_mb: float, prefix: str = "model") -> list[str]:
    """bf16 safetensors shards of at most ``shard_mb`` MB (+ index when more than one)."""
    from safetensors.torch import save_file  # noqa: PLC0415

    limit = int(shard_mb * 1e6)
    shards: list[dict] = [{}]
    size = 0
    for k, v in state.items():
        t = v.detach().to("cpu", torch.bfloat16).contiguous()
        nb = t.numel() * 2
        if shards[-1] and size + nb > limit:
            shards.append({})
            size = 0
        shards[-1][k] = t
        size += nb
    names = []
    n = len(shards)
    for i, sh in enumerate(shards):
        name = f"{prefix}.safetensors" if n == 1 else f"{prefix}-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file(sh, os.path.join(out, name), metadata={"format": "pt"})
        names.append(name)
    if n > 1:
        index = {"metadata": {"total_size": sum(t.numel() * 2 for sh in shards for t in sh.values())},
                 "weight_map": {k: names[i] for i, sh in enumerate(shards) for k in sh}}
        write_json(os.path.join(out, f"{prefix}.safetensors.index.json"), index)
    return names


def save_checkpoint(model, fields: dict, out: str, tokenizer_dir: str, shard_mb: float) -> list[str]:
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".safetensors") or f.endswith(".safetensors.index.json"):
            os.remove(os.path.join(out, f))
    state = {k: v for k, v in model.state_dict().items() if not (k == "lm_head.weight" and fields["tie_word_embeddings"])}
    names = save_weights(state, out, shard_mb)
    write_json(os.path.join(out, "config.json"), config_dict(fields))
    write_json(os.path.join(out, "generation_config.json"),
               {"bos_token_id": fields["bos_token_id"], "eos_token_id": fields["eos_token_id"], "pad_token_id": 3})
    for f in TOKENIZER_FILES:
        shutil.copy(os.path.join(tokenizer_dir, f), os.path.join(out, f))
    return names


# ---- evaluation -------------------------------------------------------------------------------


@torch.no_grad()
def eval_nll(hfn, lm_w, seqs: list[list[int]], device, batch: int = 16, amp: bool = False) -> tuple[float, int]:
    """Mean next-token NLL (nats) over all positions of right-padded sequences, and the count."""
    tot, cnt = 0.0, 0
    for s in range(0, len(seqs), batch):
        rows = seqs[s:s + batch]
        T = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), T, dtype=torch.long)
        mask = torch.zeros(len(rows), T, dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = True
        ids, mask = ids.to(device), mask.to(device)
        with autocast(device, amp):
            h = hfn(ids[:, :-1])
        logits = h.float() @ lm_w.float().t()
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
        m = mask[:, 1:].reshape(-1)
        tot += float(nll[m].sum())
        cnt += int(m.sum())
    return tot / max(cnt, 1), cnt


def autocast(device, enabled: bool):
    dev = torch.device(device).type
    if enabled and dev == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def oracle_check(out_dir: str, ids: torch.Tensor, device) -> dict:
    """Our plain-torch model vs fla's GatedDeltaNetForCausalLM, fp32, on the saved checkpoint."""
    from vllm_specla.models.gdn import load_fla_checkpoint  # noqa: PLC0415

    ours = load_fla_checkpoint(out_dir, torch.float32, device)
    fla_m = load_model("fla", out_dir, device)
    ids = ids.to(device)
    t = time.time()
    lf = fla_m(input_ids=ids, use_cache=False).logits.float()
    t_fla = time.time() - t
    t = time.time()
    lo = ours.forward_sequence(ids).float()
    t_ours = time.time() - t
    with torch.autocast("cuda", dtype=torch.bfloat16):
        lb = fla_m(input_ids=ids, use_cache=False).logits.float()
    err = (lo - lf)
    nll = lambda lg: float(F.cross_entropy(lg[:, :-1].reshape(-1, lg.shape[-1]), ids[:, 1:].reshape(-1)))  # noqa: E731
    res = {
        "shape": list(ids.shape),
        "max_abs_err": float(err.abs().max()),
        "rel_err": float(err.norm() / lf.norm()),
        "max_abs_logit": float(lf.abs().max()),
        "top1_agree": float((lo.argmax(-1) == lf.argmax(-1)).float().mean()),
        "nll_fla_fp32": nll(lf), "nll_ours_fp32": nll(lo), "nll_fla_bf16_autocast": nll(lb),
        "rel_err_fla_bf16_vs_ours_fp32": float((lb - lo).norm() / lo.norm()),
        "seconds_fla": t_fla, "seconds_ours": t_ours,
    }
    return res


@torch.no_grad()
def fast_vs_reference(out_dir: str, ids: torch.Tensor, device) -> dict:
    """Logits of the batched training path (fast_gdn) vs the plain reference path, fp32."""
    import fast_gdn  # noqa: PLC0415
    from vllm_specla.models.gdn import load_fla_checkpoint  # noqa: PLC0415

    m = load_fla_checkpoint(out_dir, torch.float32, device)
    ids = ids.to(device)
    lf = m.forward_sequence(ids).float()
    fast_gdn.uninstall()
    try:
        lr = m.forward_sequence(ids).float()
    finally:
        fast_gdn.install()
    err = lf - lr
    return {"shape": list(ids.shape), "max_abs_err": float(err.abs().max()),
            "rel_err": float(err.norm() / lr.norm()), "top1_agree": float((lf.argmax(-1) == lr.argmax(-1)).float().mean())}


# ---- main -------------------------------------------------------------------------------------


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="tokenizer dir (examples/train_tokenizer.py)")
    ap.add_argument("--data", required=True, help=f"dir holding {CORPUS_FILE} (built here if missing)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backend", choices=["fla", "ours"], default=None,
                    help="ours (default; batched plain-torch chunk GDN, fast_gdn.py) or fla (Triton)")
    ap.add_argument("--tiny", action="store_true", help="tiny shape / batch (CI smoke)")
    ap.add_argument("--steps", type=int, default=None, help="fixed step count (default: until --deadline)")
    ap.add_argument("--deadline", type=float, default=None, help="unix time to stop training")
    ap.add_argument("--time-budget", type=float, default=None, help="seconds of training (alternative to --deadline)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seqlen", type=int, default=None)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-mb", type=float, default=15.0)
    ap.add_argument("--val-seqs", type=int, default=None, help="val conversations for the val loss")
    ap.add_argument("--heldout", type=int, default=32, help="sequences in the shipped held-out slice")
    ap.add_argument("--heldout-len", type=int, default=257)
    ap.add_argument("--no-oracle", action="store_true")
    args = ap.parse_args(argv)
    t_start = time.time()
    dev = args.device
    backend = args.backend or "ours"
    maybe_shim(backend, dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.steps is None and args.deadline is None and args.time_budget is None:
        args.steps = 3 if args.tiny else 1000
    batch = args.batch or (4 if args.tiny else 128)
    seqlen = args.seqlen or (64 if args.tiny else 1024)
    warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 100)

    if not os.path.exists(os.path.join(args.data, CORPUS_FILE)):
        log(f"preparing corpus in {args.data}")
        log(json.dumps(prepare_corpus(args.tokenizer, args.data, limit=300 if args.tiny else None,
                                      shakespeare_chars=20_000 if args.tiny else 1_000_000)))
    data = load_corpus(args.data)
    train = data["train"]
    val_convs = unragged(data["val"], data["val_off"])
    from tokenizers import Tokenizer  # noqa: PLC0415

    vocab = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json")).get_vocab_size()
    shape = TinyShape().__dict__ if args.tiny else FULL_SHAPE
    fields = model_fields(shape, vocab)
    model = build_model(backend, fields, args.seed).to(dev)
    model.train()
    hfn = hidden_fn(model, backend)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"backend {backend} on {dev}; {n_params / 1e6:.2f} M params; train {len(train) / 1e6:.2f} M tokens; "
        f"batch {batch} x {seqlen}")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embeddings" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embeddings" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.startswith("cuda"))
    gen = np.random.default_rng(args.seed)
    amp = dev.startswith("cuda")
    hist = []
    step, tokens = 0, 0
    t_train0 = time.time()
    clock0, budget = None, None
    ema = None
    while True:
        if args.steps is not None:
            if step >= args.steps:
                break
            progress_total = args.steps
        if clock0 is None and step == 3:  # kernels compiled: start the time-based schedule
            clock0 = time.time()
            if args.deadline is not None:
                budget = args.deadline - clock0
            elif args.time_budget is not None:
                budget = args.time_budget - (clock0 - t_train0)
        if args.steps is None:
            if budget is not None:
                frac = (time.time() - clock0) / max(budget, 1e-6)
                if frac >= 1.0:
                    break
            else:
                frac = 0.0
            lr = lr_at(int(frac * 10_000), 10_000, args.lr, 0) if step >= warmup else args.lr * (step + 1) / warmup
        else:
            lr = lr_at(step, progress_total, args.lr, warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        x = random_windows(train, batch, seqlen + 1, gen).to(dev, non_blocking=True)
        with autocast(dev, amp):
            h = hfn(x[:, :-1])
            logits = F.linear(h, model.lm_head.weight)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += batch * seqlen
        lv = float(loss.detach())
        if not math.isfinite(lv):
            raise FloatingPointError(f"loss {lv} at step {step}")
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        if step % 50 == 0 or step <= 3 or (args.steps is not None and step == args.steps):
            el = time.time() - t_train0
            log(f"step {step} loss {lv:.3f} (ema {ema:.3f}) lr {lr:.2e} gnorm {float(gnorm):.2f} "
                f"{tokens / 1e6:.1f} M tok {el:.0f}s {tokens / max(el, 1e-6) / 1e3:.0f} k tok/s")
            hist.append({"step": step, "loss": lv, "ema": ema, "lr": lr, "tokens": tokens, "seconds": el})
    train_seconds = time.time() - t_train0
    model.eval()

    # ---- save, then evaluate the saved (bf16-rounded) weights ----
    names = save_checkpoint(model, fields, args.out, args.tokenizer, args.shard_mb)
    del opt
    ev = load_model(backend, args.out, dev)
    ehfn = hidden_fn(ev, backend)
    lm_w = ev.lm_head.weight
    nval = args.val_seqs or (8 if args.tiny else len(val_convs))
    vseqs = [c[: seqlen + 1] for c in val_convs[:nval] if len(c) > 1]
    vnll, vcnt = eval_nll(ehfn, lm_w, vseqs, dev, amp=amp)
    log(f"val: {vcnt} tokens, loss {vnll:.4f}, ppl {math.exp(vnll):.2f}")
    hl = args.heldout_len if not args.tiny else 33
    held = [c[:hl] for c in val_convs if len(c) >= hl][: args.heldout]
    try:
        hnll, hcnt = eval_nll(ehfn, lm_w, held, dev, amp=False)
    except Exception as e:  # fp32 fla kernels unavailable: fall back to bf16 autocast
        log(f"fp32 held-out eval failed ({e!r}); using autocast")
        hnll, hcnt = eval_nll(ehfn, lm_w, held, dev, amp=amp)
    write_json(os.path.join(args.out, "heldout_val.json"), {
        "description": "held-out ShareGPT V3 conversations (index % 100 == 0, never trained on), "
                       "chat template, first tokens; perplexity = exp(mean next-token NLL), fp32",
        "seqlen": hl, "ids": held, "nll": hnll, "ppl": math.exp(hnll), "tokens_scored": hcnt})
    summary = {
        "backend": backend, "device": dev, "params": n_params, "fields": fields, "steps": step,
        "batch": batch, "seqlen": seqlen, "tokens": tokens, "epochs": tokens / len(train),
        "train_seconds": train_seconds, "lr": args.lr, "warmup": warmup, "weight_decay": args.weight_decay,
        "seed": args.seed, "train_tokens_available": int(len(train)),
        "val_loss": vnll, "val_ppl": math.exp(vnll), "val_tokens": vcnt, "val_seqs": len(vseqs),
        "heldout_loss": hnll, "heldout_ppl": math.exp(hnll), "heldout_tokens": hcnt,
        "final_train_loss_ema": ema, "history": hist, "shards": names,
        "gpu": torch.cuda.get_device_name(0) if dev.startswith("cuda") else None,
        "torch": torch.__version__,
    }
    log(f"held-out slice ppl {math.exp(hnll):.2f}")
    if backend == "ours" and not args.no_oracle:
        try:
            summary["fast_vs_reference"] = fast_vs_reference(args.out, torch.tensor(held[:4]), dev)
            log(f"batched training path vs reference path: {summary['fast_vs_reference']}")
        except Exception as e:  # recorded, not fatal
            summary["fast_vs_reference"] = {"error": repr(e)[:2000]}
            log(f"fast-vs-reference check failed: {e!r}")
    if backend == "fla" and dev.startswith("cuda") and not args.no_oracle:
        try:
            summary["oracle"] = oracle_check(args.out, torch.tensor(held[:4]), dev)
            log(f"oracle (ours vs fla, fp32): {summary['oracle']}")
        except Exception as e:  # recorded, not fatal
            summary["oracle"] = {"error": repr(e)[:2000]}
            log(f"oracle check failed: {e!r}")
    try:
        from importlib.metadata import version  # noqa: PLC0415

        summary["fla"] = version("flash-linear-attention")
    except Exception:
        pass
    summary["total_seconds"] = time.time() - t_start
    write_json(os.path.join(args.out, "train_log.json"), summary)
    log(f"saved {args.out} ({', '.join(names)}) in {summary['total_seconds']:.0f}s")
    return summary


if __name__ == "__main__":
    main()
