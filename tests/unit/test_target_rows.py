"""Per-target rows (goldfish.app.targets): the step of each target's last trained copy, by hand and against the
rows the training loop reads step by step (engine.training.train.step_rows)."""

from __future__ import annotations

import pytest
import torch

import engine.training.train as engine_train
from engine.training.config import TrainConfig
from goldfish.app.records import TrainedCopies
from goldfish.app.targets import last_insertion_steps, target_rows


def copies(spans: list[tuple[str, int, int]], ids: tuple[str, ...] = ("x", "y", "z")) -> TrainedCopies:
    return TrainedCopies(
        tuple(d for d, _, _ in spans),
        torch.tensor([f for _, f, _ in spans]),
        torch.tensor([last for _, _, last in spans]),
        ids,
    )


# 10 rows read 4 at a step: step 1 reads rows 0-3, step 2 rows 4-7, step 3 rows 8-9 (steps counted from 1).
SPANS = [("x", 1, 1), ("x", 5, 6), ("y", 7, 8)]


def test_last_insertion_step_by_hand():
    config = TrainConfig(batch_size=4, shuffle=False, progress=False)
    assert last_insertion_steps(copies(SPANS), 10, config) == {"x": 2, "y": 3, "z": None}
    # gradient accumulation splits a step's rows; it does not change which rows a step reads
    accumulated = TrainConfig(batch_size=4, grad_accum=2, shuffle=False, progress=False)
    assert last_insertion_steps(copies(SPANS), 10, accumulated) == {"x": 2, "y": 3, "z": None}
    # stopped after 2 steps: y's copy ends in row 8, never read
    stopped = TrainConfig(batch_size=4, shuffle=False, max_steps=2, progress=False)
    assert last_insertion_steps(copies(SPANS), 10, stopped) == {"x": 2, "y": None, "z": None}
    # a second epoch stopped after its first step (step 4 reads rows 0-3 again): x's copy in row 1 is its last
    two = TrainConfig(batch_size=4, shuffle=False, epochs=2, max_steps=4, progress=False)
    assert last_insertion_steps(copies(SPANS), 10, two) == {"x": 4, "y": 3, "z": None}


def _by_reading(spans: list[tuple[str, int, int]], n_rows: int, config: TrainConfig) -> dict[str, int | None]:
    """The same, by running through the steps: a copy is trained at the step that completes the reading of all its
    rows within one epoch."""
    last: dict[str, int | None] = {"x": None, "y": None, "z": None}
    per_epoch = engine_train.steps_per_epoch(n_rows, config.batch_size)
    read: set[int] = set()
    for step in range(engine_train.total_steps_of(n_rows, config)):
        if step % per_epoch == 0:
            read = set()
        before = set(read)
        read |= set(engine_train.step_rows(n_rows, config, step).tolist())
        for document, first, end in spans:
            rows = set(range(first, end + 1))
            if rows <= read and not rows <= before:
                last[document] = step + 1
    return last


@pytest.mark.parametrize("epochs,max_steps,seed", [(1, 0, 0), (3, 0, 1), (3, 7, 2), (2, 5, 3)])
def test_last_insertion_step_matches_the_rows_read(epochs: int, max_steps: int, seed: int):
    spans = [("x", 0, 0), ("x", 3, 4), ("y", 9, 10), ("y", 6, 6), ("z", 11, 12)]
    for shuffle in (False, True):
        config = TrainConfig(
            batch_size=3, epochs=epochs, max_steps=max_steps, seed=seed, shuffle=shuffle, progress=False
        )
        assert last_insertion_steps(copies(spans), 13, config) == _by_reading(spans, 13, config)


def test_target_rows_carry_every_model_and_measure():
    rows = target_rows(
        {
            "standard": [{"id": "x", "exact_match": 1, "rouge_l": 1.0, "suffix_logprob_mean": -0.1}],
            "goldfish": [{"id": "x", "exact_match": False, "rouge_l": 0.4, "match_fraction": 0.5}],
        },
        bucket={"x": 4},
        copies={"x": 3},
        last_step={"x": 17},
        seed=5,
    )
    assert rows[0] == {
        "id": "x",
        "bucket": 4,
        "copies": 3,
        "last_insertion_step": 17,
        "seed": 5,
        "model": "standard",
        "exact_match": True,
        "rouge_l": 1.0,
        "match_fraction": None,
        "suffix_logprob_mean": -0.1,
    }
    assert rows[1]["model"] == "goldfish" and rows[1]["exact_match"] is False and rows[1]["match_fraction"] == 0.5
    with pytest.raises(ValueError, match="no bucket"):
        target_rows({"standard": [{"id": "q", "exact_match": True}]}, {}, {}, {}, 0)
