"""Tokenizers: train a small byte-level BPE on the corpus, or load a user's tokenizer."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from data.encoding import training_pieces
from data.errors import DataError

if TYPE_CHECKING:  # transformers imports torch (seconds); load it only when a tokenizer is needed
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)  # ids 0, 1, 2 in a trained tokenizer


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` with the `tokenizers` library.

    The vocabulary holds the 3 special tokens (ids 0..2: "<|bos|>", "<|eos|>", "<|pad|>", set as the
    tokenizer's bos/eos/pad tokens), all 256 byte symbols, and merges up to `vocab_size` entries in
    total (fewer when the texts run out of pairs to merge). Any text encodes (byte fallback) and
    decodes back to itself. Encoding adds no special tokens; callers add BOS themselves. The result
    is the same for the same texts (in the same order), and survives `save_pretrained` +
    `AutoTokenizer.from_pretrained` with identical encodings. About 0.2 s for the default corpus.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise DataError(f"vocab_size must be an integer, got {vocab_size!r}")
    minimum = len(SPECIAL_TOKENS) + 256
    if vocab_size < minimum:
        raise DataError(
            f"vocab_size={vocab_size} is too small: a byte-level BPE needs {len(SPECIAL_TOKENS)} special "
            f"tokens + 256 byte symbols = {minimum}. Fix: use vocab_size >= {minimum} (e.g. 2048)."
        )
    texts = list(texts)
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise DataError(f"texts[{bad}] is a {type(texts[bad]).__name__}, not a string. Fix: pass strings.")
    if not any(t.strip() for t in texts):
        raise DataError("cannot train a tokenizer on no text: all texts are empty. Fix: pass the documents' texts.")

    backend = Tokenizer(models.BPE())
    # add_prefix_space=False: "word" at the start of a text stays distinct from " word", so
    # decode(encode(text)) == text exactly.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte, seen or not
        show_progress=False,
    )
    backend.train_from_iterator(training_pieces(texts), trainer=trainer)  # a long text in pieces: same words
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,  # the clean-up would change " ." to "." on decode
    )


def vocabulary_shortfall(tokenizer: Any, vocab_size: int) -> str | None:
    """One line saying that a trained BPE holds fewer tokens than `vocab_size` asked (its texts ran out of pairs to
    merge), or None when it holds them all."""
    if len(tokenizer) >= vocab_size:
        return None
    return (
        f"the trained BPE tokenizer has {len(tokenizer)} tokens, fewer than the {vocab_size} asked (--vocab-size): "
        "its training text holds no more pairs to merge; more text gives more tokens"
    )


def load_tokenizer(name_or_path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """Load a tokenizer with `AutoTokenizer.from_pretrained` from a folder or a Hugging Face name.

    When the tokenizer has no pad token, its eos token is used as the pad token (GPT-2 style
    tokenizers ship without one; batching needs one). A tokenizer with neither is returned with no
    pad token. Raises DataError when the folder or name cannot be loaded.
    """
    from transformers import AutoTokenizer

    name = os.fspath(name_or_path)
    path = Path(os.path.expanduser(name))
    if path.is_dir():
        if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
            raise DataError(
                f"{path}: folder holds no tokenizer (no tokenizer.json or tokenizer_config.json). "
                "Fix: pass the folder a tokenizer was saved to with save_pretrained."
            )
        name = str(path)
    elif isinstance(name_or_path, os.PathLike) or name.startswith((".", "/", "~")) or "\\" in name:
        raise DataError(f"{path}: no such tokenizer folder. Fix: check the path.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=False)  # a folder's own Python never runs
    except Exception as error:  # OSError, ValueError, hub errors: all mean "cannot load this"
        where = "folder" if path.is_dir() else "name (not a local folder; the hub may be unreachable)"
        raise DataError(
            f"cannot load a tokenizer from {where} {name!r}: {type(error).__name__}: {error}. "
            "Fix: pass a local folder written by save_pretrained, or train one with train_bpe_tokenizer."
        ) from None
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
