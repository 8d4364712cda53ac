"""The front door answers fast: every subcommand's --help and every settings error come back without importing torch
(or transformers), the error as one line with exit status 2. Each case runs in a fresh interpreter, since a module
imported by an earlier test of this process would hide the import."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Runs `goldfish ARGV...` through the installed entry point and reports (exit status, heavy modules loaded).
_PROBE = """
import json, sys
from goldfish.app.entry import main
try:
    status = main(sys.argv[1:])
except SystemExit as stop:
    status = stop.code
heavy = sorted(name for name in ("torch", "transformers", "datasets", "scipy", "matplotlib") if name in sys.modules)
print(json.dumps({"status": status, "heavy": heavy}), file=sys.__stdout__)
"""


def _run(argv: list[str], cwd: Path) -> tuple[dict, str, float]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=300, cwd=cwd)
    seconds = time.perf_counter() - start
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"goldfish {' '.join(argv)}: {seconds:.2f} s, exit {result['status']}")
    return result, done.stderr, seconds


@pytest.mark.parametrize("command", ["train", "eval", "compare", "mask", "plan"])
def test_help_answers_without_torch(command: str, tmp_path: Path) -> None:
    result, _, seconds = _run([command, "--help"], tmp_path)
    assert result == {"status": 0, "heavy": []}
    assert seconds < 60  # about 0.1 s on an idle machine; the bound only catches a return of the heavy imports


@pytest.mark.parametrize(
    "argv, names",
    [
        (["train", "--out", "o", "--k", "0"], "k must be"),
        (["train", "--out", "o", "--grid", "data=two"], "grid"),
        (["train", "--out", "o", "--zero-quantize", "weight"], "--zero-quantize"),
        (["train", "--out", "o", "--epochs", "0"], "epochs"),
        (["train", "--out", "o", "--h", "500"], "--h 500"),
        (["train", "--out", "o", "--lora-rank", "4", "--zero", "2"], "--lora-rank"),
        (["train", "--out", "o", "--repeats", "0"], "repeats"),
        (["train", "--out", "o", "--background-streaming"], "--background"),
        (["train", "--out", "o", "--device", "cpu", "--lr", "nan"], "--lr"),
        (["compare", "--masks", "hashed:1"], "k must be"),
        (["compare", "--samples", "2", "--temperature", "0"], "temperature"),
        (["compare", "--suffix-len", "0"], "suffix_len"),
        (["eval", "--model", "m", "--out", "o", "--suffix-len", "0"], "suffix_len"),
        (["eval", "--model", "m", "--out", "o", "--beams", "1"], "beams"),
    ],
)
def test_settings_error_is_one_line_without_torch(argv: list[str], names: str, tmp_path: Path) -> None:
    result, stderr, _ = _run(argv, tmp_path)
    assert result == {"status": 2, "heavy": []}, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0], stderr
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_model_defaults_are_the_fine_tuning_settings_of_its_preset() -> None:
    from engine import TrainConfig
    from goldfish.app.presets import model_defaults, preset_spec

    smollm2 = preset_spec("smollm2")
    assert model_defaults(smollm2.model)(TrainConfig()) == smollm2.train  # the five fine-tuning settings
    assert model_defaults("smollm2-135m")(TrainConfig()).lr < 1e-3  # fine-tuning, not the tiny models' rate
    assert model_defaults("tiny-llama")(TrainConfig()) == TrainConfig() == model_defaults(None)(TrainConfig())
