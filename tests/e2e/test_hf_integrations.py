"""The HF Trainer examples (GoldfishCollator; a compute_loss override) and the `accelerate launch` example give
`goldfish train`'s loss per step (and the Trainer its final weights) to float32 rounding.

Runtime on the project's 2-core machine: the two Trainer tests about 10 s together (in this process), the
accelerate test about 35 s (two processes on gloo).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate", reason="needs the hf extra: pip install -e '.[hf]'")

from integration_reference import SETTINGS, assert_same_losses, assert_same_weights, read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def load_example(name: str):
    if str(ROOT / "examples") not in sys.path:  # as `python examples/<name>.py` has it: its sibling modules import
        sys.path.insert(0, str(ROOT / "examples"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trainer_example():
    return load_example("hf_trainer_goldfish")


def test_trainer_with_goldfish_collator(trainer_example, goldfish_train_reference: Path, tmp_path: Path) -> None:
    records = trainer_example.main(["--out", str(tmp_path), "--loss", "collator", *SETTINGS])
    expected = read_metrics(goldfish_train_reference / "metrics.jsonl")
    assert read_metrics(tmp_path / "metrics.jsonl") == records
    assert_same_losses(records, expected, keys=("loss", "grad_norm"))
    assert_same_weights(tmp_path / "hf", goldfish_train_reference / "checkpoint")


def test_trainer_compute_loss_logs_kept_dropped_and_all(
    trainer_example, goldfish_train_reference: Path, tmp_path: Path
) -> None:
    records = trainer_example.main(["--out", str(tmp_path), "--loss", "compute-loss", *SETTINGS])
    assert_same_losses(records, read_metrics(goldfish_train_reference / "metrics.jsonl"))


def test_collator_names_bad_dataset_columns() -> None:
    """A dataset column the model does not take is removed by the Trainer (remove_unused_columns) or named by the
    collator; input_ids is required."""
    from goldfish import GoldfishCollator

    collator = GoldfishCollator(pad_token_id=0, strategy="hashed", k=4, h=13)
    with pytest.raises(ValueError, match="unexpected keys \\['text'\\]"):
        collator([{"input_ids": [1, 2, 3], "text": "abc"}])
    with pytest.raises(ValueError, match="has no 'input_ids'"):
        collator([{"attention_mask": [1, 1]}])


def test_accelerate_launch_with_engine_grid(goldfish_train_reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "accelerate"
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(ROOT / "examples" / "accelerate_goldfish.py"),
        "--grid",
        "x=2",
        "--out",
        str(out),
        *SETTINGS,
    ]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert_same_losses(read_metrics(out / "metrics.jsonl"), read_metrics(goldfish_train_reference / "metrics.jsonl"))
    assert_same_weights(out / "hf", goldfish_train_reference / "checkpoint")
