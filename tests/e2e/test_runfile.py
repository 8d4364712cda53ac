"""The resolved run a `--nproc` launcher hands its workers (goldfish.app.runfile): written once, read back equal.

Every spec round-trips through the file exactly (nested dataclasses, tuples, lists of masks, optional parts), the file
is plain JSON (no pickle), and presets are parser defaults the user's typed values override, so the run a worker
executes is the one the launcher validated.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_runs import tiny_run

from goldfish.app.cli import parse_command_line
from goldfish.app.commands.compare import compare_spec
from goldfish.app.commands.eval import eval_spec
from goldfish.app.commands.option_values import runtime_of
from goldfish.app.commands.processes import resolved_run
from goldfish.app.commands.train import train_spec
from goldfish.app.runfile import from_plain, read_run, to_plain, write_run


def _args(*argv: str):
    return parse_command_line(list(argv))


def test_every_command_round_trips_through_the_file(tmp_path: Path) -> None:
    from engine.core.grid import GridShape

    train = _args(
        *("train", "--out", "o", "--grid", "data=4", "--nproc", "4", "--zero", "3"),
        *("--zero-hierarchy", "2,4", "--zero-quantize", "gradients", "--lora-rank", "0"),
    )
    compare = _args("compare", "--out", "o", "--masks", "hashed:4:13", "static:3", "--seeds", "0,1", "--beams", "2")
    evaluate = _args("eval", "--model", "runs/a/checkpoint", "--out", "e", "--strategy", "static", "--k", "3")
    specs = {
        "train": train_spec(train, GridShape(data=4)),
        "compare": compare_spec(compare, None),
        "eval": eval_spec(evaluate),
    }
    assert specs["train"].train.zero_inner_levels == (2,) and specs["train"].train.zero_node_size == 4
    for command, spec in specs.items():
        runtime = runtime_of(train if command == "train" else compare if command == "compare" else evaluate)
        run = resolved_run(command, spec, runtime, Path("out"), Path(".out.staging"), options={"clear": False})
        path = write_run(run, tmp_path / f"{command}.json")
        json.loads(path.read_text())  # plain JSON
        back = read_run(path)
        assert back == run, command
        assert back.runtime.nproc is None  # a worker launches nothing
    assert specs["eval"].mask.k == 3 and not specs["eval"].mask_from_record


def test_a_file_of_another_version_or_with_unknown_fields_is_refused(tmp_path: Path) -> None:
    from goldfish.app.config import DataSpec

    path = tmp_path / "run.json"
    path.write_text(json.dumps({"version": 0, "command": "train"}))
    with pytest.raises(ValueError, match="not a run file of this goldfish version"):
        read_run(path)
    with pytest.raises(ValueError, match="no field surprise"):
        from_plain(DataSpec, {**to_plain(DataSpec()), "surprise": 1})


def test_a_preset_is_a_default_the_typed_value_overrides() -> None:
    """`goldfish compare --preset smollm2 --epochs 3` trains 3 epochs (the preset's other values stay)."""
    from goldfish.app.presets import preset_spec

    spec = compare_spec(_args("compare", "--preset", "smollm2", "--epochs", "3", "--out", "o"), None)
    assert spec.train.epochs == 3
    assert spec.model == preset_spec("smollm2").model
    assert spec.train.lr == preset_spec("smollm2").train.lr


def test_the_worker_takes_only_a_run_file(tmp_path: Path, capsys) -> None:
    """A worker reads one run file: a command line of options is not its input."""
    from goldfish.app.worker import main

    assert main(["--epochs", "3"]) == 2
    assert main([]) == 2
    assert "RUN_FILE" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err


def test_a_model_brings_the_defaults_that_fit_it() -> None:
    """--model smollm2-135m trains with the smollm2 preset's settings unless typed; a preset wins over them."""
    from goldfish.app.presets import preset_spec

    fitted = train_spec(_args("train", "--model", "smollm2-135m", "--out", "o"), None).train
    assert (fitted.epochs, fitted.lr) == (preset_spec("smollm2").train.epochs, preset_spec("smollm2").train.lr)
    assert train_spec(_args("train", "--model", "smollm2-135m", "--epochs", "3", "--out", "o"), None).train.epochs == 3
    quick = compare_spec(_args("compare", "--preset", "quick", "--model", "smollm2-135m", "--out", "o"), None)
    assert quick.train.epochs == preset_spec("quick").train.epochs
    assert train_spec(_args("train", "--out", "o"), None).train.epochs == 20  # the tiny model's own default


def test_run_records_count_the_tokens_trained(tmp_path: Path) -> None:
    """run.json holds the tokens of every row the run reads, a checkpoint's record those read by its step."""
    from goldfish.app.cli import main

    out = tmp_path / "run"
    argv = ["train", "--out", str(out), *tiny_run(n_heldout=0, seq_len=32, vocab_size=300, epochs=3, threads=None)]
    assert main(argv) == 0
    plan = json.loads((out / "run.json").read_text())
    assert plan["tokens_trained"] == 3 * 4 * 32  # 3 epochs of 4 rows of 32 tokens
    checkpoint = json.loads((out / "checkpoint" / "goldfish_run.json").read_text())
    assert checkpoint["tokens_trained"] == plan["tokens_trained"] and checkpoint["step"] == 6


def test_a_compare_that_could_measure_nothing_is_refused_before_work(capsys) -> None:
    """Every document cut shorter than the extraction protocol: one line, exit 2, nothing trained."""
    from goldfish.app.cli import main

    assert main(["compare", "--preset", "quick", "--seq-len", "48", "--out", "never-written"]) == 2
    err = capsys.readouterr().err
    assert "--suffix-len 50 needs documents of at least 51 tokens" in err and len(err.strip().splitlines()) == 1
    assert not Path("never-written").exists()
