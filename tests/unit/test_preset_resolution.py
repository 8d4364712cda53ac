"""Every preset resolves to the same spec it resolved to before presets became typed functions (issue 45): the
resolved spec (asdict) of each preset, and of command lines that layer typed options and model defaults over one,
recorded once in tests/fixtures/resolved/presets.json and compared field by field. Precedence: what the user typed
wins over the preset, which wins over the model's defaults, which win over the command's own."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from goldfish.app.cli import parse_command_line
from goldfish.app.commands.compare import compare_spec
from goldfish.app.commands.train import train_spec

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "resolved" / "presets.json"

# The command lines whose resolved spec is recorded: every preset alone, and each layer of the precedence.
COMMAND_LINES: tuple[tuple[str, ...], ...] = (
    ("compare",),
    ("compare", "--quick"),
    ("compare", "--preset", "quick"),
    ("compare", "--preset", "smollm2"),
    ("compare", "--preset", "smollm2-lora"),
    ("compare", "--preset", "chat"),
    ("compare", "--preset", "corpus"),
    ("compare", "--preset", "corpus-mechanism"),
    ("compare", "--preset", "paper"),
    ("compare", "--model", "smollm2-135m"),  # the model's defaults over the command's
    ("compare", "--quick", "--model", "smollm2-135m"),  # the preset over the model's defaults
    ("compare", "--preset", "smollm2", "--epochs", "30"),  # typed over the preset (curve_every stays the preset's)
    ("compare", "--preset", "smollm2", "--lr", "0.003"),  # typed equal to the command's default still wins
    ("compare", "--preset", "quick", "--epochs", "30"),  # curve_every follows the typed epochs
    ("compare", "--preset", "chat", "--curve-every", "3", "--masks", "static:3", "random:5"),
    ("compare", "--preset", "corpus", "--max-grad-norm", "0", "--seeds", "4,5", "--background", "python-stdlib"),
    ("compare", "--preset", "smollm2-lora", "--lora-rank", "8", "--lora-targets", "q_proj,v_proj"),
    (
        "compare",
        "--preset",
        "paper",
        "--zero",
        "2",
        "--zero-hierarchy",
        "2,8",
        "--precision",
        "fp32",
        "--tokenizer",
        "gpt2",
    ),
    ("compare", "--preset", "corpus-mechanism", "--model", "tiny-gpt2", "--beams", "0", "--no-progress"),
    ("train", "--out", "o"),
    ("train", "--model", "smollm2-135m", "--out", "o"),
    ("train", "--model", "smollm2-135m", "--lr", "0.01", "--epochs", "2", "--out", "o"),
    ("train", "--strategy", "apertus", "--lora-rank", "4", "--max-grad-norm", "0", "--out", "o"),
)
PLAN_LINES: tuple[tuple[str, ...], ...] = (
    ("plan", "--preset", "paper"),
    ("plan", "--preset", "paper", "--gpus", "64", "--profile", "perlmutter"),
)


def _as_json(value: Any) -> Any:
    return json.loads(json.dumps(value))  # tuples as lists, as the recording holds them


def resolved(argv: tuple[str, ...]) -> Any:
    """The resolved spec of a train or compare command line (asdict), or a plan's resolved options."""
    if argv[0] == "plan":
        from goldfish.app.argparsing import OneLineParser
        from goldfish.app.plan import add_plan_arguments, parse_plan_args

        parser = OneLineParser(prog="goldfish plan")
        add_plan_arguments(parser)
        args = parse_plan_args(parser, list(argv[1:]))
        return _as_json({k: v for k, v in sorted(vars(args).items()) if k not in ("func", "parser")})
    args = parse_command_line(list(argv))
    spec = compare_spec(args, None) if argv[0] == "compare" else train_spec(args, None)
    return _as_json(asdict(spec))


def _recorded() -> dict[str, Any]:
    return json.loads(RECORDED.read_text(encoding="utf-8"))


@pytest.mark.parametrize("argv", COMMAND_LINES + PLAN_LINES, ids=" ".join)
def test_a_command_line_resolves_to_its_recorded_spec(argv: tuple[str, ...]) -> None:
    recorded = _recorded()[" ".join(argv)]
    now = resolved(argv)
    assert {k: v for k, v in now.items() if recorded.get(k) != v} == {}
    assert now == recorded


def test_every_preset_is_recorded() -> None:
    from goldfish.app.presets import COMPARE_PRESETS, PLAN_PRESETS

    recorded = _recorded()
    assert {name for name in COMPARE_PRESETS if f"compare --preset {name}" not in recorded} == set()
    assert {name for name in PLAN_PRESETS if f"plan --preset {name}" not in recorded} == set()


if __name__ == "__main__":  # record the resolved specs (only when the resolution is meant to change: say why)
    RECORDED.write_text(
        json.dumps({" ".join(argv): resolved(argv) for argv in COMMAND_LINES + PLAN_LINES}, indent=1) + "\n",
        encoding="utf-8",
    )
