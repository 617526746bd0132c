#!/usr/bin/env python3
"""Train the default model's byte-level BPE tokenizer (HF ``tokenizers``) on ShareGPT + Shakespeare.

Writes ``tokenizer.json``, ``tokenizer_config.json`` (PreTrainedTokenizerFast, with the chat
template), ``special_tokens_map.json`` into ``--out`` so that
``transformers.AutoTokenizer.from_pretrained(out)`` loads it offline (and vLLM with it).

Special tokens (ids 0..6): ``<unk> <s> </s> <pad> <|user|> <|assistant|> <|system|>``; bos ``<s>``
(1), eos ``</s>`` (2). The post-processor adds bos when ``add_special_tokens=True``; the chat
template writes bos itself (HF renders chat prompts with ``add_special_tokens=False``).

Usage::

    python examples/train_tokenizer.py --out models/specla-gdn-tiny/target            # full
    python examples/train_tokenizer.py --out .cache/specla/smoke_tok --tiny                        # CI smoke
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from specla_train_lib import (  # noqa: E402
    BOS,
    CHAT_TEMPLATE,
    EOS,
    PAD,
    SPECIAL_TOKENS,
    UNK,
    is_val,
    render_chat,
    shakespeare_docs,
    sharegpt_messages,
)


def build_tokenizer(texts, vocab_size: int, min_frequency: int = 2):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: PLC0415

    tok = Tokenizer(models.BPE(unk_token=UNK, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]),
    ])
    return tok


def save_tokenizer(tok, out: str) -> None:
    """Write the tokenizer files (fast tokenizer + HF configs) into ``out``."""
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in (UNK, BOS, EOS, PAD)}
    added = {
        str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                  "single_word": False, "special": True}
        for t in SPECIAL_TOKENS
    }
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": PAD,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "padding_side": "left",
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": PAD}, f, indent=2)
        f.write("\n")
    assert ids == {UNK: 0, BOS: 1, EOS: 2, PAD: 3}, ids


def corpus(tiny: bool, shakespeare_chars: int):
    from vllm_specla.data import sharegpt_conversations  # noqa: PLC0415

    convs = sharegpt_conversations(limit=200 if tiny else None)
    texts = [render_chat(sharegpt_messages(c)) for i, c in enumerate(convs) if not is_val(i)]
    texts += shakespeare_docs(20_000 if tiny else shakespeare_chars)
    return texts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--shakespeare-chars", type=int, default=2_000_000)
    ap.add_argument("--tiny", action="store_true", help="200 conversations, vocab 512 (CI smoke)")
    args = ap.parse_args(argv)
    t0 = time.time()
    texts = corpus(args.tiny, args.shakespeare_chars)
    vocab = 512 if args.tiny else args.vocab_size
    print(f"[tokenizer] {len(texts)} documents, {sum(map(len, texts)) / 1e6:.1f} M chars; training BPE vocab {vocab}",
          flush=True)
    tok = build_tokenizer(texts, vocab)
    save_tokenizer(tok, args.out)
    sample = render_chat([{"role": "user", "content": "Hello! Write a haiku."}], add_generation_prompt=True)
    enc = tok.encode(sample, add_special_tokens=False)
    print(f"[tokenizer] vocab {tok.get_vocab_size()}, saved to {args.out} in {time.time() - t0:.0f}s; "
          f"sample -> {enc.tokens}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
