"""What killed or failed checkpoint saves leave behind: staging folders of dead processes are removed by the next save,
a checkpoint set aside by a save killed between its two renames is found by every reader (eval, resume, the
engine's loaders), and a save that cannot write (a full disk, here a file size limit) is one line with exit 2 while
the previous checkpoint stays intact."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_llama
from tiny_runs import tiny_run

from engine.training.checkpoint import read_trainer_state, save_checkpoint
from engine.training.train import TrainConfig, make_optimizer
from goldfish.app.cli import main

TINY = tiny_run(epochs=1)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def dead_pid() -> int:
    """The id of a process that has exited."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def _save(directory: Path, step: int) -> None:
    model = tiny_llama(vocab=64, seed=step)
    save_checkpoint(
        directory,
        model,
        make_optimizer(model, TrainConfig()),
        None,
        extra_state={"step": step},
        save_model=lambda m, folder: m.save_pretrained(folder),
    )


def test_a_save_removes_what_killed_saves_of_dead_processes_left(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoint"
    _save(directory, 1)
    dead, alive = dead_pid(), os.getppid()  # pytest's parent runs while the test does
    for name in (f".checkpoint.partial-{dead}", f".checkpoint.partial-{alive}", f".checkpoint.old-{dead}"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"half written")
    _save(directory, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".checkpoint.partial-{alive}", "checkpoint"]
    assert read_trainer_state(directory)["step"] == 2


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    assert main(["train", "--out", str(out), *TINY]) == 0
    return out


def test_readers_find_a_checkpoint_set_aside_by_a_killed_replace(run: Path, capsys) -> None:
    """Killed between the two renames of a replace: OUT/checkpoint is absent, the complete previous checkpoint lies
    beside it as .checkpoint.old-PID. eval --model, eval --reference and the engine's read_trainer_state find it; a
    folder set aside by a process that still runs (in the middle of its replace) is left alone."""
    checkpoint = run / "checkpoint"
    other = run.parent / "other"  # an intact copy, the --model when the set-aside one is the --reference
    shutil.copytree(checkpoint, other)
    eval_options = ["--suffix-len", "16", "--bootstrap", "0", "--no-progress", "--threads", "1"]
    aside = run / f".checkpoint.old-{os.getppid()}"
    checkpoint.rename(aside)
    capsys.readouterr()
    assert main(["eval", "--model", str(checkpoint), "--out", str(run.parent / "e0"), *eval_options]) == 2
    assert aside.is_dir() and not checkpoint.exists()  # its owner may still be publishing
    aside.rename(checkpoint)

    for reader in ("eval --model", "eval --reference", "read_trainer_state"):
        aside = run / f".checkpoint.old-{dead_pid()}"
        checkpoint.rename(aside)
        if reader == "read_trainer_state":
            assert read_trainer_state(checkpoint)["step"] == 2
        else:
            model = checkpoint if reader == "eval --model" else other
            argv = ["eval", "--model", str(model), "--reference", str(checkpoint), *eval_options]
            assert main([*argv, "--out", str(run.parent / reader[-5:])]) == 0, capsys.readouterr().err
        assert checkpoint.is_dir() and not aside.exists(), reader


def test_a_full_disk_during_a_save_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """`goldfish train` whose files may not grow past 64 KiB (RLIMIT_FSIZE; Python ignores SIGXFSZ, so a write
    fails with EFBIG as it would with ENOSPC): the run's data and records fit, the checkpoint's model does not."""
    out = tmp_path / "run"
    limit = "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))"
    code = f"{limit}; import sys; from goldfish.app.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, "train", "--out", str(out), *TINY],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and lines[-1].startswith("goldfish train: error: "), done.stderr[-3000:]
    assert f"cannot write the checkpoint {out / 'checkpoint'}: File too large" in lines[-1]
    assert "Fix: raise the file size limit" in lines[-1]
    assert not (out / "checkpoint").exists() and not list(out.glob(".checkpoint.*"))  # nothing half-written left


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    """The serial layout: a save at step 1, then one at step 2 under the file size limit fails with one line and
    the step-1 checkpoint (weights and trainer state) is what the folder still holds."""
    directory = tmp_path / "checkpoint"
    script = textwrap.dedent(
        f"""
        import resource, sys
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]  # the test, its helpers
        from test_checkpoint_leftovers import _save
        from engine.training.checkpoint import CheckpointError
        _save({str(directory)!r}, 1)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        try:
            _save({str(directory)!r}, 2)
        except CheckpointError as error:
            print(error)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"cannot write the checkpoint {directory}: File too large"), done.stdout
    assert done.stdout.count("\n") == 1
    assert read_trainer_state(directory)["step"] == 1
    from transformers import LlamaForCausalLM

    saved = LlamaForCausalLM.from_pretrained(directory).state_dict()
    for key, value in tiny_llama(vocab=64, seed=1).state_dict().items():
        assert torch.equal(saved[key], value), key
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
