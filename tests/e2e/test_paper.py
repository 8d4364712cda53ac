"""The goldfish paper's setting: `compare --preset paper` resolves to the paper's numbers and fails in one line without
the hub; `plan --preset paper` prints grids and the run's time; a miniature of the preset (same preset machinery,
micro-llama, local corpus) runs end to end; `compare --checkpoints` evaluates checkpoints trained elsewhere exactly
as compare evaluated them."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
import torch

import data
from goldfish.app import paper
from goldfish.app.cli import main, parse_command_line
from goldfish.app.commands.compare import compare_spec
from goldfish.app.models import TINY_MODELS, build_tiny_model
from goldfish.app.released import parse_checkpoints

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def test_paper_preset_is_the_papers_setting() -> None:
    spec = compare_spec(parse_command_line(["compare", "--preset", "paper"]), None)
    assert spec.model == "tinyllama-1.1b" and spec.data.tokenizer == paper.TOKENIZER
    assert [(m.strategy, m.k, m.h) for m in spec.masks] == [("hashed", k, 13) for k in (3, 4, 8, 32, 128)]
    assert (spec.data.source, spec.data.n_train, spec.data.repeats) == (paper.CANARIES, 2000, (50,))
    assert spec.data.background == paper.BACKGROUND and spec.data.background_streaming and spec.data.pack
    assert (spec.data.seq_len, spec.data.extraction_window, spec.extraction.suffix_len) == (2048, 2048, 50)
    train = spec.train
    assert (train.batch_size, train.lr, train.warmup_steps, train.schedule) == (1024, 4e-4, 1000, "cosine")
    assert (train.min_lr_ratio, train.weight_decay, train.max_grad_norm, train.precision) == (0.1, 0.1, 1.0, "bf16")
    assert train.max_steps == 9537 and train.max_steps * 1024 * 2048 >= 20e9 > (train.max_steps - 1) * 1024 * 2048
    # the model: TinyLlama-1.1B's published sizes at random init (built on the meta device: no 4.4 GB allocated)
    config = TINY_MODELS["tinyllama-1.1b"].make_config(32000, 2048)
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == 1_100_048_384
    assert (config.num_hidden_layers, config.num_key_value_heads, config.max_position_embeddings) == (22, 4, 2048)


def test_paper_preset_fails_at_once_in_one_line_without_the_hub(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: the hub is unreachable on any machine
    for name in paper.OFFLINE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "paper"
    started = time.perf_counter()
    assert main(["compare", "--preset", "paper", "--out", str(out)]) == 2
    assert time.perf_counter() - started < 20
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "127.0.0.1:9 cannot be reached" in error
    assert paper.CANARIES in error and paper.BACKGROUND in error and paper.TOKENIZER in error
    assert not out.exists()  # refused before anything is written
    assert main(["compare", "--checkpoints", "paper", "--out", str(out)]) == 2
    assert "tomg-group-umd/standard-loss-llama-1B" in capsys.readouterr().err


def test_plan_preset_prints_grids_and_the_papers_run_time(capsys) -> None:
    from goldfish.app.plan import main as plan_main

    assert plan_main(["--preset", "paper", "--top", "3"]) == 0
    printed = capsys.readouterr().out
    assert "TinyLlama-1.1B: 1.10B parameters, 128 GPUs on frontier" in printed and "1024 x 2048 tokens" in printed
    hours = [line for line in printed.splitlines() if line.startswith("the paper's run: 9,537 steps")]
    assert len(hours) == 1 and "for the 6 models goldfish compare trains" in hours[0]
    assert main(["plan", "--preset", "paper", "--gpus", "64", "--top", "1"]) == 0  # a typed option wins
    assert "64 GPUs on frontier" in capsys.readouterr().out


def test_checkpoints_option_reads_pairs_and_the_papers_names(capsys) -> None:
    released = parse_checkpoints("paper")
    assert released["control"] == "tomg-group-umd/control-llama-1B" and len(released) == 7
    assert released["goldfish-hashed-k32-h13"] == "tomg-group-umd/32-goldfish-loss-llama-1B"
    assert parse_checkpoints("a=x/y, b = z") == {"a": "x/y", "b": "z"}
    for bad in ("standard", "a=x,a=y", "=x"):
        assert main(["compare", "--checkpoints", bad, "--out", "unused"]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def miniature(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The paper preset at tiny widths: micro-llama, 4+2 canaries and a background of local JSON lines, a local
    tokenizer, 4 steps; trained once, in a worker process (--nproc 1) as on a cluster."""
    folder = tmp_path_factory.mktemp("paper")
    rng = random.Random(0)
    texts = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    canaries = [f"canary {i}: " + texts(80) for i in range(8)]
    background = [texts(rng.randrange(20, 200)) for _ in range(120)]
    for name, rows in (("canaries.jsonl", canaries), ("background.jsonl", background)):
        (folder / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    data.train_bpe_tokenizer(canaries + background, vocab_size=400).save_pretrained(folder / "tokenizer")
    shared = ["--tokenizer", str(folder / "tokenizer"), "--data", str(folder / "canaries.jsonl"), "--n-train", "4"]
    shared += ["--n-heldout", "2", "--seq-len", "64", "--extract-len", "64", "--max-steps", "4", "--bootstrap", "0"]
    shared += ["--precision", "fp32", "--no-progress", "--threads", "1"]
    argv = ["compare", "--preset", "paper", "--model", "micro-llama", "--background", str(folder / "background.jsonl")]
    argv += ["--batch-size", "4", "--eval-every", "2", "--val-tokens", "512", "--nproc", "1"]
    assert main(argv + shared + ["--out", str(folder / "trained")]) == 0
    return folder, shared


def test_paper_miniature_trains_every_mask_on_the_streamed_background(miniature) -> None:
    folder, _ = miniature
    summary = json.loads((folder / "trained" / "summary.json").read_text())
    labels = ["control", "standard"] + [f"goldfish-hashed-k{k}-h13" for k in (3, 4, 8, 32, 128)]
    assert list(summary["models"]) == labels
    config = summary["config"]
    assert config["data"]["background_streaming"] and config["data"]["repeats"] == [50]
    assert (config["train"]["lr"], config["train"]["schedule"], config["train"]["weight_decay"]) == (
        4e-4,
        "cosine",
        0.1,
    )
    assert config["extraction"]["suffix_len"] == 50
    assert all(summary["models"][label]["validation"]["loss"] > 0 for label in labels)


def test_checkpoints_are_evaluated_as_compare_evaluated_them(miniature, tmp_path) -> None:
    folder, shared = miniature
    trained = folder / "trained"
    # a stand-in for the released control: a model never trained on the canaries, saved as any HF folder is
    tokenizer = data.load_tokenizer(str(folder / "tokenizer"))
    control = build_tiny_model(
        "micro-llama",
        vocab_size=len(tokenizer),
        max_positions=64,
        seed=1,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    control.save_pretrained(tmp_path / "control")
    tokenizer.save_pretrained(tmp_path / "control")
    checkpoints = {
        "standard": trained / "standard" / "checkpoint",
        "goldfish-hashed-k3-h13": trained / "goldfish-hashed-k3-h13" / "checkpoint",
        "control": tmp_path / "control",
    }
    pairs = ",".join(f"{label}={path}" for label, path in checkpoints.items())
    out = tmp_path / "released"
    assert main(["compare", "--preset", "paper", "--checkpoints", pairs, "--out", str(out)] + shared) == 0
    before = json.loads((trained / "summary.json").read_text())
    after = json.loads((out / "summary.json").read_text())
    assert list(after["models"]) == ["control", "standard", "goldfish-hashed-k3-h13"]  # the control first
    assert after["checkpoints"] == {label: str(path) for label, path in sorted(checkpoints.items())}
    assert after["documents"] == before["documents"]  # the same canaries selected
    # the goldfish checkpoint: every figure as compare measured it (its mask read back from its run record)
    goldfish = "goldfish-hashed-k3-h13"
    assert after["models"][goldfish]["train"] == before["models"][goldfish]["train"]
    assert after["models"][goldfish]["heldout"] == before["models"][goldfish]["heldout"]
    files = [run / goldfish / "eval" / "train" / "extraction.jsonl" for run in (trained, out)]
    rows = [[json.loads(line) for line in file.read_text().splitlines()] for file in files]
    # per document the same generations and scores; "repeats" is what a run says of the training: the exposures the
    # compare run counted, the 50 copies --repeats claims of a checkpoint trained elsewhere
    assert [r.pop("repeats") for r in rows[1]] == [50] * 4
    assert [{k: v for k, v in r.items() if k != "repeats"} for r in rows[0]] == rows[1]
    standard = {k: v for k, v in after["models"]["standard"]["train"].items() if not k.startswith("tf_")}
    assert standard == {k: v for k, v in before["models"]["standard"]["train"].items() if not k.startswith("tf_")}
    # the control is the reference model of the others' reference-ratio attack
    assert "reference" in after["membership"]["standard"]["attacks"]
    assert "reference" not in after["membership"]["control"]["attacks"]
    assert after["repeats"] == dict.fromkeys(after["repeats"], 50)  # what --repeats says of the checkpoints
    report = (out / "report.md").read_text()
    assert f"Control: the checkpoint {tmp_path / 'control'}" in report and "nothing was trained by this run" in report
