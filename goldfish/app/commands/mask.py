"""`goldfish mask`: show which tokens of a text or a conversation a goldfish mask drops."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from goldfish.app import options as opt
from goldfish.app.commands.option_values import mask_defaults, mask_of
from goldfish.app.config import DataSpec, MaskSpec
from goldfish.app.validation import validate_mask

if TYPE_CHECKING:  # the commands import torch, the engine and eval only when they run
    pass


def cmd_mask(args: argparse.Namespace) -> int:
    mask = mask_of(args)
    validate_mask({"--text": args.text, "--file": args.file, "--conversation": args.conversation}, mask)
    return run_mask(args, mask)


def run_mask(args: argparse.Namespace, mask: MaskSpec) -> int:
    """Print the text (or conversation) of `args` with the tokens `mask` drops marked, and how many it drops. Its
    checks need the tokenizer or the text (goldfish.app.validation names them)."""
    import torch

    import data
    from goldfish.masks import causal_targets, drop_mask, format_masked_text

    conversation = _mask_conversation(args) if args.conversation is not None else None
    if args.tokenizer:
        tokenizer = data.load_tokenizer(args.tokenizer)
    else:
        tokenizer = data.train_bpe_tokenizer((d.text for d in data.default_corpus()), vocab_size=args.vocab_size)
    if conversation is not None:
        from data.chat import TINY_CHAT_TEMPLATE, assistant_flags, check_chat_template, render_conversation

        if args.chat_template is not None:
            tokenizer.chat_template = Path(args.chat_template).read_text(encoding="utf-8")
        elif not args.tokenizer:
            tokenizer.chat_template = TINY_CHAT_TEMPLATE
        check_chat_template(tokenizer)
        rendered = render_conversation(tokenizer, conversation.messages or (), f"conversation {conversation.id!r}")
        ids, in_reply = rendered.ids, assistant_flags(len(rendered.ids), rendered.replies)
    else:
        text = args.text if args.text is not None else _read_mask_file(Path(args.file))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        in_reply = [True] * len(ids)
    if len(ids) < 2:
        raise ValueError("the text has fewer than 2 tokens: nothing to mask")
    # Each token after the first is a target of the token before it; the first token is never a target. A
    # conversation's mask is drawn over every true target (the hash reads the prompt) and kept on replies only.
    targets = causal_targets(torch.tensor([ids]))[0, :-1]
    dropped = drop_mask(
        targets, mask.strategy, mask.k, mask.h, special_token_ids=tokenizer.all_special_ids, seed=mask.seed
    ) & torch.tensor(in_reply[1:])
    pieces, flags = _whole_characters(tokenizer, ids, [False] + dropped.tolist())
    print(format_masked_text(pieces, flags, color=not args.no_color and sys.stdout.isatty()))
    n = sum(in_reply[1:])
    what = "reply targets (the loss covers the assistant's replies only)" if conversation is not None else "targets"
    print(
        f"\n{int(dropped.sum())} of {n} {what} dropped ({dropped.sum().item() / max(n, 1):.3f}; expected about "
        f"{1 / mask.k:.3f}) with strategy {mask.strategy}, k={mask.k}, h={mask.h}"
    )
    return 0


MASK_FILE_MOST_BYTES = 1_000_000  # goldfish mask prints the whole text: a megabyte is more than anyone reads


def _read_mask_file(path: Path) -> str:
    """--file's text, read up to MASK_FILE_MOST_BYTES (a device or a huge file is refused, not read whole)."""
    if path.is_dir():
        raise ValueError(f"--file {path}: is a folder; give one text file (or --conversation for a dataset)")
    try:
        with path.open("rb") as handle:
            raw = handle.read(MASK_FILE_MOST_BYTES + 1)
    except OSError as error:
        raise ValueError(f"--file {path}: cannot read it ({error.strerror or error})") from None
    if len(raw) > MASK_FILE_MOST_BYTES:
        raise ValueError(
            f"--file {path}: holds more than {MASK_FILE_MOST_BYTES:,} bytes, and goldfish mask prints the whole "
            f"text; give a part of it (e.g. head -c 100000 {path} > part.txt)"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"--file {path}: byte {error.start} is not UTF-8; give a UTF-8 text file") from None


def _whole_characters(tokenizer: Any, ids: list[int], flags: list[bool]) -> tuple[list[str], list[bool]]:
    """The text of each token, with a character that spans several tokens (a byte-level BPE splits "é" or "水"
    into bytes) shown once, in the piece of its last token, instead of one U+FFFD per token; such a piece is
    marked dropped when any of its tokens is. Returns (pieces, flags) of equal length."""
    pieces: list[str] = []
    merged: list[bool] = []
    pending: list[int] = []
    dropped = False
    for position, (token, flag) in enumerate(zip(ids, flags)):
        pending.append(token)
        dropped = dropped or flag
        text = tokenizer.decode(pending)
        if text.endswith("\ufffd") and position < len(ids) - 1 and len(pending) < 4:  # UTF-8: at most 4 bytes
            continue
        pieces.append(text)
        merged.append(dropped)
        pending, dropped = [], False
    return pieces, merged


def _mask_conversation(args: argparse.Namespace) -> Any:
    """The --record'th conversation (1-based) of --conversation's file or dataset."""
    import data

    documents = data.load_documents(args.conversation)
    if documents[0].messages is None:
        raise ValueError(
            f"--conversation {args.conversation}: its records are texts, not conversations. Fix: give records with "
            "'messages' or 'prompt'/'completion', or use --file for a text"
        )
    if not 1 <= args.record <= len(documents):
        raise ValueError(f"--record {args.record}: the source holds conversations 1 to {len(documents)}")
    return documents[args.record - 1]


def add_mask_parser(sub: Any) -> None:
    mask = sub.add_parser("mask", help="show which tokens of a text a goldfish mask drops")
    mask.add_argument("--text", default=None, help="the text to mask")
    mask.add_argument("--file", default=None, help="a file with the text to mask")
    mask.add_argument(
        "--conversation",
        default=None,
        help="conversations (as --data takes them, e.g. a .jsonl of {'messages': [...]}): show one rendered with the "
        "chat template, the mask on its replies",
    )
    mask.add_argument("--record", type=int, default=1, help="with --conversation: which one, from 1 (default: 1)")
    mask.add_argument(
        "--chat-template",
        default=None,
        help="with --conversation: a Jinja chat template file (default: the tokenizer's, or the tiny BPE's built-in)",
    )
    mask.add_argument("--tokenizer", default=None, help="HF tokenizer (default: a BPE trained on the default corpus)")
    mask.add_argument(
        "--vocab-size",
        type=int,
        default=DataSpec().vocab_size,
        help="vocabulary of the default BPE (default: %(default)s)",
    )
    mask.add_argument("--no-color", action="store_true", help="mark dropped tokens as [[token]] instead of colour")
    opt.MASK.add_to(mask, mask_defaults(MaskSpec()))
    mask.set_defaults(func=cmd_mask)
