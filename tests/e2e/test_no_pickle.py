"""Nothing in a checkpoint or a model folder is unpickled as code.

A crafted pickle (an object whose __reduce__ calls exec, which writes a marker file) is planted in each file of a
goldfish checkpoint and of a model folder, and beside them under the names pickle-based tools use; `goldfish train
--resume`, `goldfish eval --model` and `eval --reference` either ignore it or refuse it in one line (exit 2). The
marker file is never written. The state files themselves round-trip exactly and refuse what they cannot hold.
"""

from __future__ import annotations

import builtins
import io
import json
import math
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_runs import tiny_run

from engine.training.state_files import StateFileError, load_state, save_state
from goldfish.app.cli import main

TINY = tiny_run()
EVAL = ["--suffix-len", "16", "--bootstrap", "0", "--no-progress", "--threads", "1"]

# What `goldfish train` writes into OUT/checkpoint (checked below, so a new file cannot escape the test).
CHECKPOINT_FILES = [
    "config.json",
    "generation_config.json",
    "goldfish_run.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "trainer_state.json",
    "trainer_state.safetensors",
]
# Names under which pickle-based tools keep state: planted beside a complete checkpoint, they are never opened.
BESIDE = ["trainer_state.pt", "pytorch_model.bin", "optimizer.pt", "training_args.bin", "rng_state.pth"]


class _Payload:
    """Unpickling this runs exec, which writes the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (builtins.exec, (f"open({self.marker!r}, 'w').write('unpickled')",))


def crafted_pickle(marker: Path) -> bytes:
    """A torch.save file (what torch.load and transformers' .bin loader read) whose unpickling writes `marker`."""
    buffer = io.BytesIO()
    torch.save({"model": _Payload(marker)}, buffer)
    return buffer.getvalue()


def _one_line_or_success(code: int, capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert code in (0, 2), err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    if code == 2:
        lines = [line for line in err.splitlines() if "error:" in line]
        assert len(lines) == 1 and err.endswith(lines[0]), err[-2000:]
    return err


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny training run (1 epoch, 2 steps)."""
    out = tmp_path_factory.mktemp("run") / "run"
    assert main(["train", "--out", str(out), *TINY, "--epochs", "1"]) == 0
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == CHECKPOINT_FILES
    return out


def _planted(run: Path, tmp_path: Path, name: str, marker: Path) -> Path:
    """A copy of `run` whose checkpoint file `name` is the crafted pickle."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    (copy / "checkpoint" / name).write_bytes(crafted_pickle(marker))
    return copy


@pytest.mark.parametrize("name", CHECKPOINT_FILES + BESIDE)
def test_planted_pickle_never_runs_on_resume(run: Path, tmp_path: Path, name: str, capsys) -> None:
    marker = tmp_path / "MARKER"
    copy = _planted(run, tmp_path, name, marker)
    capsys.readouterr()
    code = main(["train", "--out", str(copy), "--resume", str(copy / "checkpoint"), *TINY, "--epochs", "1"])
    _one_line_or_success(code, capsys)
    assert not marker.exists()
    if name in BESIDE:  # never opened: the checkpoint beside it resumes as if it were not there
        assert code == 0


@pytest.mark.parametrize("name", CHECKPOINT_FILES + BESIDE)
def test_planted_pickle_never_runs_on_eval_model(run: Path, tmp_path: Path, name: str, capsys) -> None:
    marker = tmp_path / "MARKER"
    copy = _planted(run, tmp_path, name, marker)
    capsys.readouterr()
    code = main(["eval", "--model", str(copy / "checkpoint"), "--out", str(tmp_path / "eval"), *EVAL])
    err = _one_line_or_success(code, capsys)
    assert not marker.exists()
    if name == "goldfish_run.json":  # the line names the file that is not a run record
        assert code == 2 and "goldfish_run.json is not a run record" in err, err


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "pytorch_model.bin"])
def test_planted_pickle_never_runs_on_eval_reference(run: Path, tmp_path: Path, name: str, capsys) -> None:
    """The reference model's folder gets the pickle (its weights, its config, or a .bin beside its safetensors)."""
    marker = tmp_path / "MARKER"
    copy = _planted(run, tmp_path, name, marker)
    capsys.readouterr()
    code = main(
        [
            "eval",
            "--model",
            str(run / "checkpoint"),
            "--reference",
            str(copy / "checkpoint"),
            "--out",
            str(tmp_path / "eval"),
            *EVAL,
        ]
    )
    _one_line_or_success(code, capsys)
    assert not marker.exists()


def _bin_only_folder(run: Path, tmp_path: Path, marker: Path) -> Path:
    """A model folder whose only weights are a crafted pytorch_model.bin."""
    folder = tmp_path / "bin-model"
    shutil.copytree(run / "checkpoint", folder)
    for name in ("model.safetensors", "trainer_state.json", "trainer_state.safetensors"):
        (folder / name).unlink()
    (folder / "pytorch_model.bin").write_bytes(crafted_pickle(marker))
    return folder


def test_a_folder_with_only_a_crafted_bin_is_refused_in_one_line(run: Path, tmp_path: Path, capsys) -> None:
    marker = tmp_path / "MARKER"
    folder = _bin_only_folder(run, tmp_path, marker)
    capsys.readouterr()
    commands = {
        "eval --model": ["eval", "--model", str(folder), "--out", str(tmp_path / "e1"), *EVAL],
        "eval --reference": [
            "eval",
            *["--model", str(run / "checkpoint"), "--reference", str(folder), "--out", str(tmp_path / "e2"), *EVAL],
        ],
        "train --model": ["train", "--out", str(tmp_path / "t"), *TINY, "--model", str(folder), "--epochs", "1"],
    }
    for label, argv in commands.items():
        err = _one_line_or_success(main(argv), capsys)
        assert "pytorch_model.bin" in err and "never loaded" in err and "safetensors" in err, (label, err)
        assert not marker.exists(), label


def test_a_folder_with_a_tensors_only_bin_loads_through_the_weights_only_reader(tmp_path: Path) -> None:
    """The refusal above is of what the .bin holds, not of the format: plain tensors load (torch's weights-only
    unpickler, which transformers uses by default)."""
    from tiny_models import tiny_llama

    from goldfish.app.pretrained import load_pretrained_model

    model = tiny_llama(vocab=64, seed=3)
    model.config.save_pretrained(tmp_path / "bin")
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    loaded = load_pretrained_model(tmp_path / "bin").state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(loaded[key], value), key


def test_a_checkpoint_of_the_pickle_format_is_refused_unread(run: Path, tmp_path: Path, capsys) -> None:
    """A checkpoint of the older format (trainer_state.pt, no trainer_state.json): refused without opening it."""
    marker = tmp_path / "MARKER"
    copy = _planted(run, tmp_path, "trainer_state.pt", marker)
    for name in ("trainer_state.json", "trainer_state.safetensors"):
        (copy / "checkpoint" / name).unlink()
    capsys.readouterr()
    code = main(["train", "--out", str(copy), "--resume", str(copy / "checkpoint"), *TINY, "--epochs", "1"])
    err = _one_line_or_success(code, capsys)
    assert code == 2 and "trainer_state.pt is a pickle" in err and "never opened" in err, err
    assert not marker.exists()


@pytest.mark.parametrize("name", ["trainer_state.json", "trainer_state.safetensors", "trainer_state.pt"])
def test_planted_pickle_never_runs_in_the_nproc_launcher(run: Path, tmp_path: Path, name: str, capsys) -> None:
    """`--nproc 2 --resume` reads the trainer state in the launcher before any worker starts."""
    marker = tmp_path / "MARKER"
    copy = _planted(run, tmp_path, name, marker)
    if name == "trainer_state.pt":  # the older format alone
        for old in ("trainer_state.json", "trainer_state.safetensors"):
            (copy / "checkpoint" / old).unlink()
    capsys.readouterr()
    argv = ["train", "--nproc", "2", "--out", str(copy), "--resume", str(copy / "checkpoint"), *TINY, "--epochs", "1"]
    code = main(argv)
    err = _one_line_or_success(code, capsys)
    assert code == 2 and "trainer_state" in err, err
    assert not marker.exists()


def _padded(data: bytes, like: Path) -> bytes:
    """`data` padded with zeros to the size of the file `like` (so that it passes the check for truncated files)."""
    return data + bytes(max(0, like.stat().st_size - len(data)))


@pytest.mark.slow
def test_planted_pickle_in_a_sharded_checkpoint_never_runs_on_an_nproc_resume(tmp_path: Path, capsys) -> None:
    """A sharded checkpoint (--nproc 2, data=2): rank 1's record (which only its worker reads), DCP's metadata file
    (a pickle that torch's own reader would unpickle with pickle.load) and a DCP data file each hold a crafted
    pickle in turn; the resume refuses in one line naming the file, and the pickle never runs."""
    out = tmp_path / "run"
    argv = ["train", "--nproc", "2", *TINY, "--epochs", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    shards = out / "checkpoint" / "engine_shards"
    assert sorted(p.name for p in shards.iterdir() if p.name.startswith("rank-00001.state"))
    plants = {
        "rank-00001.state": lambda marker: [(r, crafted_pickle(marker)) for r in shards.glob("rank-00001.state.*")],
        ".metadata": lambda marker: [(shards / ".metadata", pickle.dumps(_Payload(marker)))],
        "__1_0.distcp": lambda marker: [
            (shards / "__1_0.distcp", _padded(crafted_pickle(marker), shards / "__1_0.distcp"))
        ],
    }
    for name, plant in plants.items():
        marker = tmp_path / f"MARKER-{name}"
        copy = tmp_path / f"copy-{name}"
        shutil.copytree(out, copy)
        for path, data in plant(marker):
            (copy / path.relative_to(out)).write_bytes(data)
        capsys.readouterr()
        code = main([*argv, "--out", str(copy), "--resume", str(copy / "checkpoint")])
        err = _one_line_or_success(code, capsys)
        assert code == 2 and name in err, err
        assert "weights_only" not in err, err  # torch's advice to load unsafely is never passed on
        assert not marker.exists(), name


def test_a_folder_with_remote_code_never_runs_it(run: Path, tmp_path: Path) -> None:
    """A model folder whose config points at its own Python file (auto_map, an unknown model type): transformers
    would ask whether to run it and run it on "y"; goldfish never asks (trust_remote_code=False) and refuses."""
    marker = tmp_path / "MARKER"
    folder = tmp_path / "remote-code"
    shutil.copytree(run / "checkpoint", folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="planted", auto_map={"AutoConfig": "planted.C", "AutoModelForCausalLM": "planted.M"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "planted.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    for argv in (
        ["eval", "--model", str(folder), "--out", str(tmp_path / "e1"), *EVAL],
        ["eval", "--model", str(run / "checkpoint"), "--reference", str(folder), "--out", str(tmp_path / "e2"), *EVAL],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "goldfish", *argv],
            input="y\ny\ny\n",  # what a user would answer to transformers' question
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=300,
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
        errors = [line for line in done.stderr.splitlines() if line.startswith("goldfish eval: error: ")]
        assert len(errors) == 1 and ("never runs" in errors[0] or "custom code" in errors[0]), done.stderr[-3000:]
        assert "Do you wish to run" not in done.stdout + done.stderr  # never asked
        assert not marker.exists()


# ----- the state files themselves ------------------------------------------------------------------------------


def test_state_files_round_trip_exactly(tmp_path: Path) -> None:
    shared = torch.arange(6.0)
    state = {
        "step": 3,
        "flag": True,
        "none": None,
        "lr": 1e-3,
        "inf": math.inf,
        "rng": torch.random.get_rng_state(),  # uint8
        "bf16": torch.randn(2, 3).to(torch.bfloat16),
        "scalar": torch.tensor(7.0),
        "view": shared[2:4],  # a view: stored as its own values
        "same": [shared, shared],  # one tensor twice: stored once
        "reshaped": shared.view(2, 3),  # another tensor over the same storage: stored as a copy
        "betas": (0.9, 0.95),
        "optimizer": {"state": {0: {"exp_avg": torch.ones(2)}}, "param_groups": [{"params": [0], "lr": 0.1}]},
        "$odd": {"$tensor": "not a tag"},  # keys that look like tags stay data
    }
    save_state(tmp_path / "s", state)
    back = load_state(tmp_path / "s")
    assert back.keys() == state.keys()
    for key in ("step", "flag", "none", "lr", "inf", "betas", "$odd"):
        assert back[key] == state[key] and type(back[key]) is type(state[key]), key
    for key in ("rng", "bf16", "scalar", "view", "reshaped"):
        assert back[key].dtype == state[key].dtype and torch.equal(back[key], state[key]), key
    assert torch.equal(back["same"][0], shared) and back["same"][0] is back["same"][1]
    assert list(back["optimizer"]["state"]) == [0]  # an int key stays an int
    assert torch.equal(back["optimizer"]["state"][0]["exp_avg"], torch.ones(2))
    nan = load_state(save_state(tmp_path / "n", {"x": math.nan})[0].with_suffix(""))["x"]
    assert math.isnan(nan)


def test_state_files_refuse_objects(tmp_path: Path) -> None:
    with pytest.raises(StateFileError, match=r"extra_state\['scheduler'\]\[0\] is a .*_Payload.*never pickled"):
        save_state(tmp_path / "s", {"scheduler": [_Payload(tmp_path / "m")]}, name="extra_state")
    (tmp_path / "t.json").write_text('{"format": "goldfish-state", "version": 1, "state": {"$tensor": "0"}}')
    (tmp_path / "t.safetensors").write_bytes(crafted_pickle(tmp_path / "MARKER"))
    with pytest.raises(StateFileError, match="corrupt or truncated"):
        load_state(tmp_path / "t")
    assert not (tmp_path / "MARKER").exists()
