"""`goldfish train --grid pipe=P`: two pipeline stages in two processes train as one process does, the consolidated
checkpoint is an ordinary HF folder with the serial run's weights, and the settings a pipeline cannot run are one line
(exit 2) before any worker starts.

Tolerance: float32 (eps 1.2e-7). The stages run one process's per-row operations on micro-batches of fewer rows, so
only the order of the sums over rows differs: a gradient sums 4 rows x 31 targets, so its relative difference stays
below ~124 * 6e-8 < 1e-5, and 4 SGD steps of lr 0.5 move the weights (of order 0.1) by at most ~1e-5 * 2 * 4 * 0.5
in absolute terms (the gradient norms here are about 3). A missing or doubled micro-batch changes a step's loss by
its share of the batch (a quarter or more).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_runs import tiny_run

from goldfish.app.cli import main

RUN = tiny_run(n_train=8, n_heldout=2, seq_len=32, vocab_size=320, batch_size=4, epochs=2) + [
    "--optimizer",
    "sgd",
    "--lr",
    "0.5",
]
LOGGED = {"rtol": 1e-5, "atol": 0.0}
WEIGHTS = {"rtol": 1e-4, "atol": 5e-5}


def _metrics(folder) -> torch.Tensor:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return torch.tensor(
        [[r["loss"], r["grad_norm"], r["n_tokens"], r.get("val_loss") or 0.0] for r in rows], dtype=torch.float64
    )


def _assert_same_weights(expected: Path, got: Path) -> None:
    """The two runs' final checkpoints hold the same tensors under the same names (float32: WEIGHTS)."""
    want = load_file(expected / "checkpoint" / "model.safetensors")
    have = load_file(got / "checkpoint" / "model.safetensors")
    assert have.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(have[key], value, **WEIGHTS, msg=lambda m: f"{key}: {m}")


def _background(path) -> str:
    """A small background corpus (jsonl) the targets are inserted into, with held-out rows for val_loss. Each
    document is its own random draw of words: shifted copies of one cycle would all be near twins of each other, and
    validation leaves out every document with a twin in the background."""
    words = "the a of to and in is it that was for on are with as his they be at one have this from".split()
    draws = [random.Random(i) for i in range(60)]
    lines = [json.dumps({"text": " ".join(rng.choice(words) for _ in range(120))}) for rng in draws]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_two_stage_pipeline_trains_as_one_process(tmp_path) -> None:
    """With targets inserted into a background corpus (its validation loss every 2 steps): the same losses, gradient
    norms, token counts, validation losses and exposures as one process, and an HF folder with its weights."""
    background = ["--background", _background(tmp_path / "bg.jsonl"), "--repeats", "1,2", "--eval-every", "2"]
    run = [*RUN, *background, "--max-steps", "4"]
    assert main(["train", "--out", str(tmp_path / "serial"), *run]) == 0
    assert main(["train", "--out", str(tmp_path / "pipe"), "--nproc", "2", "--grid", "pipe=2", *run]) == 0
    serial, pipe = _metrics(tmp_path / "serial"), _metrics(tmp_path / "pipe")
    assert len(serial) == 4 and serial[1, 3] > 0  # 4 steps, a validation loss at step 2
    torch.testing.assert_close(pipe, serial, **LOGGED)
    record = json.loads((tmp_path / "pipe" / "run.json").read_text())
    assert record["grid"]["pipe"] == 2
    trained = [
        json.loads((tmp_path / name / "checkpoint" / "goldfish_run.json").read_text()) for name in ("serial", "pipe")
    ]
    assert trained[0]["exposures"] == trained[1]["exposures"] and trained[0]["exposures"]

    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "pipe" / "checkpoint")  # plain transformers
    expected = load_file(tmp_path / "serial" / "checkpoint" / "model.safetensors")
    state = loaded.state_dict()
    assert set(expected) <= set(state)
    for key, value in expected.items():
        torch.testing.assert_close(state[key], value, **WEIGHTS, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize(
    "command, settings, expected",
    [
        ("train", ["--grid", "pipe=2", "--microbatches", "3"], "do not split into --microbatches 3"),
        ("train", ["--grid", "pipe=2", "--pipe-schedule", "1f1b", "--microbatches", "1"], "as many micro-batches"),
        ("train", ["--grid", "pipe=2", "--pipe-virtual", "2"], "1f1b runs one stage per rank, not 2"),
        (
            "train",
            ["--grid", "pipe=2", "--pipe-schedule", "interleaved-1f1b", "--pipe-virtual", "2"],
            "4 pipeline stages for 2 decoder layers",
        ),
        ("train", ["--grid", "pipe=2", "--pipe-split", "5"], "--pipe-split 5: give 1 increasing decoder-layer"),
        ("train", ["--grid", "pipe=2", "--model", "tiny-gpt2"], "needs a model with tie_word_embeddings false"),
        (
            "train",
            ["--grid", "pipe=2,data=2", "--pipe-schedule", "zero-bubble", "--zero", "3"],
            "zero-bubble with --zero 3 is not supported",
        ),
        (
            "train",
            ["--grid", "pipe=2", "--pipe-schedule", "zero-bubble", "--activation-checkpointing"],
            "zero-bubble with --activation-checkpointing is not supported",
        ),
    ],
)
def test_settings_a_pipeline_cannot_run_fail_in_the_launcher(command, settings, expected, tmp_path, capsys) -> None:
    nproc = "4" if any("data=2" in setting for setting in settings) else "2"
    argv = [command, "--out", str(tmp_path / "run"), "--nproc", nproc, *RUN, *settings]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "launching" not in err, err
    assert err.startswith(f"goldfish {command}: error: ") and expected in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "settings, expected",
    [
        (["--grid", "pipe=2,x=2", "--nproc", "4"], "evaluation on a pipe grid runs on pipe and data axes only"),
        (["--grid", "pipe=2", "--nproc", "2", "--model", "tiny-gpt2"], "needs a model with tie_word_embeddings"),
    ],
)
def test_what_eval_cannot_run_on_a_pipe_grid_is_one_line(settings, expected, tmp_path, capsys) -> None:
    argv = ["eval", "--model", "micro-llama", "--out", str(tmp_path / "eval"), *settings]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "launching" not in err, err
    assert err.startswith("goldfish eval: error: ") and expected in err, err
    assert not (tmp_path / "eval").exists()


def _flat(value, key=""):
    """(dotted key, leaf) pairs of a JSON value."""
    if isinstance(value, dict):
        return [pair for k, v in value.items() for pair in _flat(v, f"{key}.{k}")]
    if isinstance(value, list):
        return [pair for i, v in enumerate(value) for pair in _flat(v, f"{key}[{i}]")]
    return [(key, value)]


def _assert_same_outputs(expected: Path, got: Path, *, rel: float, grad_norm_rel: float) -> int:
    """Every JSON and JSON-lines file under `expected` exists under `got` with the same keys and values: floats within
    `rel` relative (gradient norms within `grad_norm_rel`), every other value equal. Left out: seconds, the grid,
    the run records and the training logs (their grid, bytes and speeds; test_a_two_stage_pipeline_trains_as_one_process
    compares the losses) and the checkpoints' files (a grid's holds its DCP record). Returns the values compared."""

    def results(folder: Path) -> list[Path]:
        paths = (p.relative_to(folder) for p in folder.rglob("*.json*"))
        return sorted(p for p in paths if "checkpoint" not in p.parts and p.name not in RUN_DEPENDENT_FILES)

    files = results(expected)
    assert files == results(got)
    compared = 0
    for name in files:
        texts = [(folder / name).read_text() for folder in (expected, got)]
        if name.suffix == ".json":
            values = [dict(_flat(json.loads(text))) for text in texts]
        else:
            values = [dict(_flat([json.loads(line) for line in text.splitlines()])) for text in texts]
        want, have = ({k: v for k, v in found.items() if not _run_dependent(k)} for found in values)
        assert have.keys() == want.keys(), name
        for key, value in want.items():
            tolerance = grad_norm_rel if "grad_norm" in key else rel
            if isinstance(value, float) and tolerance:
                assert have[key] == pytest.approx(value, rel=tolerance, abs=0), (name, key)
            else:
                assert have[key] == value, (name, key)
            compared += 1
    return compared


RUN_DEPENDENT_FILES = ("metrics.jsonl", "run.json")


def _run_dependent(key: str) -> bool:
    """Whether a summary key holds what differs between two runs of one evaluation: seconds, and the grid."""
    return key == ".grid" or key.startswith(".grid.") or ".timings_s." in key


@pytest.mark.slow
def test_eval_on_a_pipe_grid_equals_one_process(tmp_path) -> None:
    """`goldfish eval --grid pipe=2` (each rank holding one stage) writes one process's summary and per-document rows
    for a trained checkpoint: the same generated ids (greedy, beams, samples), accuracies, log-probabilities and
    membership scores, equal
    floats (the stages run one process's operations on the same shapes), except the gradient norms, within 1e-6
    relative (tests/parallel/test_pipeline_eval.py says why)."""
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *tiny_run(n_train=4, n_heldout=2, seq_len=32, epochs=3)]) == 0
    options = ["--model", str(run / "checkpoint"), "--suffix-len", "8", "--prefix-lengths", "8,16"]
    options += ["--beams", "2", "--samples", "2"]
    assert main(["eval", "--out", str(tmp_path / "serial"), *options]) == 0
    assert main(["eval", "--out", str(tmp_path / "pipe"), "--nproc", "2", "--grid", "pipe=2", *options]) == 0
    compared = _assert_same_outputs(tmp_path / "serial", tmp_path / "pipe", rel=0.0, grad_norm_rel=1e-6)
    assert compared > 200 and json.loads((tmp_path / "pipe" / "summary.json").read_text())["grid"]["pipe"] == 2


@pytest.mark.parametrize("grid", ["data=2", "pipe=2"])
def test_lora_on_a_data_or_pipe_grid_trains_as_one_process(grid, tmp_path) -> None:
    """LoRA adapters (peft wraps the decoder's Linears, which a grid without x, y and z leaves unsharded) on data=2
    and on two pipeline stages: one process's losses and merged weights."""
    pytest.importorskip("peft", reason="needs the lora extra: pip install -e '.[lora]'")
    run = [*RUN, "--lora-rank", "4", "--max-steps", "2"]
    assert main(["train", "--out", str(tmp_path / "serial"), *run]) == 0
    assert main(["train", "--out", str(tmp_path / "grid"), "--nproc", "2", "--grid", grid, *run]) == 0
    torch.testing.assert_close(_metrics(tmp_path / "grid"), _metrics(tmp_path / "serial"), **LOGGED)
    _assert_same_weights(tmp_path / "serial", tmp_path / "grid")


@pytest.mark.slow
def test_compare_on_a_pipe_grid_equals_one_process(tmp_path) -> None:
    """`goldfish compare --grid pipe=2`: both models trained through two stages, their curves measured by the
    epoch-end hook (inside Pipeline.whole_model, while checkpoints are written) and their checkpoints evaluated,
    give one process's summary and rows: ids, counts and exact matches equal, every float within 1e-4 relative (the
    tolerance of the trained weights above: the stages sum a gradient's rows in another order, and log-probabilities,
    margins and losses follow the weights)."""
    run = [*RUN, "--max-steps", "4", "--curve-every", "1", "--suffix-len", "8"]
    assert main(["compare", "--out", str(tmp_path / "serial"), *run]) == 0
    assert main(["compare", "--out", str(tmp_path / "pipe"), "--nproc", "2", "--grid", "pipe=2", *run]) == 0
    compared = _assert_same_outputs(tmp_path / "serial", tmp_path / "pipe", rel=1e-4, grad_norm_rel=1e-4)
    summary = json.loads((tmp_path / "pipe" / "summary.json").read_text())
    assert compared > 1000 and summary["grid"]["pipe"] == 2 and len(summary["curves"]["standard"]) > 2


@pytest.mark.slow
@pytest.mark.parametrize("grid, nproc", [("pipe=2", "2"), ("pipe=2,x=2", "4")])
def test_a_pipe_run_from_a_folder_builds_only_its_stages(grid, nproc, tmp_path, capfd) -> None:
    """`goldfish train --grid pipe=2 --model FOLDER` (fine-tuning a saved model), and with x=2 inside each stage
    (its sharding verified on a miniature): each rank builds and reads only its own stages (engine.load_sharded(pipe=
    ...), tests/parallel/test_pipeline_training.py counts the tensors read) and says so, and the run trains as one
    process from the same folder (float32: the tolerances above)."""
    base = tmp_path / "base"
    assert main(["train", "--out", str(base), *tiny_run(n_train=4, n_heldout=2, seq_len=32, epochs=1)]) == 0
    run = tiny_run(model=str(base / "checkpoint"), n_train=8, n_heldout=2, seq_len=32, batch_size=4, max_steps=2)
    run += ["--optimizer", "sgd", "--lr", "0.5"]
    assert main(["train", "--out", str(tmp_path / "serial"), *run]) == 0
    capfd.readouterr()
    assert main(["train", "--out", str(tmp_path / "pipe"), "--nproc", nproc, "--grid", grid, *run]) == 0
    out = capfd.readouterr().out
    assert out.count("model: each pipe rank built and read only its own stages' weights from ") == 1, out
    serial, pipe = _metrics(tmp_path / "serial"), _metrics(tmp_path / "pipe")
    assert len(serial) == 2
    torch.testing.assert_close(pipe, serial, **LOGGED)
    _assert_same_weights(tmp_path / "serial", tmp_path / "pipe")


@pytest.mark.slow
def test_a_pipe_resume_reads_only_its_stages_from_the_checkpoint(tmp_path, capfd) -> None:
    """`goldfish train --resume CHECKPOINT --grid pipe=2` of a run stopped after its first epoch: each rank builds and
    reads only its own stages from the checkpoint's folder (and says so), and the resumed run ends with the losses
    and weights of the same checkpoint resumed on one process (float32: the tolerances above)."""
    import shutil

    from goldfish.app.cli import parse_command_line
    from goldfish.app.commands.train import train_spec
    from goldfish.app.training import train_model

    class Stop(Exception):
        pass

    def stop_after_first_epoch(model, epoch, step) -> None:
        if epoch == 1:
            raise Stop

    argv = [*tiny_run(n_train=8, n_heldout=2, seq_len=32, batch_size=4, epochs=2), "--save-every", "1"]
    spec = train_spec(parse_command_line(["train", *argv, "--optimizer", "sgd", "--lr", "0.5"]), None)
    with pytest.raises(Stop):
        train_model(spec, tmp_path / "serial", on_epoch_end=stop_after_first_epoch, log=lambda *a: None)
    shutil.copytree(tmp_path / "serial", tmp_path / "pipe")
    quiet = ["--no-progress", "--threads", "1"]
    assert main(["train", "--resume", str(tmp_path / "serial" / "checkpoint"), *quiet]) == 0
    capfd.readouterr()
    resumed = ["train", "--resume", str(tmp_path / "pipe" / "checkpoint"), "--nproc", "2", "--grid", "pipe=2"]
    assert main([*resumed, *quiet]) == 0
    out = capfd.readouterr().out
    line = f"model: each pipe rank built and read only its own stages' weights from {tmp_path / 'pipe' / 'checkpoint'}"
    assert out.count(line) == 1, out
    serial, pipe = _metrics(tmp_path / "serial"), _metrics(tmp_path / "pipe")
    assert len(serial) == 4
    torch.testing.assert_close(pipe, serial, **LOGGED)
    _assert_same_weights(tmp_path / "serial", tmp_path / "pipe")


def _hub_cache_holding(folder: Path, repo: str, cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An HF hub cache under `cache` whose snapshot of `repo` is a copy of `folder`, read offline by this process and
    the workers it starts (environment, and huggingface_hub's constants, which it read at import); the snapshot."""
    import shutil

    import huggingface_hub.constants as hub

    revision = "0" * 40
    entry = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(folder, entry / "snapshots" / revision)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(revision)
    for name, value in {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    return entry / "snapshots" / revision


@pytest.mark.slow
def test_a_pipe_run_from_a_hub_name_reads_only_its_stages_from_the_snapshot(tmp_path, capfd, monkeypatch) -> None:
    """`goldfish train --grid pipe=2 --model ORG/NAME`: the hub model's snapshot in the HF cache (a cache written here,
    read offline) is the folder each rank reads only its own stages from (and says so), and the run trains as one
    process from that folder does (float32: the tolerances above)."""
    base = tmp_path / "base"
    assert main(["train", "--out", str(base), *tiny_run(n_train=4, n_heldout=2, seq_len=32, epochs=1)]) == 0
    snapshot = _hub_cache_holding(base / "checkpoint", "acme/tiny-goldfish", tmp_path / "hub", monkeypatch)
    settings = {"n_train": 8, "n_heldout": 2, "seq_len": 32, "batch_size": 4, "max_steps": 2, "lr": "0.5"}
    serial = tiny_run(model=str(snapshot), optimizer="sgd", **settings)
    assert main(["train", "--out", str(tmp_path / "serial"), *serial]) == 0
    capfd.readouterr()
    hub = tiny_run(model="acme/tiny-goldfish", optimizer="sgd", **settings)
    assert main(["train", "--out", str(tmp_path / "pipe"), "--nproc", "2", "--grid", "pipe=2", *hub]) == 0
    out = capfd.readouterr().out
    assert out.count(f"model: each pipe rank built and read only its own stages' weights from {snapshot}") == 1, out
    torch.testing.assert_close(_metrics(tmp_path / "pipe"), _metrics(tmp_path / "serial"), **LOGGED)
    _assert_same_weights(tmp_path / "serial", tmp_path / "pipe")
