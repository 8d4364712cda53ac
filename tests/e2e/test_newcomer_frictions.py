"""The frictions a new user met (issue 45), each reproduced by its old trigger: a missing extra is one line before
any work, Ctrl-C keeps a checkpoint and says how to resume, `goldfish plan` prints a command that can be pasted,
and notices the user cannot act on are not printed."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from tiny_runs import tiny_run

ROOT = Path(__file__).parents[2]
TINY = tiny_run()


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


# ----- goldfish plan's command ------------------------------------------------------------------------------------


def _planned(capsys, argv: list[str]) -> tuple[list[str], list[str]]:
    """`goldfish plan ARGV` (the torch-free path): (the lines it printed, the words of its last line)."""
    from goldfish.app.entry import main as goldfish

    assert goldfish(["plan", *argv, "--top", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    return lines, shlex.split(lines[-1])


def _train_args(words: list[str]) -> argparse.Namespace:
    """The words after `-m goldfish` (or `goldfish`), parsed by goldfish's own parser as `goldfish train`."""
    from goldfish.app.cli import build_parser

    start = words.index("goldfish") + 1
    assert words[start] == "train", words
    return build_parser().parse_args(words[start:])


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
