"""The background stream of a --background run, tokenized once (rank 0 first under a grid) and built with the
run's targets, mask and rows."""

from __future__ import annotations

from data.background import Background, build_background, load_background, stream_budget
from data.corpus import TokenizedCorpus
from engine import GRID_AXES, Grid, barrier, is_main_process
from goldfish.app.config import TrainSpec, background_train_config
from goldfish.app.data_settings import background_spec, row_mask
from goldfish.app.prepare import Prepared, pad_token_id


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
        barrier(grid.group(*GRID_AXES))  # every rank, every pipeline stage: rank 0 writes the cache first
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
