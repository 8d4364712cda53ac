"""engine.integrations.lightning.EngineStrategy (Fabric) and
engine.integrations.lightning_trainer.EngineTrainerStrategy (Trainer): the
examples give `goldfish train`'s loss per step on gloo with 2 and 4 processes, resume exactly, and (Fabric)
consolidate to a plain HF folder; grids that do not fit the world fail when Fabric / the Trainer is built.

Runtime on the project's 2-core machine under load: test_fabric_example_world2 about 60-80 s (two torchrun
launches), test_trainer_example_world2 (slow) about 65-80 s, test_fabric_example_world4 (slow) about 90 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning", reason="needs the lightning extra: pip install -e '.[lightning]'")

from integration_reference import (  # noqa: E402
    SETTINGS,
    assert_same_losses,
    assert_same_weights,
    read_metrics,
)
from lightning.fabric import Fabric  # noqa: E402
from tiny_runs import tiny_run  # noqa: E402

from engine import GridError  # noqa: E402
from engine.integrations.lightning import EngineStrategy  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lightning_goldfish.py"
TRAINER_EXAMPLE = ROOT / "examples" / "lightning_trainer_goldfish.py"


def torchrun(nproc: int, *args: str, example: Path = EXAMPLE) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            str(example),
            *SETTINGS,
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_fabric_example_world2(goldfish_train_reference: Path, tmp_path: Path) -> None:
    reference = goldfish_train_reference
    expected = read_metrics(reference / "metrics.jsonl")
    assert len(expected) == 4
    run = tmp_path / "fabric"
    torchrun(2, "--out", str(run), "--grid", "x=2", "--save-every", "2")
    assert_same_losses(read_metrics(run / "metrics.jsonl"), expected)

    # Resume from step 2 at the same grid: steps 3 and 4 bit-identical to the uninterrupted run.
    resumed = tmp_path / "resumed"
    torchrun(2, "--out", str(resumed), "--grid", "x=2", "--resume", str(run / "checkpoints" / "step-2"))
    assert_same_losses(read_metrics(resumed / "metrics.jsonl"), read_metrics(run / "metrics.jsonl")[2:], exact=True)

    # The consolidated folder is a plain HF checkpoint holding goldfish train's final weights.
    assert_same_weights(run / "hf", reference / "checkpoint")


@pytest.mark.slow
def test_trainer_example_world2(goldfish_train_reference: Path, tmp_path: Path) -> None:
    run = tmp_path / "trainer"
    torchrun(2, "--out", str(run), "--grid", "x=2", "--save-every", "2", example=TRAINER_EXAMPLE)
    got = read_metrics(run / "metrics.jsonl")
    assert_same_losses(got, read_metrics(goldfish_train_reference / "metrics.jsonl"))
    # ModelCheckpoint wrote engine checkpoints after epochs 2 and 4; fit(ckpt_path=...) from the first one
    # gives steps 3 and 4 bit-identical
    resumed = tmp_path / "resumed"
    torchrun(
        2,
        "--out",
        str(resumed),
        "--grid",
        "x=2",
        "--resume",
        str(run / "checkpoints" / "epoch=1.ckpt"),
        example=TRAINER_EXAMPLE,
    )
    assert_same_losses(read_metrics(resumed / "metrics.jsonl"), got[2:], exact=True)
    # The final checkpoint consolidates to a plain HF folder (the LightningModule's `model.` prefix stripped)
    # holding goldfish train's final weights.
    assert_same_weights(run / "hf", goldfish_train_reference / "checkpoint")


@pytest.mark.slow
def test_fabric_example_world4(goldfish_train_reference: Path, tmp_path: Path) -> None:
    reference = goldfish_train_reference
    run = tmp_path / "fabric4"
    torchrun(4, "--out", str(run), "--grid", "x=2,y=2")
    got = read_metrics(run / "metrics.jsonl")
    assert_same_losses(got, read_metrics(reference / "metrics.jsonl"))
    # and `goldfish train` on the same grid: step 1 (same weights, same reductions) identical
    same_grid = tmp_path / "goldfish4"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "goldfish",
            "train",
            "--nproc",
            "4",
            "--grid",
            "x=2,y=2",
            "--out",
            str(same_grid),
            "--no-progress",
            *SETTINGS,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    want = read_metrics(same_grid / "metrics.jsonl")
    assert_same_losses(got, want)
    assert got[0]["grad_norm"] == want[0]["grad_norm"]


@pytest.mark.parametrize(
    "sizes, message",
    [
        ({"x": 3}, "needs a multiple of 3 processes but the world has 2"),
        ({"data": 3}, "needs 3 processes but the world has 2"),
        ({"data": 1, "x": 1}, "needs 1 processes but the world has 2"),
    ],
)
def test_grid_that_does_not_fit_the_world_fails_when_fabric_is_built(sizes: dict, message: str) -> None:
    with pytest.raises(GridError, match=message) as error:
        Fabric(accelerator="cpu", devices=2, strategy=EngineStrategy(**sizes))
    assert "launch" in str(error.value) and "choose" in str(error.value)


def test_trainer_grid_that_does_not_fit_the_world_fails_when_the_trainer_is_built() -> None:
    import lightning as L

    from engine.integrations.lightning_trainer import EngineTrainerStrategy

    with pytest.raises(GridError, match="needs a multiple of 4 processes but the world has 2"):
        L.Trainer(accelerator="cpu", devices=2, strategy=EngineTrainerStrategy(x=2, y=2), logger=False)


def test_bad_strategy_arguments_fail_at_construction() -> None:
    with pytest.raises(GridError, match="axis x must be an integer >= 1"):
        EngineStrategy(x=0)
    with pytest.raises(ValueError, match="gradient_reduction"):
        EngineStrategy(gradient_reduction="avg")


@pytest.mark.slow
def test_fabric_example_on_conversations_equals_goldfish_train(tmp_path: Path) -> None:
    """The Fabric example takes conversations as `goldfish train` does (loss on the replies only, padded rows):
    one process, the same loss per step."""
    from goldfish.app.cli import main

    settings = tiny_run(
        data="default-chat",
        n_train=4,
        n_heldout=2,
        seq_len=192,
        vocab_size=None,
        batch_size=4,
        epochs=2,
        no_progress=False,
        threads=None,
        grad_accum=2,
        strategy="hashed",
        k=4,
        optimizer="sgd",
        lr=0.5,
        max_grad_norm=100,
    )
    reference = tmp_path / "reference"
    assert main(["train", "--out", str(reference), "--no-progress", "--threads", "1", *settings]) == 0
    run = tmp_path / "fabric"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, str(EXAMPLE), "--devices", "1", "--out", str(run), *settings]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_same_losses(read_metrics(run / "metrics.jsonl"), read_metrics(reference / "metrics.jsonl"))
