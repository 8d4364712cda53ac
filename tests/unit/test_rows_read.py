"""What a run's first steps read (engine.training.train.rows_consumed) and the copies a checkpoint has trained
(goldfish.app.records.TrainedCopies.counts) equal a replay of the training loop's own step_rows, step by step, and
cost no more for a million epochs than for one."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import torch

from engine.training import train as engine_train
from engine.training.config import TrainConfig
from goldfish.app.records import TrainedCopies


def _replayed(n_examples: int, config: TrainConfig, steps: int) -> Counter:
    return Counter(int(i) for step in range(steps) for i in engine_train.step_rows(n_examples, config, step))


@pytest.mark.parametrize("n_examples, batch_size, shuffle", [(7, 3, True), (8, 4, True), (5, 2, False), (1, 1, True)])
def test_rows_consumed_equals_a_replay_of_the_steps(n_examples, batch_size, shuffle):
    config = TrainConfig(epochs=5, batch_size=batch_size, shuffle=shuffle, seed=3)
    per_epoch = engine_train.steps_per_epoch(n_examples, batch_size)
    for steps in range(0, 5 * per_epoch + 1):
        read = engine_train.rows_consumed(n_examples, config, steps)
        counted = Counter({i: read.whole_epochs for i in range(n_examples)}) + Counter(read.partial.tolist())
        assert +counted == +_replayed(n_examples, config, steps), steps
        assert read.n_rows(n_examples) == sum(_replayed(n_examples, config, steps).values())


def test_trained_copies_count_whole_copies_per_epoch_as_a_replay_does():
    """Copies spanning several rows (packed documents) count once per epoch in which every row of theirs was read."""
    config = TrainConfig(epochs=4, batch_size=2, seed=1)
    n_rows = 5
    copies = TrainedCopies(
        documents=("a", "b", "a", "c"),
        first=torch.tensor([0, 1, 3, 4]),
        last=torch.tensor([0, 2, 3, 4]),
        ids=("a", "b", "c", "d"),
    )
    per_epoch = engine_train.steps_per_epoch(n_rows, config.batch_size)
    for steps in range(0, 4 * per_epoch + 1):
        expected = dict.fromkeys(copies.ids, 0)
        for epoch_start in range(0, steps, per_epoch):
            read = {
                int(i)
                for step in range(epoch_start, min(steps, epoch_start + per_epoch))
                for i in engine_train.step_rows(n_rows, config, step)
            }
            for name, first, last in zip(copies.documents, copies.first.tolist(), copies.last.tolist()):
                expected[name] += all(r in read for r in range(first, last + 1))
        assert copies.counts(n_rows, config, steps) == expected, steps


def test_a_million_epochs_are_described_at_once():
    config = TrainConfig(epochs=1_000_000, batch_size=2)
    start = time.perf_counter()
    read = engine_train.rows_consumed(4, config, engine_train.total_steps_of(4, config))
    assert read.whole_epochs == 1_000_000 and len(read.partial) == 0
    assert time.perf_counter() - start < 1.0  # one randperm at most, not a million
