"""The frictions a new user met (issue 45), each reproduced by its old trigger: a missing extra is one line before
any work, Ctrl-C keeps a checkpoint and says how to resume, `goldfish plan` prints a command that can be pasted,
and notices the user cannot act on are not printed."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_runs import tiny_run

from goldfish.app import lora, prepare
from goldfish.app.cli import main

ROOT = Path(__file__).parents[2]
TINY = tiny_run()


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


# ----- a missing extra --------------------------------------------------------------------------------------------


@pytest.fixture
def without_peft(monkeypatch):
    """peft hidden as if it were not installed (`import peft` fails, find_spec finds nothing), and loading data
    made to fail loudly: the refusal must come before any work."""
    monkeypatch.setitem(sys.modules, "peft", None)

    def no_work(*args, **kwargs):
        raise AssertionError("the data were loaded before peft was checked")

    monkeypatch.setattr(prepare, "prepare_data", no_work)


@pytest.mark.parametrize("command", ["train", "compare"])
def test_lora_without_peft_is_one_line_before_any_work_with_an_install_line_that_works_anywhere(
    command, without_peft, tmp_path, capsys
) -> None:
    out = tmp_path / "run"
    assert main([command, "--out", str(out), *TINY, "--lora-rank", "4"]) == 2
    err = _one_line(capsys)
    assert err == (
        f"goldfish {command}: error: --lora-rank needs the peft package, which is not installed. Fix: pip install "
        "'peft>=0.21' (or leave --lora-rank out to train every weight)"
    )
    assert '-e ".[lora]"' not in err  # works only from the repository root
    assert not out.exists()


# ----- goldfish plan's command ------------------------------------------------------------------------------------


def _planned(capsys, argv: list[str]) -> tuple[list[str], list[str]]:
    """`goldfish plan ARGV` (the torch-free path): (the lines it printed, the words of its last line)."""
    from goldfish.app.entry import main as goldfish

    assert goldfish(["plan", *argv, "--top", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    return lines, shlex.split(lines[-1])


def _train_args(words: list[str]) -> argparse.Namespace:
    """The words after `-m goldfish` (or `goldfish`), parsed by goldfish's own parser as `goldfish train`."""
    from goldfish.app.cli import parse_command_line

    start = words.index("goldfish") + 1
    assert words[start] == "train", words
    return parse_command_line(words[start:])


def test_plan_ends_with_a_torchrun_command_that_parses_and_names_the_machine_it_assumed(capsys) -> None:
    from torch.distributed.run import get_args_parser

    lines, words = _planned(capsys, ["--model", "7B", "--gpus", "64"])
    assert "..." not in words and "processes)" not in lines[-1]
    launch = get_args_parser().parse_args(words[1:])  # torchrun's own parser: nodes, processes, the module
    assert words[0] == "torchrun" and launch.module and launch.training_script == "goldfish"
    assert (launch.nnodes, launch.nproc_per_node) == ("16", "4")  # 64 GPUs, 4 per perlmutter node
    assert launch.rdzv_endpoint == "$MASTER_ADDR:29500" and launch.rdzv_backend == "c10d"
    train = _train_args(words)
    assert train.model == "meta-llama/Llama-2-7b-hf" and train.out and train.grid and train.batch_size == 1024
    # the machine it assumed, named on a line of its own, outside the command
    assert "perlmutter, 4 GPUs of 40 GiB per node (assumed: no --profile was given" in lines[-3]
    assert "each of the 16 nodes, with MASTER_ADDR" in lines[-2]


def test_plan_commands_for_one_node_one_gpu_and_a_shape_without_weights(capsys) -> None:
    lines, words = _planned(capsys, ["--model", "8B", "--gpus", "8", "--profile", "frontier"])
    assert words[:4] == ["torchrun", "--standalone", "--nproc-per-node", "8"]
    assert _train_args(words).model == "meta-llama/Llama-3.1-8B"
    assert lines[-3] == "machine: frontier, 8 GPUs of 64 GiB per node"  # given, so not "assumed"
    lines, words = _planned(capsys, ["--model", "tinyllama-1.1b", "--gpus", "1", "--global-batch", "8"])
    assert words[:2] == ["goldfish", "train"] and _train_args(words).model == "tinyllama-1.1b"
    lines, words = _planned(capsys, ["--model", "40B", "--gpus", "64", "--global-batch", "64"])
    assert _train_args(words).model == "$MODEL" and '--model "$MODEL"' in lines[-1]  # left for the shell
    assert "GPT-40B is a shape of the AxoNN paper without published weights: set MODEL" in lines[-3]


# ----- Ctrl-C during goldfish train -------------------------------------------------------------------------------

SHORT = tiny_run(n_heldout=0, seq_len=32, vocab_size=300, epochs=100)  # 200 steps of a few ms


def _start_train(out: Path, *extra: str) -> subprocess.Popen:
    """`goldfish train` in a process of its own, as a terminal starts it: Ctrl-C (SIGINT) with its ordinary meaning
    whatever started the tests (a pytest in the background of a non-interactive shell ignores it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "goldfish", "train", "--out", str(out), *SHORT, *extra],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _ctrl_c_after(run: subprocess.Popen, metrics: Path, steps: int = 3) -> tuple[int, list[str]]:
    """Send SIGINT once `steps` steps are logged; (exit status, stderr lines)."""
    deadline = time.monotonic() + 300
    while not metrics.exists() or metrics.read_text().count("\n") < steps:
        if run.poll() is not None:
            pytest.fail(f"the run ended before it was interrupted: {run.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(run.pid, signal.SIGKILL)
            pytest.fail("no steps in 300 s")
        time.sleep(0.02)
    os.kill(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=300)
    return run.returncode, err.strip().splitlines()


def _resume_words(line: str, checkpoint: Path) -> list[str]:
    """The command the interrupted run's last line gives, checked to be exactly that line's end."""
    prefix = "goldfish train: interrupted after step "
    assert line.startswith(prefix) and f"(its checkpoint: {checkpoint}). Continue with: goldfish train " in line
    return shlex.split(line.split("Continue with: ", 1)[1])


def _steps(metrics: Path) -> list[int]:
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines()]


def test_ctrl_c_keeps_the_last_step_and_says_the_resume_command_that_works(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code, err = _ctrl_c_after(_start_train(out), out / "metrics.jsonl")
    assert code == 130, err
    assert "Traceback" not in "\n".join(err) and "KeyboardInterrupt" not in "\n".join(err), err
    assert err[-2].startswith("stopping after the step in progress"), err  # said at once
    words = _resume_words(err[-1], out / "checkpoint")
    step = json.loads((out / "checkpoint" / "goldfish_run.json").read_text())["step"]
    assert 3 <= step < 200 and err[-1].startswith(f"goldfish train: interrupted after step {step} ")
    assert _steps(out / "metrics.jsonl") == list(range(1, step + 1))  # the checkpoint holds every logged step
    assert not (out / ".goldfish.lock").exists()
    # the printed command, as printed (run here in-process: the same parser and code as the installed command)
    assert words[:4] == ["goldfish", "train", "--resume", str(out / "checkpoint")]
    assert main(words[1:]) == 0
    printed = capsys.readouterr().out
    assert f"resuming {out / 'checkpoint'} at step {step} of 200" in printed
    assert _steps(out / "metrics.jsonl") == list(range(1, 201))


@pytest.mark.slow
def test_ctrl_c_on_an_overwrite_run_keeps_the_old_run_and_resumes_into_its_place(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), *tiny_run(n_heldout=0, seq_len=32, vocab_size=300, epochs=1)]) == 0
    old = (out / "run.json").read_text()
    staging = tmp_path / ".run.overwrite-staging"
    code, err = _ctrl_c_after(_start_train(out, "--overwrite"), staging / "metrics.jsonl")
    assert code == 130 and (out / "run.json").read_text() == old, err  # the old run stays until the new one ends
    words = _resume_words(err[-1], staging / "checkpoint")
    assert main(words[1:]) == 0
    assert not staging.exists() and _steps(out / "metrics.jsonl") == list(range(1, 201))
    assert json.loads((out / "checkpoint" / "goldfish_run.json").read_text())["step"] == 200


def test_a_second_ctrl_c_stops_at_once() -> None:
    from goldfish.app.interrupt import ctrl_c_stops

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        with ctrl_c_stops(announce=False) as stop:
            assert not stop()
            os.kill(os.getpid(), signal.SIGINT)
            assert stop()  # the first asks the loop to stop after its step
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler runs here
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    finally:
        signal.signal(signal.SIGINT, previous)


# ----- notices the user cannot act on -----------------------------------------------------------------------------

NOTICES = ("were not sharded", "FutureWarning", "DeprecationWarning", "Traceback")


@pytest.mark.slow
def test_single_process_eval_and_resume_of_an_hf_folder_print_no_third_party_notice(tmp_path, capfd) -> None:
    """transformers' "layers were not sharded" notice came with every load of an HF folder in one process."""
    base, tuned = tmp_path / "base", tmp_path / "tuned"
    small = tiny_run(n_heldout=2, seq_len=32, vocab_size=300, batch_size=4)
    assert main(["train", "--out", str(base), *small, "--epochs", "1"]) == 0
    assert main(["train", "--out", str(tuned), *small, "--epochs", "1", "--model", str(base / "checkpoint")]) == 0
    capfd.readouterr()
    assert main(["train", "--resume", str(tuned / "checkpoint"), "--no-progress", "--threads", "1"]) == 0
    out, err = capfd.readouterr()
    assert "at step 1 of 1" in out and not [n for n in NOTICES if n in out + err], err
    evaluated = ["--out", str(tmp_path / "eval"), "--part", "train", "--suffix-len", "8", "--no-progress"]
    assert main(["eval", "--model", str(tuned / "checkpoint"), *evaluated, "--threads", "1"]) == 0
    out, err = capfd.readouterr()
    assert not [n for n in NOTICES if n in out + err], err


def test_lora_holds_back_peft_s_future_warning_only_where_it_wraps_the_model() -> None:
    pytest.importorskip("peft", reason="needs peft: pip install 'peft>=0.21'")
    import warnings

    from transformers import AutoModelForCausalLM, LlamaConfig

    from goldfish.app.lora import LoraSpec, apply_lora

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=32,
    )
    model = AutoModelForCausalLM.from_config(config)
    filters = list(warnings.filters)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_lora(model, LoraSpec(rank=2), seed=0)
        assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]
        warnings.warn("a FutureWarning of anyone else", FutureWarning)  # still shown: the filter is not global
    assert [str(w.message) for w in caught] == ["a FutureWarning of anyone else"]
    assert warnings.filters == filters


def test_the_install_line_pins_what_the_lora_extra_pins() -> None:
    pins = re.search(r"^lora = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert pins is not None and pins.group(1) == f'"{lora.PEFT_REQUIREMENT}"'
