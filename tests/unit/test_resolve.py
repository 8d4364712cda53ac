"""Settings resolved once: the command line is parsed once, every preset resolves to a spec, and the resolved run
(the file --nproc workers read) and a checkpoint's run record round-trip to the same spec (issue 45)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from goldfish.app.cli import main, parse_command_line
from goldfish.app.commands.compare import compare_spec
from goldfish.app.commands.option_values import runtime_of
from goldfish.app.commands.processes import resolved_run
from goldfish.app.commands.train import train_spec
from goldfish.app.config import RUN_FILE, CompareSpec
from goldfish.app.plan import add_plan_arguments, parse_plan_args
from goldfish.app.presets import COMPARE_PRESETS, PLAN_PRESETS, preset_spec
from goldfish.app.resume import recorded_spec, resumed_spec
from goldfish.app.runfile import read_run, write_run


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The prog of every parser that parses arguments from now on (argparse's parse_args goes through
    parse_known_args; a subcommand's parser is called by its parent's)."""
    calls: list[str] = []
    original = argparse.ArgumentParser.parse_known_args

    def counting(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> object:
        calls.append(self.prog)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", counting)
    return calls


@pytest.mark.parametrize(
    "argv",
    [
        ["compare", "--preset", "smollm2", "--epochs", "3"],
        ["compare", "--quick", "--model", "smollm2-135m"],
        ["train", "--model", "smollm2-135m", "--out", "o"],
        ["eval", "--model", "m", "--out", "o"],
        ["plan", "--preset", "paper", "--gpus", "64"],
        ["mask", "--text", "a b c"],
    ],
)
def test_the_command_line_is_parsed_once(argv: list[str], parses: list[str]) -> None:
    """Presets and model defaults are layered in code over one parse (it was up to four)."""
    parse_command_line(argv)
    assert parses == ["goldfish", f"goldfish {argv[0]}"]


def test_goldfish_plan_alone_parses_once(parses: list[str]) -> None:
    from goldfish.app.argparsing import OneLineParser

    parser = OneLineParser(prog="goldfish plan")
    add_plan_arguments(parser)
    args = parse_plan_args(parser, ["--preset", "paper", "--gpus", "64"])
    assert parses == ["goldfish plan"]
    assert args.gpus == 64  # typed: wins over the preset
    assert args.profile == PLAN_PRESETS["paper"]().profile


def checkpoint_with_record(folder: Path, spec: object) -> Path:
    """A checkpoint folder holding only the run record goldfish train writes (goldfish.app.records.run_record)."""
    folder.mkdir(parents=True)
    record = {
        "model": spec.model,
        "init_seed": spec.init_seed,
        "data": asdict(spec.data),
        "mask": asdict(spec.mask) | {"label": spec.mask.label},
        "train": asdict(spec.train),
        "lora": None,
    }
    (folder / RUN_FILE).write_text(json.dumps(record))
    return folder


def test_a_resume_parses_once_and_refuses_a_change(tmp_path: Path, parses: list[str], capsys) -> None:
    """`train --resume` takes the untyped options from the checkpoint without parsing the command line again, and
    a typed option that changes the experiment is one line, exit 2, before any work."""
    saved = train_spec(parse_command_line(["train", "--lr", "0.001", "--out", "o"]), None)
    checkpoint = checkpoint_with_record(tmp_path / "run" / "checkpoint", saved)
    parses.clear()
    assert main(["train", "--resume", str(checkpoint), "--epochs", "3"]) == 2
    assert parses == ["goldfish", "goldfish train"]
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--epochs 20 -> 3" in err and "--lr" not in err


def test_a_resume_takes_every_untyped_setting_from_thecheckpoint_with_record(tmp_path: Path) -> None:
    saved = train_spec(parse_command_line(["train", "--lr", "0.002", "--k", "5", "--out", "o"]), None)
    args = parse_command_line(["train", "--resume", "x", "--save-every", "7", "--no-progress"])
    resumed = resumed_spec(saved, args, None)
    assert resumed == replace(saved, train=replace(saved.train, save_every=7, progress=False))
    assert args.lr != 0.002  # the parsed command line is left as it was
    changed = resumed_spec(saved, parse_command_line(["train", "--resume", "x", "--strategy", "static"]), None)
    assert (changed.mask.strategy, changed.mask.k) == ("static", 5)  # the checkpoint's k, the typed strategy


@pytest.mark.parametrize("name", sorted(COMPARE_PRESETS))
def test_every_compare_preset_resolves_and_its_resolved_run_round_trips(name: str, tmp_path: Path) -> None:
    args = parse_command_line(["compare", "--preset", name])
    spec = compare_spec(args, None)
    preset = COMPARE_PRESETS[name](replace(CompareSpec(), curve_every=None))
    assert replace(spec, curve_every=None, train=replace(spec.train, progress=True)) == replace(
        preset, curve_every=None
    )  # the preset's spec, over the defaults of its model (a spec's own defaults where it names none)
    run = resolved_run("compare", spec, runtime_of(args), tmp_path / "out", tmp_path / "out")
    assert read_run(write_run(run, tmp_path / "run.json")) == run


@pytest.mark.parametrize("name", sorted(PLAN_PRESETS))
def test_every_plan_preset_resolves(name: str) -> None:
    args = parse_command_line(["plan", "--preset", name])
    for dest, value in PLAN_PRESETS[name]().options().items():
        assert getattr(args, dest) == value, dest


def test_a_preset_is_a_typed_function_of_a_spec() -> None:
    """Each compare preset is a function CompareSpec -> CompareSpec: it sets its settings on whatever spec it is given
    (here one with another model's training defaults) and leaves the rest of it as it was."""
    base = replace(CompareSpec(), init_seed=7, train=replace(CompareSpec().train, weight_decay=0.05))
    for name, preset in COMPARE_PRESETS.items():
        spec = preset(base)
        assert isinstance(spec, CompareSpec) and spec.init_seed == 7, name
        assert spec.train.weight_decay == (0.1 if name == "paper" else 0.05), name


@pytest.mark.parametrize(
    "argv",
    [["--out", "o"], ["--model", "smollm2-135m", "--out", "o"], ["--strategy", "hashed", "--k", "3", "--out", "o"]],
)
def test_a_train_spec_round_trips_through_its_run_file_and_its_run_record(argv: list[str], tmp_path: Path) -> None:
    args = parse_command_line(["train", *argv])
    spec = train_spec(args, None)
    run = resolved_run("train", spec, runtime_of(args), tmp_path / "out", tmp_path / "out")
    assert read_run(write_run(run, tmp_path / "run.json")) == run
    record = json.loads((checkpoint_with_record(tmp_path / "checkpoint", spec) / RUN_FILE).read_text())
    assert recorded_spec(record) == spec


def test_a_typed_value_equal_to_the_default_still_wins_over_the_preset() -> None:
    default = parse_command_line(["compare"]).lr
    assert preset_spec("smollm2").train.lr != default
    typed = parse_command_line(["compare", "--preset", "smollm2", "--lr", str(default)])
    assert compare_spec(typed, None).train.lr == default
    assert parse_command_line(["compare", "--preset", "smollm2"]).typed == frozenset({"preset"})


@pytest.mark.parametrize("command", ["train", "eval", "compare", "mask", "plan"])
def test_help_shows_the_defaults_not_their_markers(command: str, capsys) -> None:
    with pytest.raises(SystemExit):
        parse_command_line([command, "--help"])
    text = capsys.readouterr().out
    assert "Unset" not in text and "(default:" in text
    if command == "compare":
        assert "(default: runs/compare)" in text and "(default: ['hashed:4:13'])" in " ".join(text.split())


def test_a_run_record_of_an_earlier_version_loads_as_it_ran(tmp_path: Path) -> None:
    """A record written before deduplication existed (no "dedup") selected its documents without it: --resume and
    eval read it so (resume.recorded_data), not with today's default."""
    from goldfish.app.config import DataSpec
    from goldfish.app.resume import read_run_record, recorded_data

    spec = train_spec(parse_command_line(["train", "--out", "o"]), None)
    checkpoint = checkpoint_with_record(tmp_path / "checkpoint", spec)
    record = json.loads((checkpoint / RUN_FILE).read_text())
    del record["data"]["dedup"], record["lora"]
    (checkpoint / RUN_FILE).write_text(json.dumps(record))
    assert DataSpec().dedup != "off"
    assert recorded_spec(read_run_record(checkpoint)) == replace(spec, data=replace(spec.data, dedup="off"))
    assert recorded_data(record).dedup == "off"
