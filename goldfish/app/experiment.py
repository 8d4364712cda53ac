"""The runs behind `goldfish train` and `goldfish eval`: documents -> masked examples -> training -> extraction.

The application layer: it wires data, the goldfish mask and loss, the engine and eval together (compare builds on
it in goldfish.app.compare).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

import data
import engine
import engine.training.train as engine_train
from data.atomic import write_json_atomic, write_jsonl_atomic
from data.background import Background, background_sample, build_background, load_background, stream_budget
from data.chat import TINY_CHAT_TEMPLATE, assistant_flags, check_chat_template, reply_units
from data.corpus import TokenizedCorpus
from data.dedup import without_copies
from data.rows import piece_ids
from data.tokenizer import vocabulary_shortfall
from engine.core import comm
from engine.core.grid import AXES, GRID_AXES, Grid, is_main_process
from eval import parallel as parallel_eval
from eval.breakdown import group_means, tag_rows
from eval.divergence import divergence_row, divergence_summary, suffix_dropped_flags
from eval.extraction import ExtractionConfig, write_extraction
from eval.files import MEMBERSHIP_FILE, ROW_FILES
from eval.intervals import DEFAULT_RESAMPLES
from eval.membership import DC_PDD_CAP, DEFAULT_RECALL_PREFIX_DOCS
from eval.metrics import INTERVAL_METRICS
from eval.replies import reply_statistics
from goldfish.app.config import (
    RUN_FILE,
    DataSpec,
    Instruments,
    MaskSpec,
    TrainSpec,
    background_train_config,
    parse_grid,
)
from goldfish.app.data_settings import background_spec, row_mask
from goldfish.app.models import build_tiny_model, is_tiny_model
from goldfish.app.pretrained import (
    DEFAULT_MODEL_CACHE,
    load_gguf_tokenizer,
    load_pretrained,
    load_pretrained_model,
    resolve_gguf,
)
from goldfish.app.results import ModelResult, PartResult
from goldfish.loss import goldfish_loss_from_token_losses
from goldfish.masks import IGNORE_INDEX, causal_targets, drop_mask


def start_grid(text: str | None) -> Grid | None:
    """The engine grid of a parallel run (under torchrun), or None for a single process.

    With no --grid under torchrun, every rank is a data-parallel replica (data = world size).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if text is None and world == 1:
        return None
    sizes = parse_grid(text) if text else {"data": world}
    return engine.init(**sizes)


def grid_sizes(grid: Grid) -> dict[str, int]:
    """{axis: size} of an engine grid, as recorded in run records and summaries (pipe only when it is > 1)."""
    sizes = {axis: getattr(grid.shape, axis) for axis in AXES}
    return {**sizes, "pipe": grid.shape.pipe} if grid.shape.pipe > 1 else sizes


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


def initial_model(model_name: str, prepared: Prepared, seed: int) -> nn.Module:
    """The starting weights: a named tiny model at random init (seeded) or a pretrained HF model."""
    tokenizer = prepared.tokenizer
    if is_tiny_model(model_name):
        return build_tiny_model(
            model_name,
            vocab_size=len(tokenizer),
            max_positions=max(prepared.max_positions, 64),
            seed=seed,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    if resolve_gguf(model_name) is not None:
        # Exported once to an ordinary HF folder in the user cache: later runs load in about a second.
        model, _ = load_pretrained(model_name, cache_dir=DEFAULT_MODEL_CACHE)
    else:
        model = load_pretrained_model(model_name)
    check_vocabulary(model, prepared, model_name)
    return model


def check_vocabulary(model: nn.Module, prepared: Prepared, model_name: str) -> None:
    """Refuse a tokenizer with more tokens than the model embeds."""
    vocab = model.get_input_embeddings().num_embeddings
    if vocab < len(prepared.tokenizer):
        raise ValueError(
            f"tokenizer has {len(prepared.tokenizer)} tokens but model {model_name!r} embeds only "
            f"{vocab}: use the model's own tokenizer"
        )


def make_examples(
    documents: Sequence[data.TokenizedDocument],
    mask: MaskSpec,
    special_token_ids: Sequence[int],
    repeats: dict[str, int] | None = None,
    chat_row: ChatRow | None = None,
) -> list[dict[str, torch.Tensor]]:
    """Training examples: input ids, next-token targets and the goldfish drop mask, all (T,); one per document, or
    `repeats[id]` copies of it. A conversation's row has targets on its replies only (conversation_row), padded to
    `chat_row`'s length when given. Hashed and static masks are functions of the tokens, so every copy drops the same
    positions (the point of the hashed mask).

    For the `random` strategy the stored mask is only the first epoch's draw (for counting); the loss redraws it
    every step and for every copy, since a per-occurrence Bernoulli mask must differ each time a sequence is seen.
    """
    if chat_row is None and any(d.replies is not None for d in documents):
        raise ValueError("conversations have different lengths: pass chat_row (e.g. chat_row_of(prepared)) to pad them")
    examples = []
    for document in documents:
        input_ids = torch.tensor(document.token_ids, dtype=torch.long)
        targets = causal_targets(input_ids.unsqueeze(0))
        trained = None if document.replies is None else reply_targets(document)  # (1, T) bool
        copies = 1 if repeats is None else repeats[str(document.id)]
        for _ in range(copies):
            index = len(examples)
            dropped = (
                mask.dropped(targets, special_token_ids)
                if mask.strategy != "random"
                else _random_draw(mask, targets, special_token_ids, step=0, example_index=index)
            )
            if trained is None:
                examples.append({"input_ids": input_ids, "targets": targets[0], "dropped": dropped[0]})
            else:
                examples.append(conversation_row(input_ids, targets[0], dropped[0], trained[0], chat_row))
    return examples


def chat_row_of(prepared: Prepared) -> ChatRow:
    """The row conversations are padded to for training: the selection's longest conversation (--seq-len), padded
    with the tokenizer's pad id (its EOS when it has none)."""
    return ChatRow(prepared.split.seq_len, pad_token_id(prepared.tokenizer))


def reply_targets(document: data.TokenizedDocument) -> torch.Tensor:
    """(1, T) bool: the targets of a conversation's positions that are reply tokens (position j predicts token j+1),
    what the loss covers."""
    flags = torch.tensor(assistant_flags(len(document.token_ids), document.replies or ()), dtype=torch.bool)
    trained = torch.zeros(1, len(flags), dtype=torch.bool)
    trained[0, :-1] = flags[1:]
    return trained


def conversation_row(
    input_ids: torch.Tensor, targets: torch.Tensor, dropped: torch.Tensor, trained: torch.Tensor, row: ChatRow | None
) -> dict[str, torch.Tensor]:
    """One conversation's training row, (T,) each: the loss on the replies only (other targets IGNORE_INDEX), the
    goldfish mask as drawn over the whole conversation's true targets (its hash reads the prompt too) kept on the
    replies only, right-padded to `row.length` (padding attends only to earlier tokens in a causal model, and the
    real tokens never attend to it)."""
    targets = torch.where(trained, targets, torch.full_like(targets, IGNORE_INDEX))
    dropped = dropped & trained
    if row is None or row.length == len(input_ids):
        return {"input_ids": input_ids, "targets": targets, "dropped": dropped}
    extra = row.length - len(input_ids)
    return {
        "input_ids": torch.nn.functional.pad(input_ids, (0, extra), value=row.pad_id),
        "targets": torch.nn.functional.pad(targets, (0, extra), value=IGNORE_INDEX),
        "dropped": torch.nn.functional.pad(dropped, (0, extra), value=False),
    }


@dataclass(frozen=True)
class ChatRow:
    """The fixed length conversations are padded to for training (a batch stacks rows) and the id they pad with."""

    length: int
    pad_id: int


def _random_draw(
    mask: MaskSpec, targets: torch.Tensor, special_token_ids: Sequence[int], *, step: int, example_index: int
) -> torch.Tensor:
    """A fresh Bernoulli(1/k) mask for one (1, T) row, seeded by (mask seed, step, example): reproducible on resume,
    different on every occurrence of the sequence, and independent of which rank holds the row."""
    seed = (mask.seed * 1_000_003 + step) * 1_000_003 + example_index
    return drop_mask(targets, "random", mask.k, mask.h, special_token_ids=special_token_ids, seed=seed)


def make_step_loss(mask: MaskSpec, special_token_ids: Sequence[int]) -> engine_train.TokenLossFn:
    """The engine's loss hook: goldfish loss on kept targets, plus all-token and dropped-token losses for logging.
    A TokenLossFn: the mask is drawn from the batch's own ids on whichever rank computes the loss (a pipeline's last
    stage included), so the dropped positions equal one process's."""

    def dropped_of(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if mask.strategy != "random":
            return batch["dropped"]
        step = int(batch["step"])
        return torch.cat(
            [
                _random_draw(
                    mask,
                    batch["targets"][row : row + 1].cpu(),
                    special_token_ids,
                    step=step,
                    example_index=int(index),
                )
                for row, index in enumerate(batch["example_index"])
            ]
        ).to(batch["dropped"].device)

    def reduce(token_ce: torch.Tensor, batch: dict[str, torch.Tensor]) -> engine_train.StepLoss:
        # token_ce: per-token losses (B, T) float32 from the hidden states; full-vocabulary logits are never built
        # (vocabulary-parallel over the tensor-parallel ranks when the lm_head is split)
        result = goldfish_loss_from_token_losses(token_ce, batch["targets"], dropped_of(batch))
        extras = {
            "all_loss": (float(result.all_loss) * result.n_all, result.n_all),
            "dropped_loss": (
                float(result.dropped_loss) * result.n_dropped if result.n_dropped else 0.0,
                result.n_dropped,
            ),
        }
        return engine_train.StepLoss(loss_sum=result.loss_sum, n_tokens=result.n_kept, extras=extras)

    return engine_train.TokenLossFn(targets=lambda batch: batch["targets"], reduce=reduce)


def validation_loss_fn(prepared: Prepared) -> engine_train.LossFn:
    """The validation loss: the standard next-token loss over every target (no goldfish mask), for every model."""
    return make_step_loss(MaskSpec(strategy=None), prepared.special_token_ids)


def save_hf_model(model: nn.Module, tokenizer: Any, run_record: dict[str, Any], directory: Path) -> None:
    """An ordinary HF checkpoint: weights (safetensors), config, tokenizer, and the run that produced it."""
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    write_json_atomic(directory / RUN_FILE, run_record)


def save_parallel_hf_model(
    model: nn.Module, grid: Grid, tokenizer: Any, run_record: dict[str, Any], directory: Path
) -> None:
    """Consolidate a parallel model into an ordinary HF checkpoint. Called on every rank (the gather is collective);
    rank 0 writes the files."""
    from transformers import AutoModelForCausalLM

    state = engine.full_state_dict(model, grid, rank0_only=True)
    if grid.rank != 0:
        return
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(model.config)
    plain.load_state_dict(state, assign=True)
    plain.tie_weights()
    save_hf_model(plain, tokenizer, run_record, directory)


def load_model_weights(model: nn.Module, directory: Path) -> None:
    """Load a checkpoint folder's weights into an already built model (for resume)."""
    loaded = load_pretrained_model(directory)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise ValueError(f"checkpoint {directory} does not match the model: missing {missing}, unexpected {unexpected}")


def run_record(spec: TrainSpec, prepared: Prepared) -> dict[str, Any]:
    record = {
        "model": spec.model,
        "init_seed": spec.init_seed,
        "data": asdict(spec.data),
        "mask": asdict(spec.mask) | {"label": spec.mask.label},
        "train": asdict(spec.train),
        "lora": asdict(spec.lora) if spec.lora.enabled else None,
        "documents": prepared.split.manifest(),
        "repeats": spec.data.repeats_by_id(prepared.split.train),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }
    return record


@dataclass(frozen=True)
class TrainedCopies:
    """Where each copy of a training document lies in a run's rows, to count the copies a checkpoint has trained.

    Copy i is of training document documents[i] (a kept duplicate counts for its twin: the same text) and its
    tokens fill rows first[i]..last[i]; it counts as trained once per epoch in which every one of those rows was read.
    """

    documents: tuple[str, ...]
    first: torch.Tensor  # (C,) int64
    last: torch.Tensor  # (C,) int64
    ids: tuple[str, ...]  # every training document, copies trained or not

    def counts(self, n_rows: int, config: engine_train.TrainConfig, steps: int) -> dict[str, int]:
        """{training document id: copies trained by the first `steps` optimizer steps}, counted from the rows those
        steps read (engine.training.train.rows_consumed, the rows the training loop reads)."""
        counts = dict.fromkeys(self.ids, 0)
        consumed = engine_train.rows_consumed(n_rows, config, steps)
        read = torch.zeros(n_rows + 1, dtype=torch.long)
        read[consumed.partial + 1] = 1
        read = read.cumsum(0)  # read[r]: rows below r read in the begun epoch
        whole = (read[self.last + 1] - read[self.first]) == (self.last - self.first + 1)
        for document, trained in zip(self.documents, whole.tolist()):
            counts[document] += consumed.whole_epochs + trained  # a whole epoch reads every row of every copy
        return counts


def trained_copies(
    prepared: Prepared,
    examples: Any,
    repeats: dict[str, int],
    *,
    pack_order: Sequence[int] | None = None,
    background: Background | None = None,
) -> TrainedCopies:
    """The TrainedCopies of a run's training rows: one example per copy (make_examples), whole documents packed in
    `pack_order` (pack_documents), or targets inside a background stream."""
    split = prepared.split
    twin = {str(d.id): str(d.repeat_of) for d in split.repeats}
    documents = split.training_documents
    if background is not None:
        codes = torch.as_tensor(background.rows.codes)
        pieces = torch.nonzero(codes < 0).flatten().tolist()
        names = [str(split.train[-int(codes[p]) - 1].id) for p in pieces]
        spans = [background.rows.layout.rows_of(p) for p in pieces]
    elif pack_order is not None:
        names = [str(documents[d].id) for d in pack_order]
        spans = [examples.layout.rows_of(p) for p in range(len(pack_order))]
    else:
        names = [str(d.id) for d in documents for _ in range(repeats[str(d.id)])]
        spans = [(i, i) for i in range(len(names))]
    first, last = (torch.tensor([span[j] for span in spans], dtype=torch.long) for j in (0, 1))
    return TrainedCopies(
        tuple(twin.get(name, name) for name in names), first, last, tuple(str(d.id) for d in split.train)
    )


def checkpoint_record(
    record: dict[str, Any], copies: TrainedCopies, n_rows: int, train: engine_train.TrainConfig, step: int
) -> dict[str, Any]:
    """The run record of the checkpoint written after `step` optimizer steps: the run's record plus its step and
    the copies of each training document trained so far ("exposures"; a background run's "repeats" and per-target
    "trained" too, which goldfish eval reads), not the whole run's plan."""
    exposures = copies.counts(n_rows, train, step)
    out = dict(record, step=step, exposures=exposures)
    if record.get("corpus"):
        out["repeats"] = exposures
        out["corpus"] = dict(
            record["corpus"],
            targets=[dict(t, trained=exposures[t["id"]]) for t in record["corpus"]["targets"]],
            rows_trained=min(step * train.batch_size, n_rows * train.epochs),
        )
    return out


def check_mask_drops(mask: MaskSpec, n_dropped: int, spec: DataSpec) -> None:
    """Refuse (ValueError) a goldfish run whose mask drops no target of its training documents: it would train as
    the standard loss while labelled goldfish. The random strategy is drawn per step, so it is not checked here."""
    if mask.strategy is None or mask.strategy == "random" or n_dropped:
        return
    window = f" --h {mask.h}" if mask.strategy.startswith("hashed") else ""
    raise ValueError(
        f"the {mask.label} mask drops no target of the training documents (--k {mask.k}{window}, --seq-len "
        f"{spec.seq_len}): the run would train as the standard loss. Fix: a smaller --k or --h, longer documents, "
        "or --strategy standard for an unmasked run"
    )


def _target_drops(mask: MaskSpec, prepared: Prepared) -> int:
    """Targets the mask drops in the training documents as a background run trains them (whole, with EOS)."""
    eos = prepared.tokenizer.eos_token_id
    return sum(
        int(row_mask(mask, prepared.special_token_ids).dropped(piece, 0, len(piece)).sum())
        for piece in (piece_ids(d.full_ids, eos) for d in prepared.split.train)
    )


def prepare_background(
    spec: TrainSpec, prepared: Prepared, grid: Grid | None = None, log=print, corpus: TokenizedCorpus | None = None
) -> Background:
    """The background stream of a --background run (data.background). Under a grid, rank 0 tokenizes the
    corpus into the cache first and the other ranks then read that cache. A `corpus` already loaded (e.g. by
    goldfish compare for its first model) is used as it is."""
    main = is_main_process(grid)
    if corpus is not None:
        return _build_background(spec, prepared, corpus)
    budget = stream_budget(background_spec(spec.data), spec.train) if spec.data.background_streaming else None
    if main:
        corpus = load_background(
            background_spec(spec.data), prepared.tokenizer, token_budget=budget, progress=spec.train.progress, log=log
        )
    if grid is not None:
        comm.barrier(grid.group(*GRID_AXES))  # every rank, every pipeline stage: rank 0 writes the cache first
    if corpus is None:
        corpus = load_background(
            background_spec(spec.data), prepared.tokenizer, token_budget=budget, progress=False, log=lambda *a: None
        )
    return _build_background(spec, prepared, corpus)


def _build_background(spec: TrainSpec, prepared: Prepared, corpus: TokenizedCorpus) -> Background:
    return build_background(
        background_spec(spec.data),
        corpus,
        prepared.split.train,
        prepared.split.heldout,
        prepared.tokenizer,
        row_mask(spec.mask, prepared.special_token_ids),
        background_train_config(spec.train),
        pad_token_id(prepared.tokenizer),
    )


def _verification_logger(log: Callable[[str], None]) -> Callable[[Any], None]:
    """A report callback for engine.parallelize(verify=True): one line with what the check ran and cost."""

    def report(result: Any) -> None:
        log(
            f"sharding of {result.family} verified against one process on a miniature ({result.parameters / 1e6:.2f}M "
            f"parameters, 2 layers) in {result.seconds:.1f} s"
        )

    return report


REPEAT_METRICS = INTERVAL_METRICS  # the breakdowns by repeats and prefix length: the metrics with intervals


def evaluate_model(
    model: nn.Module,
    prepared: Prepared,
    documents: Sequence[data.TokenizedDocument],
    extraction: ExtractionConfig,
    out_dir: Path | None,
    mask: MaskSpec | None = None,
    progress: bool = True,
    *,
    instruments: Instruments | None = None,
    repeats: dict[str, int] | None = None,
    grid: Grid | None = None,
) -> dict[str, Any] | None:
    """Greedy extraction on `documents` plus the chosen `instruments`; returns the summary.

    Writes OUT/extraction.jsonl, OUT/summary.json and one JSON-lines file of per-document rows per instrument
    (eval.files.ROW_FILES) when out_dir is given. Instrument summaries go under "divergence", "probabilistic", "beam",
    "sampling" and "breakdowns" ({"prefix_length": [...], "repeats": [...]}).
    repeats: {document id: times it was trained on per epoch}; documents not in it count as 0 (never trained on).
        Each extraction row gets a "repeats" field and the summary a breakdown by it.
    grid: under torchrun, every rank calls this with the same arguments and a model parallelized on the grid
        (eval.parallel.load_parallel_model); documents are sharded over the data axis and rank 0 gets the
        summary and writes the files (other ranks get None). The rows equal a single process's.
    """
    summary, _ = evaluate_with_rows(
        model, prepared, documents, extraction, out_dir, mask, progress, instruments, repeats, grid
    )
    return summary


def evaluate_with_rows(
    model: nn.Module,
    prepared: Prepared,
    documents: Sequence[data.TokenizedDocument],
    extraction: ExtractionConfig,
    out_dir: Path | None,
    mask: MaskSpec | None,
    progress: bool,
    instruments: Instruments | None,
    repeats: dict[str, int] | None,
    grid: Grid | None = None,
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]] | tuple[None, None]:
    """evaluate_model, also returning the per-document rows: {"extraction": rows, instrument: rows, ...}.

    Every instrument runs through eval.parallel, which is the plain single-process function for grid None
    and the sharded one under a grid; only rank 0 gets rows back.
    """
    tokenizer = prepared.tokenizer
    special = prepared.special_token_ids
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    mask_fn = None
    if mask is not None and mask.strategy is not None:
        mask_fn = lambda targets: mask.dropped(targets, special)  # noqa: E731
    pad_id = pad_token_id(tokenizer)
    main = is_main_process(grid)
    clock = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = round(now - clock, 3)
        clock = now

    rows, summary = parallel_eval.evaluate_parallel(
        model,
        documents,
        extraction,
        grid,
        decode=decode,
        pad_token_id=pad_id,
        drop_mask_fn=mask_fn,
        progress=progress and main,
    )
    lap("greedy")
    results: dict[str, Any] = {}  # instrument -> (rows, summary); None on ranks other than 0
    if instruments is not None:
        if instruments.probabilistic:
            results["probabilistic"] = parallel_eval.probabilistic_parallel(
                model, documents, extraction, grid, pad_token_id=pad_id
            )
            lap("probabilistic")
        if instruments.beams:
            results["beam"] = parallel_eval.beam_parallel(
                model, documents, extraction, grid, num_beams=instruments.beams, pad_token_id=pad_id, decode=decode
            )
            lap("beam")
        if instruments.samples:
            results["sampling"] = parallel_eval.sampling_parallel(
                model, documents, extraction, instruments.sampling(), grid, pad_token_id=pad_id
            )
            lap("sampling")
        if instruments.prefix_lengths:
            prefix_rows = parallel_eval.prefix_length_parallel(
                model,
                documents,
                instruments.prefix_lengths,
                grid,
                suffix_len=extraction.suffix_len,
                batch_size=extraction.batch_size,
                decode=decode,
                pad_token_id=pad_id,
            )
            results["prefix_length"] = (prefix_rows, None)
            lap("prefix_length")
    if not main:
        return None, None

    breakdowns: dict[str, Any] = {}
    if repeats is not None:
        rows = tag_rows(rows, "repeats", repeats, default=0)
        breakdowns["repeats"] = group_means(rows, "repeats", REPEAT_METRICS)
    per_document: dict[str, list[dict[str, Any]]] = {"extraction": rows}
    if instruments is not None and instruments.divergence:
        per_document["divergence"] = _divergence_rows(rows, documents, extraction, mask_fn)
        summary["divergence"] = divergence_summary(per_document["divergence"])
    for name, (instrument_rows, instrument_summary) in results.items():
        per_document[name] = instrument_rows
        if instrument_summary is not None:
            summary[name] = instrument_summary
    if "prefix_length" in per_document:
        breakdowns["prefix_length"] = group_means(per_document["prefix_length"], "prefix_len", REPEAT_METRICS)
    if breakdowns:
        summary["breakdowns"] = breakdowns
    summary["timings_s"] = timings
    if out_dir is not None:
        write_extraction(rows, summary, out_dir)
        for name, instrument_rows in per_document.items():
            if name != "extraction":
                write_jsonl_atomic(out_dir / ROW_FILES[name], instrument_rows)
    return summary, per_document


def pad_token_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def _divergence_rows(
    rows: list[dict[str, Any]], documents: Sequence[data.TokenizedDocument], extraction: ExtractionConfig, mask_fn: Any
) -> list[dict[str, Any]]:
    """Per-document divergence rows (id, n_prefix_tokens, first_divergence, and the mask's flags when given)."""
    by_id = {d.id: d for d in documents}
    divergence_rows = []
    for row in rows:
        ids = by_id[row["id"]].token_ids
        prefix_len, suffix_len = row["n_prefix_tokens"], extraction.suffix_len
        flags = None
        if mask_fn is not None:
            dropped = mask_fn(causal_targets(torch.tensor([ids])))[0]
            flags = suffix_dropped_flags(dropped, prefix_len, suffix_len)
        divergence_rows.append(
            {
                "id": row["id"],
                "n_prefix_tokens": prefix_len,
                **divergence_row(row["generated_ids"], ids[prefix_len : prefix_len + suffix_len], flags),
            }
        )
    return divergence_rows


def membership(
    model: nn.Module,
    prepared: Prepared,
    reference: nn.Module | None,
    out_file: Path | None = None,
    grid: Grid | None = None,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    with_rows: bool = False,
) -> dict[str, Any] | None:
    """Membership inference (loss, zlib, Min-K%, Min-K%++, gradient norm, ReCaLL, DC-PDD, and the reference-model
    ratio when `reference` is given): members are the training documents, non-members the held-out ones; AUC with its
    bootstrap interval (`n_resamples`, 0: none) and TPR at 1% and 0.1% FPR. ReCaLL's prefix is the first held-out
    document (left out of its scores); DC-PDD's frequencies come from every loaded document
    (`Prepared.token_frequencies`). The per-document scores go to `out_file` (JSON lines) when given. Under a grid,
    documents are sharded over the data axis and rank 0 gets the result (other ranks None). `with_rows`: the
    per-document rows also come back, under "rows" (for per-bucket attacks)."""
    tokenizer = prepared.tokenizer
    if not prepared.split.train or not prepared.split.heldout:
        raise ValueError("membership inference needs both training (members) and held-out (non-member) documents")
    frequencies, note = prepared.token_frequencies()
    rows, summary = parallel_eval.membership_parallel(
        model,
        prepared.split.train,
        prepared.split.heldout,
        grid,
        decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        pad_token_id=pad_token_id(tokenizer),
        reference_model=reference,
        frequencies=frequencies,
        n_resamples=n_resamples,
        recall_prefix_docs=DEFAULT_RECALL_PREFIX_DOCS if len(prepared.split.heldout) > 1 else 0,
        notes={"dc_pdd": note},
    )
    if rows is None:
        return None
    if out_file is not None:
        write_jsonl_atomic(out_file, rows)
    return summary | {"rows": rows} if with_rows else summary


def evaluate_parts(
    model: nn.Module,
    prepared: Prepared,
    parts: Sequence[str],
    extraction: ExtractionConfig,
    out_dir: Path,
    mask: MaskSpec | None,
    progress: bool,
    instruments: Instruments | None,
    repeats: dict[str, int] | None,
    *,
    reference: Callable[[], nn.Module | None] | None,
    grid: Grid | None = None,
) -> ModelResult | None:
    """The evaluation of one model, as `goldfish eval` and `goldfish compare` run it: greedy extraction and every
    chosen instrument on each of `parts` ("train", "heldout"), written under OUT/<part>/ (evaluate_with_rows), then
    membership inference on the training (members) and held-out (non-members) documents, written to
    OUT/membership.jsonl (eval.files.MEMBERSHIP_FILE).

    repeats: {training document id: times trained on}; held-out documents count as trained on 0 times.
    reference: None skips membership inference; else it gives the reference model of the reference-ratio attack
        (None: no such attack), called only when membership runs (both parts of the split have documents).
    Under a grid every rank calls this alike; rank 0 gets the result, the others None.
    """
    documents = {"train": prepared.split.train, "heldout": prepared.split.heldout}
    if extraction.prefix_len is not None and any(d.replies is not None for d in prepared.split.train):
        raise ValueError(
            "conversations are prompted with everything before each reply: --prefix-len does not apply. Fix: leave "
            "it out (--suffix-len sets how much of each reply is compared)"
        )
    result = ModelResult(parts={})
    for part in parts:
        part_repeats = None if repeats is None else repeats if part == "train" else {}
        # conversations are extracted reply by reply (data.chat.reply_units); plain documents pass unchanged
        docs, short_replies = reply_units(documents[part], extraction.suffix_len)
        if part_repeats:
            part_repeats = part_repeats | {
                str(d.id): part_repeats[d.conversation_id] for d in docs if d.conversation_id is not None
            }
        summary, rows = evaluate_with_rows(
            model, prepared, docs, extraction, out_dir / part, mask, progress, instruments, part_repeats, grid
        )
        if summary is not None:
            if any(d.replies is not None for d in documents[part]):
                conversation_of = {str(d.id): str(d.conversation_id) for d in docs}
                summary["replies"] = {
                    "statistics": reply_statistics(
                        rows["extraction"], conversation_of, n_resamples=extraction.bootstrap
                    ),
                    "n_extracted": len(docs),
                    "n_skipped_shorter_than_suffix": len(short_replies),
                    "skipped_ids": short_replies,
                    "what": f"one extraction per assistant reply: the conversation up to the reply's header as the "
                    f"prompt, the reply's first {extraction.suffix_len} tokens as the suffix",
                }
            result.parts[part] = PartResult.from_summary(summary, rows)
    if reference is not None and prepared.split.train and prepared.split.heldout:
        scored = membership(
            model,
            prepared,
            reference(),
            out_dir / MEMBERSHIP_FILE,
            grid,
            n_resamples=extraction.bootstrap,
            with_rows=True,
        )
        if scored is not None:
            result.membership_rows = scored.pop("rows")
            result.membership = scored
    return result if is_main_process(grid) else None
