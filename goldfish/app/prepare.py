"""Data preparation: the documents loaded, a tokenizer (the model's, a given one, or a tiny model's own BPE) and the
training and held-out documents selected with it (Prepared)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import data
from data.background import background_sample
from data.chat import TINY_CHAT_TEMPLATE, check_chat_template
from data.dedup import without_copies
from data.tokenizer import vocabulary_shortfall
from eval.membership import DC_PDD_CAP
from goldfish.app.config import DataSpec
from goldfish.app.data_settings import background_spec
from goldfish.app.models import is_tiny_model
from goldfish.app.pretrained import load_gguf_tokenizer, resolve_gguf


@dataclass
class Prepared:
    """Everything a run needs that comes from the data: tokenizer and the selected documents."""

    tokenizer: Any
    split: data.DocumentSplit
    n_loaded: int
    context: int = 0  # tokens per training row
    texts: Sequence[str] = ()  # every loaded document's text: DC-PDD's reference token frequencies
    source: str = ""

    @property
    def max_positions(self) -> int:
        """Positions a model must hold: a training row, and the longest extraction window."""
        longest = max((len(d.token_ids) for d in self.split.train + self.split.heldout), default=0)
        return max(self.split.seq_len, self.context, longest)

    @property
    def special_token_ids(self) -> list[int]:
        return sorted(set(self.tokenizer.all_special_ids))

    def token_frequencies(self) -> tuple[Any, dict[str, Any]]:
        """DC-PDD's reference: add-one smoothed token frequencies of every loaded document (members and
        non-members alike, so neither side is favoured) tokenized with the run's tokenizer, and a note naming it."""
        from eval.membership import token_frequencies

        ids = self.tokenizer(list(self.texts), add_special_tokens=False)["input_ids"] if self.texts else []
        frequencies = token_frequencies(ids, len(self.tokenizer))
        note = {
            "frequencies": f"token counts of the {len(self.texts)} documents loaded from {self.source!r} "
            f"({sum(map(len, ids))} tokens), add-one smoothed over {len(self.tokenizer)} tokenizer ids",
            "cap": DC_PDD_CAP,
        }
        return frequencies, note


def prepare_data(
    spec: DataSpec, model_name: str, log: Callable[..., None] = print, train_within: int | None = None
) -> Prepared:
    """Load the documents, get a tokenizer and select the training and held-out documents.

    train_within: a loaded tokenizer's selection bound (data.select_documents), from the run record of the run that
    trained it (its `documents.train_within`); a tiny model's own tokenizer finds its bound itself."""
    documents = data.load_documents(spec.source, text_field=spec.text_field, id_field=spec.id_field, split=spec.split)
    data.check_document_count(len(documents), spec.n_train, spec.n_heldout)  # before any tokenizing
    conversations = any(d.messages is not None for d in documents)
    if conversations:
        check_chat_settings(spec)
    least = spec.min_doc_tokens if spec.pack else spec.seq_len
    selection: dict[str, Any] = dict(
        n_train=spec.n_train,
        n_heldout=spec.n_heldout,
        seq_len=least,
        seed=spec.seed,
        dedup=spec.dedup_config(),
        whole_documents=max(spec.extraction_window, least) if spec.pack else None,
        max_len=spec.max_doc_tokens if spec.pack else None,
    )
    if spec.tokenizer is None and is_tiny_model(model_name):
        tokenizer, split = _own_tokenizer(spec, model_name, documents, selection, log)
    else:
        if spec.tokenizer is not None:
            tokenizer = data.load_tokenizer(spec.tokenizer)
        elif resolve_gguf(model_name) is not None:  # smollm2-135m or a .gguf file: the tokenizer inside the file
            tokenizer = load_gguf_tokenizer(resolve_gguf(model_name))
        else:
            tokenizer = data.load_tokenizer(model_name)
        if conversations:
            use_chat_template(tokenizer, spec, model_name)
        split = data.select_documents(documents, tokenizer, **selection, train_within=train_within)
    shape = f"whole documents (rows of {spec.seq_len} tokens)" if spec.pack else f"{spec.seq_len} tokens"
    if conversations:
        shape = f"conversations of at most {spec.seq_len} tokens ({_count_replies(split)} assistant replies)"
    longest = spec.seq_len if conversations else spec.max_doc_tokens
    log(
        f"data: {len(documents)} {'conversations' if conversations else 'documents'} from {spec.source!r}; "
        f"{len(split.train)} train, {len(split.heldout)} "
        f"held-out of {shape}; "
        + (
            f"{len(split.too_long)} skipped as longer than {longest} tokens"
            if conversations
            else f"{len(split.too_short)} skipped as shorter than {least} tokens"
            + (f", {len(split.too_long)} as longer than {longest}" if split.too_long else "")
        )
        + (
            f"; {len(split.cut)} cut to their first {spec.seq_len} tokens ({split.tokens_cut} tokens dropped)"
            if split.cut
            else ""
        )
        + _dedup_note(split)
        + _tokenizer_note(split)
    )
    return Prepared(
        tokenizer=tokenizer,
        split=split,
        n_loaded=len(documents),
        context=spec.seq_len,
        texts=[d.text for d in documents],
        source=str(spec.source),
    )


def _own_tokenizer(
    spec: DataSpec,
    model_name: str,
    documents: Sequence[data.Document],
    selection: dict[str, Any],
    log: Callable[..., None],
) -> tuple[Any, data.DocumentSplit]:
    """A tiny model's BPE and the split selected with it: trained on the training documents' part of the seeded
    order (data.select_fitting_tokenizer) and, with a background, its first documents less those that copy a --data
    document, so no held-out target reaches its training text. Says so when the BPE holds fewer tokens than asked."""
    sample, left_out = [], 0
    if spec.background is not None:  # the tokenizer then also fits the text most of training is on
        sample, left_out = without_copies(background_sample(background_spec(spec)), [d.text for d in documents])
    conversations = any(d.messages is not None for d in documents)

    def fit(texts: list[str]) -> Any:
        tokenizer = data.train_bpe_tokenizer(texts + sample, vocab_size=spec.vocab_size)
        if conversations:
            use_chat_template(tokenizer, spec, model_name)
        return tokenizer

    tokenizer, split = data.select_fitting_tokenizer(documents, fit, **selection)
    shortfall = vocabulary_shortfall(tokenizer, spec.vocab_size)
    if shortfall is not None:
        log(f"warning: {shortfall}", file=sys.stderr)
    split.tokenizer_fit = (split.tokenizer_fit or {}) | {
        "vocab_size": len(tokenizer),
        "vocab_size_asked": spec.vocab_size,
        "background_documents": len(sample),
        "background_copies_left_out": left_out,
        "warning": shortfall,
    }
    return tokenizer, split


def check_chat_settings(spec: DataSpec) -> None:
    """Refuse (ValueError) data settings that do not apply to conversations: they are trained one per row, whole."""
    if spec.background is not None or spec.pack:
        raise ValueError(
            "conversations are trained one per row, whole (loss on the assistant's replies): --pack and "
            "--background are for plain texts. Fix: leave them out, or give text documents"
        )


def use_chat_template(tokenizer: Any, spec: DataSpec, model_name: str) -> None:
    """Give the tokenizer the run's chat template: --chat-template's file, or the tiny models' built-in one when the
    trained BPE has none; refuse a tokenizer with none (data.chat.check_chat_template)."""
    if spec.chat_template is not None:
        tokenizer.chat_template = Path(spec.chat_template).read_text(encoding="utf-8")
    elif is_tiny_model(model_name) and spec.tokenizer is None:
        tokenizer.chat_template = TINY_CHAT_TEMPLATE
    check_chat_template(tokenizer)


def _count_replies(split: data.DocumentSplit) -> int:
    return sum(len(d.replies or ()) for d in split.train + split.heldout)


def _dedup_note(split: data.DocumentSplit) -> str:
    if split.dedup.mode == "off":
        return "; no deduplication (--dedup off)"
    dropped = sum(r["action"] == "dropped" for r in split.removed)
    kinds = sorted({r["kind"] for r in split.removed})
    note = f"; dedup {split.dedup.mode}: {dropped} duplicate(s) removed" + (f" ({', '.join(kinds)})" if kinds else "")
    if split.repeats:
        note += f", {len(split.repeats)} kept in training as counted repeats"
    return note


def _tokenizer_note(split: data.DocumentSplit) -> str:
    fit = split.tokenizer_fit
    if fit is None:
        return ""
    background = f" and {fit['background_documents']} background documents" if fit.get("background_documents") else ""
    return (
        f"; its {fit['vocab_size']}-token BPE trained on the first {fit['documents']} documents of the order"
        f"{background}, no held-out one"
    )


def pad_token_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
