"""The evaluation of a model: greedy extraction and the chosen instruments on documents (evaluate_model,
evaluate_with_rows), membership inference, and both on a run's train and held-out parts (evaluate_parts)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

import data
from data.atomic import write_jsonl_atomic
from data.chat import reply_units
from engine import Grid, is_main_process
from eval import parallel as parallel_eval
from eval.breakdown import group_means, tag_rows
from eval.divergence import divergence_row, divergence_summary, suffix_dropped_flags
from eval.extraction import ExtractionConfig, write_extraction
from eval.files import MEMBERSHIP_FILE, ROW_FILES
from eval.intervals import DEFAULT_RESAMPLES
from eval.membership import DEFAULT_RECALL_PREFIX_DOCS
from eval.metrics import INTERVAL_METRICS
from eval.replies import reply_statistics
from goldfish.app.config import Instruments, MaskSpec
from goldfish.app.prepare import Prepared, pad_token_id
from goldfish.app.results import ModelResult, PartResult
from goldfish.masks import causal_targets

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
