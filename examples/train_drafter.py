#!/usr/bin/env python3
"""Train the target-aligned EAGLE-style drafter (ALGORITHMS.md §8) against a frozen GDN target.

Drafter (``vllm_specla.models.drafter.EagleDrafter`` layout): ``fc([embed(x_{t+1}); f_t])`` -> one
Gated DeltaNet block -> final RMSNorm -> ``f_hat_{t+1}``; logits through the target's frozen LM
head; the target's embedding is reused (neither is stored in the drafter checkpoint).

Features ``f_t`` are the target's final-normed hidden states, computed on the fly with teacher
forcing (the target is frozen). Two data sources, alternated step by step:

1. **self-distillation**: the target's own greedy answers to the first user turns of training
   ShareGPT conversations (generated at the start of this script, until ``--gen-seconds``), so
   the drafter learns the target's distribution;
2. ShareGPT training text (random ``--seqlen`` windows).

Loss (EAGLE-1): ``SmoothL1(f_hat, f) + w * soft-CE(lm_head(f_hat), softmax(lm_head(f)))`` with
``w = --ce-weight``, uniform feature noise ``U(-n, n)`` on the input features, plus a second,
"training-time test" pass (``--ttt-weight``) in which half the input features are replaced by
the drafter's own (detached) predictions from the first pass, as at draft depth >= 2.

Backends: ``fla`` (CUDA; fla ``GatedDeltaNetBlock`` / ``RMSNorm``, bf16 autocast) or ``ours``
(CPU smoke: ``--device cpu --tiny --steps 2``). Saved parameter names are ``EagleDrafter``'s:
``fc.weight``, ``layers.0.*``, ``norm.weight``.

Evaluation (written to ``drafter_eval.json``): teacher-forced depth-1 top-1 agreement with the
target, and a greedy chain simulation at ``--K`` on MT-Bench and HumanEval prompts (conditional
acceptance per depth and mean acceptance length tau, ALGORITHMS.md §9b).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from specla_train_lib import (  # noqa: E402
    chain_acceptance,
    drafter_loss,
    greedy_generate,
    load_corpus,
    lr_at,
    random_windows,
    unragged,
    write_json,
)
from train_target import (  # noqa: E402
    _DROP_KEYS,
    TOKENIZER_FILES,
    autocast,
    hidden_fn,
    load_model,
    log,
    maybe_shim,
    save_weights,
)


class FlaEagleDrafter(nn.Module):
    """EagleDrafter with fla's block and norm (Triton kernels); same parameter names."""

    def __init__(self, fields: dict):
        super().__init__()
        from fla.models import GatedDeltaNetConfig as FlaConfig  # noqa: PLC0415
        from fla.models.gated_deltanet.modeling_gated_deltanet import GatedDeltaNetBlock  # noqa: PLC0415
        from fla.modules import RMSNorm  # noqa: PLC0415

        cfg = FlaConfig(**fields)
        D = cfg.hidden_size
        self.fc = nn.Linear(2 * D, D, bias=False)
        self.layers = nn.ModuleList([GatedDeltaNetBlock(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(D, eps=cfg.norm_eps)

    def forward_sequence(self, tokens, feats, embed):
        h = self.fc(torch.cat([embed(tokens), feats.to(self.fc.weight.dtype)], -1))
        for layer in self.layers:
            h = layer(h, use_cache=False)[0]
        return self.norm(h)


def drafter_fields(target_dir: str) -> dict:
    from vllm_specla.models.config import GatedDeltaNetConfig  # noqa: PLC0415
    from vllm_specla.models.drafter import drafter_config_from_target  # noqa: PLC0415

    with open(os.path.join(target_dir, "config.json")) as f:
        raw = json.load(f)
    tc = GatedDeltaNetConfig(**{k: v for k, v in raw.items() if k not in ("model_type", "architectures", "torch_dtype")})
    d = drafter_config_from_target(tc).to_dict()
    for k in _DROP_KEYS + ("model_type", "architectures"):
        d.pop(k, None)
    return d


def build_drafter(backend: str, fields: dict, seed: int) -> nn.Module:
    from vllm_specla.models.gdn import GatedDeltaNetForCausalLM  # noqa: PLC0415

    torch.manual_seed(seed)
    if backend == "fla":
        m = FlaEagleDrafter(fields)
    else:
        from vllm_specla.models.config import GatedDeltaNetConfig  # noqa: PLC0415
        from vllm_specla.models.drafter import EagleDrafter  # noqa: PLC0415

        m = EagleDrafter(GatedDeltaNetConfig(**fields))
    GatedDeltaNetForCausalLM.init_weights(m, seed=seed)  # fla-style name-based init
    return m


def save_drafter(model: nn.Module, fields: dict, out: str, target_dir: str) -> list[str]:
    os.makedirs(out, exist_ok=True)
    names = save_weights(dict(model.state_dict()), out, shard_mb=15.0)
    cfg = dict(fields)
    cfg.update(model_type="gated_deltanet", architectures=["EagleDrafter"], specla_drafter="eagle",
               torch_dtype="bfloat16")
    write_json(os.path.join(out, "config.json"), cfg)
    for f in TOKENIZER_FILES:
        if os.path.exists(os.path.join(target_dir, f)):
            shutil.copy(os.path.join(target_dir, f), os.path.join(out, f))
    return names


def load_saved_drafter(backend: str, out: str, device) -> nn.Module:
    from vllm_specla.models.drafter import load_eagle_drafter  # noqa: PLC0415
    from vllm_specla.models.gdn import iter_safetensors  # noqa: PLC0415

    if backend == "ours":
        return load_eagle_drafter(out, torch.float32, device)
    with open(os.path.join(out, "config.json")) as f:
        raw = json.load(f)
    m = FlaEagleDrafter({k: v for k, v in raw.items() if k not in ("model_type", "architectures", "torch_dtype")})
    m.load_state_dict({k: v.float() for k, v in iter_safetensors(out)}, strict=True)
    return m.to(device).eval()


def pad_batch(seqs: list[list[int]], device, multiple: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(s) for s in seqs)
    T = -(-T // multiple) * multiple
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = True
    return ids.to(device), mask.to(device)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="trained target checkpoint dir")
    ap.add_argument("--data", required=True, help="corpus dir (train_target.py --data)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--backend", choices=["fla", "ours"], default=None)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--deadline", type=float, default=None, help="unix time to stop training")
    ap.add_argument("--time-budget", type=float, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seqlen", type=int, default=None)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--ce-weight", type=float, default=1.0)
    ap.add_argument("--noise", type=float, default=0.05, help="uniform feature noise half-width")
    ap.add_argument("--ttt-weight", type=float, default=0.5)
    ap.add_argument("--ttt-prob", type=float, default=0.5)
    ap.add_argument("--gen-prompts", type=int, default=None, help="max prompts to self-distil")
    ap.add_argument("--gen-max-new", type=int, default=None)
    ap.add_argument("--gen-max-prompt", type=int, default=192)
    ap.add_argument("--gen-seconds", type=float, default=60.0)
    ap.add_argument("--gen-batch", type=int, default=512)
    ap.add_argument("--K", type=int, default=4)
    ap.add_argument("--eval-max-new", type=int, default=None)
    ap.add_argument("--eval-mtbench", type=int, default=None)
    ap.add_argument("--eval-humaneval", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t_start = time.time()
    dev = args.device
    backend = args.backend or "ours"
    maybe_shim(backend, dev)
    amp = dev.startswith("cuda")
    tiny = args.tiny
    if args.steps is None and args.deadline is None and args.time_budget is None:
        args.steps = 2 if tiny else 2000
    batch = args.batch or (2 if tiny else 32)
    seqlen = args.seqlen or (64 if tiny else 512)
    warmup = args.warmup if args.warmup is not None else (1 if tiny else 100)
    gen_prompts = args.gen_prompts if args.gen_prompts is not None else (4 if tiny else 100_000)
    gen_max_new = args.gen_max_new or (8 if tiny else 192)
    eval_max_new = args.eval_max_new or (12 if tiny else 192)
    n_mt = args.eval_mtbench if args.eval_mtbench is not None else (2 if tiny else 80)
    n_he = args.eval_humaneval if args.eval_humaneval is not None else (1 if tiny else 40)

    target = load_model(backend, args.target, dev)
    target.requires_grad_(False)
    thf = hidden_fn(target, backend)
    embed = target.model.embeddings
    lm_w = target.lm_head.weight
    eos = int(json.load(open(os.path.join(args.target, "config.json")))["eos_token_id"])

    def tgt_hidden(ids):
        with torch.no_grad(), autocast(dev, amp):
            return thf(ids).float()

    data = load_corpus(args.data)
    train = data["train"]
    gen = np.random.default_rng(args.seed)

    # ---- 1. self-distillation data: the target's greedy answers ---------------------------------
    t0 = time.time()
    prompts = [p for p in unragged(data["prompts"], data["prompts_off"]) if 4 <= len(p) <= args.gen_max_prompt]
    order = gen.permutation(len(prompts))[:gen_prompts]
    selfgen: list[list[int]] = []
    for s in range(0, len(order), args.gen_batch):
        if time.time() - t0 > args.gen_seconds and selfgen:
            break
        chunk = [prompts[i] for i in order[s:s + args.gen_batch]]
        outs = greedy_generate(tgt_hidden, lm_w, chunk, gen_max_new, eos, dev, batch_rows=args.gen_batch)
        selfgen += [p + o for p, o in zip(chunk, outs)]
        log(f"self-distillation: {len(selfgen)} sequences, "
            f"{sum(map(len, selfgen)) / 1e6:.2f} M tokens, {time.time() - t0:.0f}s")
    gen_seconds = time.time() - t0
    n_hold = max(1, len(selfgen) // 20)
    selfgen_val, selfgen_train = selfgen[:n_hold], selfgen[n_hold:] or selfgen[:1]

    # ---- 2. train ---------------------------------------------------------------------------------
    fields = drafter_fields(args.target)
    drafter = build_drafter(backend, fields, args.seed).to(dev)
    drafter.train()
    n_params = sum(p.numel() for p in drafter.parameters())
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0,
                            fused=dev.startswith("cuda"))
    log(f"drafter {n_params / 1e6:.2f} M params, backend {backend}; self-distilled train {len(selfgen_train)} seqs")

    def step_loss(ids, mask, noise: float, ttt_w: float):
        f = tgt_hidden(ids)
        tok, f_in, f_next, m = ids[:, 1:], f[:, :-1], f[:, 1:], mask[:, 1:]
        if noise > 0:
            f_in = f_in + (torch.rand_like(f_in) * 2 - 1) * noise
        with autocast(dev, amp):
            fh = drafter.forward_sequence(tok, f_in, embed)
        loss, st = drafter_loss(fh, f_next, lm_w, args.ce_weight, m)
        if ttt_w > 0:
            swap = torch.rand(f_in.shape[:2], device=f_in.device) < args.ttt_prob
            swap[:, 0] = False
            prev = torch.cat([f_in[:, :1], fh[:, :-1].detach().float()], 1)
            f_in2 = torch.where(swap[..., None], prev, f_in)
            with autocast(dev, amp):
                fh2 = drafter.forward_sequence(tok, f_in2, embed)
            loss2, st2 = drafter_loss(fh2, f_next, lm_w, args.ce_weight, m)
            loss = loss + ttt_w * loss2
            st["acc_ttt"] = st2["acc"]
        return loss, st

    hist = []
    step, clock0, budget = 0, None, None
    t_train0 = time.time()
    ema = None
    while True:
        if args.steps is not None and step >= args.steps:
            break
        if clock0 is None and step == 3:
            clock0 = time.time()
            if args.deadline is not None:
                budget = args.deadline - clock0
            elif args.time_budget is not None:
                budget = args.time_budget - (clock0 - t_train0)
        if args.steps is None:
            frac = 0.0 if budget is None else (time.time() - clock0) / max(budget, 1e-6)
            if frac >= 1.0:
                break
            lr = lr_at(int(frac * 10_000), 10_000, args.lr, 0) if step >= warmup else args.lr * (step + 1) / warmup
        else:
            lr = lr_at(step, args.steps, args.lr, warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        if step % 2 == 0:
            rows = [selfgen_train[i] for i in gen.integers(0, len(selfgen_train), size=batch)]
            ids, mask = pad_batch(rows, dev)
        else:
            ids = random_windows(train, batch, seqlen, gen).to(dev)
            mask = torch.ones_like(ids, dtype=torch.bool)
        loss, st = step_loss(ids, mask, args.noise, args.ttt_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        lv = float(loss.detach())
        if not math.isfinite(lv):
            raise FloatingPointError(f"drafter loss {lv} at step {step}")
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        if step % 100 == 0 or step <= 3 or (args.steps is not None and step == args.steps):
            el = time.time() - t_train0
            log(f"drafter step {step} loss {lv:.3f} (ema {ema:.3f}) l1 {st['l1']:.4f} ce {st['ce']:.3f} "
                f"acc {st['acc']:.3f} acc_ttt {st.get('acc_ttt', float('nan')):.3f} lr {lr:.2e} "
                f"gnorm {float(gnorm):.2f} {el:.0f}s")
            hist.append({"step": step, "loss": lv, "ema": ema, "lr": lr, "seconds": el,
                         "src": "selfgen" if (step - 1) % 2 == 0 else "sharegpt", **st})
    train_seconds = time.time() - t_train0
    names = save_drafter(drafter, fields, args.out, args.target)
    del opt

    # ---- 3. evaluate the saved (bf16-rounded) drafter ------------------------------------------------
    dr = load_saved_drafter(backend, args.out, dev)

    def drafter_fn(tok, feats):
        with torch.no_grad(), autocast(dev, amp):
            return dr.forward_sequence(tok, feats.float(), embed).float()

    @torch.no_grad()
    def tf_acc(seqs):
        accs, n = 0.0, 0
        for s in range(0, len(seqs), 16):
            ids, mask = pad_batch(seqs[s:s + 16], dev)
            f = tgt_hidden(ids)
            fh = drafter_fn(ids[:, 1:], f[:, :-1])
            _, st = drafter_loss(fh, f[:, 1:], lm_w, args.ce_weight, mask[:, 1:])
            k = int(mask[:, 1:].sum())
            accs += st["acc"] * k
            n += k
        return accs / max(n, 1)

    ev: dict = {"K": args.K}
    val_convs = [c[:seqlen] for c in unragged(data["val"], data["val_off"]) if len(c) > 8][: (4 if tiny else 64)]
    ev["tf_depth1_acc_val_sharegpt"] = tf_acc(val_convs)
    ev["tf_depth1_acc_selfgen_heldout"] = tf_acc(selfgen_val[: (4 if tiny else 128)])
    log(f"teacher-forced depth-1 agreement: val ShareGPT {ev['tf_depth1_acc_val_sharegpt']:.3f}, "
        f"held-out self-generated {ev['tf_depth1_acc_selfgen_heldout']:.3f}")
    samples = {}
    tok = None
    try:
        from tokenizers import Tokenizer  # noqa: PLC0415

        tok = Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    except Exception:
        pass
    for name, n in (("mtbench", n_mt), ("humaneval", n_he)):
        if n <= 0 or name not in data:
            continue
        ps = unragged(data[name], data[name + "_off"])[:n]
        t1 = time.time()
        outs = greedy_generate(tgt_hidden, lm_w, ps, eval_max_new, eos, dev, batch_rows=128)
        seqs = [(p + o, len(p)) for p, o in zip(ps, outs)]
        res = chain_acceptance(drafter_fn, tgt_hidden, lm_w, seqs, args.K, dev)
        res["gen_tokens"] = int(sum(len(o) for o in outs))
        res["seconds"] = time.time() - t1
        ev["chain_" + name] = res
        if tok is not None:
            samples[name] = [{"prompt": tok.decode(p, skip_special_tokens=False),
                              "answer": tok.decode(o, skip_special_tokens=False)} for p, o in zip(ps[:5], outs[:5])]
        log(f"chain K={args.K} on {name}: alpha {[round(a, 3) for a in res['alpha']]} "
            f"tau {res['tau']:.2f} ({res['n_starts']} starts)")
    summary = {
        "backend": backend, "device": dev, "params": n_params, "fields": fields, "steps": step,
        "batch": batch, "seqlen": seqlen, "lr": args.lr, "ce_weight": args.ce_weight, "noise": args.noise,
        "ttt_weight": args.ttt_weight, "ttt_prob": args.ttt_prob, "seed": args.seed,
        "selfgen_seqs": len(selfgen), "selfgen_tokens": int(sum(map(len, selfgen))),
        "gen_seconds": gen_seconds, "train_seconds": train_seconds, "final_loss_ema": ema,
        "history": hist, "eval": ev, "samples": samples, "shards": names,
        "total_seconds": time.time() - t_start,
    }
    write_json(os.path.join(args.out, "drafter_log.json"), summary)
    log(f"saved drafter {args.out} in {summary['total_seconds']:.0f}s")
    return summary


if __name__ == "__main__":
    main()
