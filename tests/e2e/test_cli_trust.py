"""Trustworthy runs from the command line: no silent overwrite, duplicates recorded, one-line errors for bad input."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from tiny_runs import tiny_run

from goldfish.app.cli import main

TINY = tiny_run(strategy="static", k=3)


def _digest(folder: Path) -> dict[str, str]:
    """{relative path: SHA-256} of every file under `folder`."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err  # one line
    return err


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """(data file, run folder) of one tiny training run on 6 documents plus a planted copy of doc0."""
    root = tmp_path_factory.mktemp("trust")
    records = [
        {"id": f"doc{i}", "text": " ".join(f"word{(i * 7 + j) % 53} token{j % 11}" for j in range(80))}
        for i in range(6)
    ]
    records.append({"id": "copy-of-doc0", "text": "  " + records[0]["text"].replace(" ", "\n", 5)})
    data_file = root / "docs.jsonl"
    data_file.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    run = root / "run"
    assert main(["train", "--out", str(run), "--data", str(data_file), "--id-field", "id", *TINY, "--epochs", "1"]) == 0
    return data_file, run


def test_run_record_lists_duplicates_and_eval_report_shows_them(trained, tmp_path, capsys):
    data_file, run = trained
    record = json.loads((run / "run.json").read_text())
    assert record["data"]["dedup"] == "near" and record["data"]["duplicates"] == "drop"
    documents = record["documents"]
    assert documents["dedup"]["threshold"] == 0.8 and documents["n_removed"] == 1
    (removed,) = documents["removed"]
    assert {removed["id"], removed["twin"]} == {"doc0", "copy-of-doc0"} and removed["kind"] == "exact-text"
    selected = {d["id"] for d in documents["train"] + documents["heldout"]}
    assert removed["twin"] in selected and removed["id"] not in selected
    out = tmp_path / "eval"
    assert (
        main(
            [
                "eval",
                "--model",
                str(run / "checkpoint"),
                "--out",
                str(out),
                "--suffix-len",
                "16",
                "--no-progress",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    report = (out / "report.md").read_text()
    assert "## Duplicates" in report and f"| {removed['id']} | {removed['twin']} | exact-text |" in report
    assert json.loads((out / "summary.json").read_text())["documents"]["n_removed"] == 1


def test_second_train_into_the_same_out_is_refused_and_the_first_run_stays_byte_identical(trained, capsys):
    data_file, run = trained
    before = _digest(run)
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--data", str(data_file), "--id-field", "id", *TINY, "--epochs", "2"]) == 2
    err = _error(capsys)
    assert f"--out {run} is not empty" in err and "--resume" in err and "--overwrite" in err
    assert _digest(run) == before
    # --overwrite of a run that fails before it finishes: the old run is untouched and no staging folder is left.
    assert (
        main(
            [
                "train",
                "--out",
                str(run),
                "--data",
                str(data_file),
                "--id-field",
                "id",
                *TINY,
                "--epochs",
                "2",
                "--n-train",
                "50",
                "--overwrite",
            ]
        )
        == 2
    )
    assert "not enough documents" in _error(capsys)
    assert _digest(run) == before and not list(run.parent.glob(f".{run.name}.*"))


def test_overwrite_replaces_the_run_only_when_the_new_one_has_finished(trained, tmp_path):
    data_file, first = trained
    run = tmp_path / "run"
    shutil.copytree(first, run)
    assert (
        main(
            [
                "train",
                "--out",
                str(run),
                "--data",
                str(data_file),
                "--id-field",
                "id",
                *TINY,
                "--epochs",
                "2",
                "--overwrite",
            ]
        )
        == 0
    )
    assert json.loads((run / "run.json").read_text())["train"]["epochs"] == 2
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 4  # 2 epochs x 2 steps: only the new run's rows
    assert not list(tmp_path.glob(".run.*"))


def test_compare_into_a_non_empty_out_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "compare"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    assert main(["compare", "--quick", "--out", str(out), "--no-progress"]) == 2
    err = _error(capsys)
    # no checkpoint there: nothing to resume, so --resume is not offered
    assert "is not empty" in err and "--resume" not in err and "--overwrite" in err
    assert (out / "summary.json").read_text() == "{}"
    (out / "checkpoint").mkdir()
    assert main(["compare", "--quick", "--out", str(out), "--no-progress"]) == 2
    assert f"--resume {out / 'checkpoint'}" in _error(capsys)


def test_resume_of_a_missing_folder(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "checkpoint"
    assert main(["train", "--out", str(tmp_path / "run"), "--resume", str(missing), "--no-progress"]) == 2
    err = _error(capsys)
    assert err == (
        f"goldfish train: error: --resume {missing}: no such folder. Fix: give the checkpoint/ folder of an "
        "interrupted run (e.g. --resume runs/a/checkpoint), or leave --resume out to start a new run"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "compare", "eval"])
def test_grid_is_checked_against_nproc_before_torchrun_starts(command, tmp_path, capsys):
    extra = ["--model", "tiny-llama"] if command == "eval" else []
    assert main([command, "--out", str(tmp_path / "run"), "--nproc", "2", "--grid", "x=3", *extra]) == 2
    err = _error(capsys)
    assert "--grid x=3 needs 3 processes but --nproc is 2" in err and "launching" not in err


def test_eval_of_a_truncated_safetensors_checkpoint(trained, tmp_path, capsys):
    _, run = trained
    broken = tmp_path / "checkpoint"
    shutil.copytree(run / "checkpoint", broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    capsys.readouterr()
    argv = ["eval", "--model", str(broken), "--out", str(tmp_path / "eval"), "--no-progress", "--suffix-len", "8"]
    assert main(argv) == 2  # a protocol the 48-token documents fit: the model is what is wrong
    err = _error(capsys)
    assert err.startswith(f"goldfish eval: error: {weights} is truncated: ") and "(1000 missing). Fix: copy" in err


def test_plan_exits_non_zero_when_no_grid_fits(capsys):
    assert main(["plan", "--model", "70B", "--gpus", "1"]) == 1
    assert "no grid of 1 GPUs fits" in _error(capsys)


def test_duplicates_repeat_trains_the_copy_as_a_counted_repeat(trained, tmp_path, capsys):
    data_file, run = trained
    side = json.loads((run / "run.json").read_text())["documents"]["removed"][0]["side"]
    out = tmp_path / "repeat"
    assert (
        main(
            [
                "train",
                "--out",
                str(out),
                "--data",
                str(data_file),
                "--id-field",
                "id",
                *TINY,
                "--epochs",
                "1",
                "--duplicates",
                "repeat",
            ]
        )
        == 0
    )
    documents = json.loads((out / "run.json").read_text())["documents"]
    assert side == "train"  # with this file and seed doc0 is a training document, so its copy is trained on too
    n_copies = 1
    assert documents["n_repeats"] == n_copies and documents["n_removed"] == 1 - n_copies
    assert f"train goldfish-static-k3: {4 + n_copies} sequences" in capsys.readouterr().out
    assert json.loads((out / "run.json").read_text())["data"]["duplicates"] == "repeat"
