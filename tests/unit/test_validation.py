"""One validation pass per command (goldfish.app.validation, issue 45): each command calls its validate_ function once,
no other part of its command path runs a check, and bad input of every check family is one line and exit 2 with no
work started (the run folder, the workers, the run, the clearing of an earlier eval's files)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Callable

import pytest
from test_resolve import checkpoint_with_record

import goldfish.app.commands.compare as compare_command
import goldfish.app.commands.eval as eval_command
import goldfish.app.commands.mask as mask_command
import goldfish.app.commands.train as train_command
from goldfish.app.cli import main, parse_command_line
from goldfish.app.commands.train import train_spec

COMMANDS = Path(__file__).resolve().parents[2] / "goldfish" / "app" / "commands"
# Each command's entry functions and the one validation each calls.
ENTRIES = {
    "train.py": {"cmd_train": "validate_train"},
    "compare.py": {"cmd_compare": "validate_compare", "cmd_compare_checkpoints": "validate_compare_checkpoints"},
    "eval.py": {"cmd_eval": "validate_eval"},
    "mask.py": {"cmd_mask": "validate_mask"},
}


def _called(node: ast.AST) -> list[str]:
    """The names of the functions `node` calls (f(...) or module.f(...))."""
    names = []
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            names.append(
                func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            )
    return names


@pytest.mark.parametrize("module", sorted(ENTRIES))
def test_each_command_validates_in_one_place(module: str) -> None:
    """Every entry function calls its validate_ function once; nothing it reaches in its module before the work
    (run_*: the checks that need the loaded model or data) calls a check_ function."""
    tree = ast.parse((COMMANDS / module).read_text(encoding="utf-8"))
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    for entry, validation in ENTRIES[module].items():
        calls = _called(functions[entry])
        assert calls.count(validation) == 1, f"{entry} must call {validation} once"
        assert not [name for name in calls if name.startswith("validate_") and name != validation], entry
        reached, todo = set(), [entry]
        while todo:  # the module's functions the entry reaches, the work (run_*) and other entries (cmd_*) left out
            name = todo.pop()
            reached.add(name)
            todo += [
                called
                for called in _called(functions[name])
                if called in functions and called not in reached and not called.startswith(("run_", "cmd_"))
            ]
        checks = {
            f"{name}: {called}"
            for name in reached
            for called in _called(functions[name])
            if called.startswith(("check_", "_check_"))
        }
        assert not checks, f"checks outside {validation}: {sorted(checks)}"


class Work:
    """Spies on the first steps of work of a command: any call is recorded and refused."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: Any, *names: str) -> None:
        self.reached: list[str] = []
        for name in names:
            monkeypatch.setattr(module, name, self._refuse(name))

    def _refuse(self, name: str) -> Callable[..., Any]:
        def reached(*args: Any, **kwargs: Any) -> Any:
            self.reached.append(name)
            raise AssertionError(f"{name} reached although validation failed")

        return reached


def _validation_spy(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[str]:
    """Record each call of `module.name` (a validate_ function) and whether it refused."""
    calls: list[str] = []
    original = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        try:
            result = original(*args, **kwargs)
        except ValueError:
            calls.append("refused")
            raise
        calls.append("passed")
        return result

    monkeypatch.setattr(module, name, spy)
    return calls


def _refused_in_one_line(argv: list[str], capsys: pytest.CaptureFixture[str], names: str) -> None:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and names in lines[0], lines


def _checkpoint(folder: Path) -> Path:
    """A checkpoint folder holding only a run record of a default train run."""
    return checkpoint_with_record(folder, train_spec(parse_command_line(["train", "--out", "o"]), None))


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--zero", "1"], "ZeRO stage 1"),  # against the grid
        (["--nproc", "2", "--data", "{tmp}/missing.jsonl"], "missing.jsonl"),  # the documents, before the workers
        (["--resume", "{checkpoint}", "--epochs", "3"], "--epochs 20 -> 3"),  # a resume that changes the experiment
    ],
)
def test_train_refuses_before_any_work(argv: list[str], names: str, tmp_path: Path, monkeypatch, capsys) -> None:
    checkpoint = _checkpoint(tmp_path / "run" / "checkpoint")
    work = Work(monkeypatch, train_command, "run_folder", "run_train", "launch")
    validation = _validation_spy(monkeypatch, train_command, "validate_train")
    argv = [a.format(tmp=tmp_path, checkpoint=checkpoint) for a in argv]
    _refused_in_one_line(["train", "--out", str(tmp_path / "out"), *argv], capsys, names)
    assert validation == ["refused"] and work.reached == []
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--suffix-len", "200", "--seq-len", "64"], "--suffix-len 200"),  # the extraction protocol
        (["--zero", "2"], "ZeRO stage 2"),  # against the grid
        (["--nproc", "2", "--data", "{tmp}/missing.jsonl"], "missing.jsonl"),  # the documents
    ],
)
def test_compare_refuses_before_any_work(argv: list[str], names: str, tmp_path: Path, monkeypatch, capsys) -> None:
    work = Work(monkeypatch, compare_command, "run_folder", "run_compare", "launch")
    validation = _validation_spy(monkeypatch, compare_command, "validate_compare")
    argv = [a.format(tmp=tmp_path) for a in argv]
    _refused_in_one_line(["compare", "--out", str(tmp_path / "out"), *argv], capsys, names)
    assert validation == ["refused"] and work.reached == []
    assert not (tmp_path / "out").exists()


def test_compare_checkpoints_refuses_before_any_work(tmp_path: Path, monkeypatch, capsys) -> None:
    import goldfish.app.released

    work = Work(monkeypatch, compare_command, "run_folder")
    Work(monkeypatch, goldfish.app.released, "evaluate_checkpoints")
    validation = _validation_spy(monkeypatch, compare_command, "validate_compare_checkpoints")
    argv = ["compare", "--out", str(tmp_path / "out"), "--checkpoints", "a=b", "--nproc", "2"]
    _refused_in_one_line(argv, capsys, "--checkpoints evaluates in one process")
    assert validation == ["refused"] and work.reached == []


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--model", "tiny-llama", "--data", "default", "--out", "{full}"], "is not empty"),  # --out
        (["--model", "{tmp}", "--out", "{out}"], "has no goldfish_run.json"),  # a run record, or --data
        (["--model", "tiny-llama", "--data", "default", "--reference", "{tmp}/no.gguf", "--out", "{out}"], "no.gguf"),
        (  # what a pipe grid cannot evaluate
            ["--model", "tiny-llama", "--data", "default", "--nproc", "4", "--grid", "pipe=2,x=2"] + ["--out", "{out}"],
            "pipe and data axes only",
        ),
    ],
)
def test_eval_refuses_before_any_work(argv: list[str], names: str, tmp_path: Path, monkeypatch, capsys) -> None:
    import goldfish.app.checks

    full = tmp_path / "full"
    full.mkdir()
    (full / "summary.json").write_text("{}")
    work = Work(monkeypatch, eval_command, "run_eval", "launch", "_eval_holding_out")
    Work(monkeypatch, goldfish.app.checks, "clear_eval_outputs")
    validation = _validation_spy(monkeypatch, eval_command, "validate_eval")
    argv = [a.format(tmp=tmp_path, full=full, out=tmp_path / "out") for a in argv]
    _refused_in_one_line(["eval", *argv], capsys, names)
    assert validation == ["refused"] and work.reached == []
    assert not (tmp_path / "out").exists() and (full / "summary.json").exists()


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--text", "a b", "--file", "f.txt"], "exactly one of"),
        (["--text", "a b", "--strategy", "standard"], "--strategy"),
    ],
)
def test_mask_refuses_before_any_work(argv: list[str], names: str, monkeypatch, capsys) -> None:
    work = Work(monkeypatch, mask_command, "run_mask")
    validation = _validation_spy(monkeypatch, mask_command, "validate_mask")
    _refused_in_one_line(["mask", *argv], capsys, names)
    assert validation == ["refused"] and work.reached == []


def test_good_input_passes_validation_and_reaches_the_work(tmp_path: Path, monkeypatch, capsys) -> None:
    """The spies see work where validation passes: the refusals above are validation's, not the spies' doing."""
    work = Work(monkeypatch, mask_command, "run_mask")
    validation = _validation_spy(monkeypatch, mask_command, "validate_mask")
    with pytest.raises(AssertionError, match="run_mask reached"):
        main(["mask", "--text", "a b c"])
    assert validation == ["passed"] and work.reached == ["run_mask"]
    work = Work(monkeypatch, train_command, "run_folder")
    validation = _validation_spy(monkeypatch, train_command, "validate_train")
    with pytest.raises(AssertionError, match="run_folder reached"):
        main(["train", "--out", str(tmp_path / "out")])
    assert validation == ["passed"] and work.reached == ["run_folder"]
