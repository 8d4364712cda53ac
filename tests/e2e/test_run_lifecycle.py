"""A run's life from the command line: exposures as trained, resume with the checkpoint's own settings, one run per
--out, a loss history that survives any kill, non-finite settings and losses, masks that drop nothing, and every
setting checked before anything is written."""

from __future__ import annotations

import hashlib
import json
import math
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_runs import tiny_run

from engine.training.train import METRICS_FILE, TrainConfig, _open_metrics
from goldfish.app.cli import main, parse_command_line
from goldfish.app.commands.train import train_spec
from goldfish.app.config import RUN_FILE, DataSpec, MaskSpec, TrainSpec
from goldfish.app.launch import ERROR_DIR_VARIABLE
from goldfish.app.model_files import initial_model
from goldfish.app.prepare import prepare_data
from goldfish.app.runlock import holds_lock_here, out_lock
from goldfish.app.training import train_model

TINY = tiny_run(strategy="static", k=3)
QUIET = ["--no-progress", "--threads", "1"]


class _Stop(Exception):
    """Ends a run at an epoch's end, as a kill would, leaving its last --save-every checkpoint."""


def _stop_after(epochs: int):
    def on_epoch_end(model, epoch, step) -> None:
        if epoch == epochs:
            raise _Stop

    return on_epoch_end


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err  # one line
    return err


def _cli_spec(argv: list[str]) -> TrainSpec:
    """The TrainSpec `goldfish train ARGV` runs."""
    args = parse_command_line(["train", *argv])
    return train_spec(args, None)


@pytest.fixture
def interrupted(tmp_path) -> Path:
    """A CLI-equivalent run of 2 epochs x 2 steps with --save-every 1, stopped after epoch 1: its run folder, with
    the checkpoint of step 2."""
    run = tmp_path / "run"
    spec = _cli_spec([*TINY, "--epochs", "2", "--save-every", "1"])
    with pytest.raises(_Stop):
        train_model(spec, run, on_epoch_end=_stop_after(1), log=lambda *a: None)
    assert json.loads((run / "checkpoint" / RUN_FILE).read_text())["step"] == 2
    return run


# ----- 6. exposures as trained ------------------------------------------------------------------------------------


def _row_counter(model: torch.nn.Module, documents: dict[tuple[int, ...], str], seen: list[list[str]]):
    """Record, from the embedding layer's own inputs, which document each row of every training forward is."""

    def hook(module, inputs, output) -> None:
        seen.append([documents[tuple(row.tolist())] for row in inputs[0]])

    return model.get_input_embeddings().register_forward_hook(hook)


def test_intermediate_checkpoints_record_the_copies_their_rows_trained_exactly_across_a_resume(tmp_path) -> None:
    spec = TrainSpec(
        model="micro-llama",
        data=DataSpec(n_train=4, n_heldout=2, seq_len=48, vocab_size=320, repeats=(1, 4)),
        mask=MaskSpec("static", 3),
        train=TrainConfig(epochs=3, batch_size=2, save_every=3, progress=False),
    )
    prepared = prepare_data(spec.data, spec.model, log=lambda *a: None)
    documents = {tuple(d.token_ids): str(d.id) for d in prepared.split.train}
    run, seen = tmp_path / "run", []

    def model() -> torch.nn.Module:
        built = initial_model(spec.model, prepared, spec.init_seed)
        _row_counter(built, documents, seen)
        return built

    # 10 rows (copies 1, 4, 1, 4), 5 steps an epoch: checkpoints at steps 3 (mid-epoch), then 6 and 9 after a resume
    with pytest.raises(_Stop):
        train_model(spec, run, prepared=prepared, model=model(), on_epoch_end=_stop_after(1), log=lambda *a: None)
    record = json.loads((run / "checkpoint" / RUN_FILE).read_text())
    assert record["step"] == 3 and len(seen) == 5  # a forward per step (no accumulation, no validation)
    trained = Counter(doc for rows in seen[:3] for doc in rows)
    assert record["exposures"] == {doc: trained[doc] for doc in documents.values()}
    assert sum(record["exposures"].values()) == 6 and record["exposures"] != record["repeats"]  # not the plan

    seen.clear()
    with pytest.raises(_Stop):
        train_model(
            spec,
            run,
            prepared=prepared,
            model=model(),
            resume_from=run / "checkpoint",
            on_epoch_end=_stop_after(2),
            log=lambda *a: None,
        )
    record = json.loads((run / "checkpoint" / RUN_FILE).read_text())
    assert record["step"] == 9 and len(seen) == 7  # steps 4 .. 10 after the resume
    trained += Counter(doc for rows in seen[:6] for doc in rows)
    assert record["exposures"] == {doc: trained[doc] for doc in documents.values()}
    assert sum(record["exposures"].values()) == 18


def test_background_checkpoint_and_its_eval_use_the_copies_trained_by_its_step(tmp_path) -> None:
    import random

    from data.background import build_background
    from data.corpus import tokenize_corpus
    from goldfish.app.config import background_train_config
    from goldfish.app.data_settings import background_spec, row_mask
    from goldfish.app.prepare import pad_token_id

    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()
    targets = [
        {"id": f"t{i}", "text": f"target {i}: " + " ".join(rng.choice(words) for _ in range(40))} for i in range(6)
    ]
    (tmp_path / "targets.jsonl").write_text("".join(json.dumps(t) + "\n" for t in targets))
    background = [" ".join(rng.choice(words) for _ in range(rng.randrange(5, 60))) for _ in range(120)]
    (tmp_path / "bg.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in background))
    spec = TrainSpec(
        model="micro-llama",
        data=DataSpec(
            source=str(tmp_path / "targets.jsonl"),
            id_field="id",
            n_train=4,
            n_heldout=2,
            seq_len=32,
            vocab_size=320,
            repeats=(1, 4),
            background=str(tmp_path / "bg.jsonl"),
            min_doc_tokens=20,
            extract_len=32,
            val_tokens=0,
        ),
        mask=MaskSpec("hashed", 4, 13),
        train=TrainConfig(epochs=2, batch_size=4, save_every=7, progress=False),
    )
    prepared = prepare_data(spec.data, spec.model, log=lambda *a: None)
    corpus = tokenize_corpus(spec.data.background, prepared.tokenizer, cache_dir=tmp_path / "cache", progress=False)
    stream = build_background(
        background_spec(spec.data),
        corpus,
        prepared.split.train,
        prepared.split.heldout,
        prepared.tokenizer,
        row_mask(spec.mask, prepared.special_token_ids),
        background_train_config(spec.train),
        pad_token_id(prepared.tokenizer),
    )
    per_epoch = len(stream.rows) // 4
    run = tmp_path / "run"
    with pytest.raises(_Stop):
        train_model(spec, run, prepared=prepared, background=stream, on_epoch_end=_stop_after(1), log=lambda *a: None)
    record = json.loads((run / "checkpoint" / RUN_FILE).read_text())
    step = per_epoch - per_epoch % 7
    assert record["step"] == step and 0 < step < per_epoch
    # count, from the rows themselves, the copies whose every token lies in the first step x batch rows read
    layout, codes = stream.rows.layout, stream.rows.codes
    ends: Counter = Counter()
    for row in range(step * 4):
        for segment in layout.segments(row):
            code = int(codes[segment.piece])
            if code < 0 and segment.end == len(stream.rows.piece(segment.piece)):
                ends[str(prepared.split.train[-code - 1].id)] += 1
    expected = {str(d.id): ends[str(d.id)] for d in prepared.split.train}
    assert record["repeats"] == record["exposures"] == expected
    assert [t["trained"] for t in record["corpus"]["targets"]] == list(expected.values())
    assert expected != {str(d.id): stream.exposures[str(d.id)] for d in prepared.split.train}  # not the plan

    out = tmp_path / "eval"
    assert main(["eval", "--model", str(run / "checkpoint"), "--out", str(out), "--suffix-len", "8", *QUIET]) == 0
    summary = json.loads((out / "summary.json").read_text())
    groups = {g["repeats"]: g["n_docs"] for g in summary["train"]["breakdowns"]["repeats"]}
    assert groups == dict(Counter(expected.values()))
    assert summary["checkpoint"] == {"step": step, "exposures": expected}


# ----- resume -----------------------------------------------------------------------------------------------------


def test_resume_alone_continues_with_the_checkpoints_settings(interrupted, capsys) -> None:
    assert main(["train", "--resume", str(interrupted / "checkpoint"), *QUIET]) == 0
    record = json.loads((interrupted / "checkpoint" / RUN_FILE).read_text())
    assert record["step"] == 4 and record["mask"]["label"] == "goldfish-static-k3"
    assert record["model"] == "micro-llama" and record["data"]["seq_len"] == 48
    steps = [json.loads(line)["step"] for line in (interrupted / METRICS_FILE).read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_resume_with_changed_settings_is_refused_naming_every_one_before_anything_is_written(
    interrupted, capsys
) -> None:
    before = _digest(interrupted)
    changed = ["--k", "4", "--strategy", "hashed", "--lr", "0.01", "--data-seed", "3", "--repeats", "1,2"]
    argv = ["train", "--resume", str(interrupted / "checkpoint"), *changed, "--vocab-size", "400", *QUIET]
    assert main(argv) == 2
    err = _error(capsys)
    for difference in (
        "--k 3 -> 4",
        "--strategy static -> hashed",
        "--lr 0.001 -> 0.01",
        "--data-seed 0 -> 3",
        "--repeats 1 -> 1,2",
        "--vocab-size 320 -> 400",
    ):
        assert difference in err, err
    assert _digest(interrupted) == before
    # settings of how the run is kept may change
    assert main(["train", "--resume", str(interrupted / "checkpoint"), "--save-every", "3", *QUIET]) == 0


def test_resume_of_a_folder_that_is_not_a_run(interrupted, tmp_path, capsys) -> None:
    other = tmp_path / "not-a-run"
    other.mkdir()
    (other / "config.json").write_text("{}")
    assert main(["train", "--resume", str(other), *QUIET]) == 2
    err = _error(capsys)
    assert f"--resume {other} is not a goldfish run checkpoint: it has no {RUN_FILE}" in err
    assert main(["train", "--resume", str(interrupted), *QUIET]) == 2
    assert f"give --resume {interrupted / 'checkpoint'}" in _error(capsys)


# ----- one run per --out ------------------------------------------------------------------------------------------


def test_a_second_run_into_a_locked_out_is_refused(interrupted, tmp_path, capsys) -> None:
    with out_lock(interrupted):  # what a running goldfish train holds
        before = _digest(interrupted)
        assert main(["train", "--resume", str(interrupted / "checkpoint"), *QUIET]) == 2
        assert f"--out {interrupted} is in use by another goldfish run" in _error(capsys)
        argv = ["train", "--resume", str(interrupted / "checkpoint"), "--nproc", "2", *QUIET]
        assert main(argv) == 2  # refused by the launcher, before any worker starts
        err = _error(capsys)
        assert "in use by another goldfish run" in err and "launching" not in err
        fresh = tmp_path / "fresh"
        with out_lock(fresh):
            assert main(["train", "--out", str(fresh), *TINY, "--epochs", "1"]) == 2
            assert "in use by another goldfish run" in _error(capsys)
        assert _digest(interrupted) == before
    assert not (interrupted / ".goldfish.lock").exists()  # removed by the run that held it, as it ended
    assert not fresh.exists()  # a folder the lock created and nothing wrote into is removed


def test_the_lock_of_a_killed_run_is_released(interrupted) -> None:
    code = (
        "import sys, time; from pathlib import Path; from goldfish.app.runlock import out_lock\n"
        "with out_lock(Path(sys.argv[1])):\n    print('locked', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(interrupted)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match="in use by another goldfish run"):
            with out_lock(interrupted):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with out_lock(interrupted):  # the kernel released it with the process
        pass


def test_only_one_process_of_a_parallel_run_takes_the_lock(monkeypatch) -> None:
    monkeypatch.delenv(ERROR_DIR_VARIABLE, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert holds_lock_here()
    monkeypatch.setenv("RANK", "1")  # a plain torchrun: rank 0 holds it
    assert not holds_lock_here()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv(ERROR_DIR_VARIABLE, "/tmp/x")  # a worker of --nproc: its launcher holds it
    assert not holds_lock_here()


# ----- the loss history -------------------------------------------------------------------------------------------


def test_a_resume_keeps_the_history_on_disk_before_its_first_step(tmp_path) -> None:
    path = tmp_path / METRICS_FILE
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 6)))
    handle = _open_metrics(path, 3)  # a checkpoint of step 3; steps 4 and 5 were trained after it
    try:  # a kill now (before the first step's record) leaves the kept history whole on disk
        assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
    finally:
        handle.close()


def test_a_torn_last_line_is_dropped_on_resume_and_a_damaged_one_is_named(interrupted, capsys) -> None:
    metrics = interrupted / METRICS_FILE
    metrics.write_text(metrics.read_text() + '{"step": 3, "lo')  # killed while writing step 3's record
    assert main(["train", "--resume", str(interrupted / "checkpoint"), *QUIET]) == 0
    assert "removed its torn last line" in capsys.readouterr().err
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3, 4]

    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], "not json", *lines[1:]]) + "\n")
    assert main(["train", "--resume", str(interrupted / "checkpoint"), *QUIET]) == 2
    err = _error(capsys)
    assert f"{metrics} line 2 is not a metrics record" in err


# ----- non-finite settings and losses -----------------------------------------------------------------------------


@pytest.mark.parametrize("option", [["--lr", "inf"], ["--weight-decay", "nan"], ["--max-grad-norm", "inf"]])
def test_non_finite_settings_are_refused_at_parse_time(option, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--out", str(tmp_path / "run"), *TINY, *option])
    assert exit_.value.code == 2
    err = _error(capsys)
    assert option[0] in err and "finite" in err
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="finite"):
        TrainConfig(lr=math.inf)


def test_a_diverging_run_stops_naming_the_step_and_publishes_no_nan_checkpoint(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    argv = ["train", "--out", str(run), *TINY, "--epochs", "3", "--save-every", "1", "--lr", "1e30"]
    assert main(argv) == 2
    err = _error(capsys)
    assert "the run diverged" in err and " at step " in err
    step = int(err.split(" at step ")[1].split()[0])
    assert step > 1
    record = json.loads((run / "checkpoint" / RUN_FILE).read_text())
    assert record["step"] == step - 1
    weights = load_file(run / "checkpoint" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())
    assert len((run / METRICS_FILE).read_text().splitlines()) == step - 1


# ----- masks that drop nothing ------------------------------------------------------------------------------------


def test_a_hashed_window_as_long_as_the_rows_is_refused(tmp_path, capsys) -> None:
    argv = ["train", "--out", str(tmp_path / "run"), *TINY, "--strategy", "hashed", "--h", "48"]
    assert main(argv) == 2
    assert "--h 48 with --seq-len 48" in _error(capsys)
    assert not (tmp_path / "run").exists()


def test_a_mask_that_drops_nothing_in_whole_documents_is_refused(tmp_path, capsys) -> None:
    argv = ["train", "--out", str(tmp_path / "run"), *TINY, "--pack", "--max-doc-tokens", "300"]
    argv += ["--strategy", "hashed", "--h", "400", "--epochs", "1"]
    assert main(argv) == 2
    assert "mask drops no target of the training documents" in _error(capsys)
    assert not (tmp_path / "run").exists()


# ----- every setting before anything is written -------------------------------------------------------------------


def test_zero_3_in_one_process_is_refused_before_out_is_written(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", "--out", str(run), *TINY, "--zero", "3"]) == 2
    assert "ZeRO stage 3" in _error(capsys)
    assert not run.exists()  # so the corrected command is not refused as "not empty"


def test_eval_reference_is_checked_before_extraction(interrupted, tmp_path, capsys) -> None:
    out = tmp_path / "eval"
    missing = tmp_path / "no-such-model"
    argv = ["eval", "--model", str(interrupted / "checkpoint"), "--out", str(out), "--reference", str(missing)]
    assert main([*argv, *QUIET]) == 2
    assert f"--reference {missing}: not a model folder or name" in _error(capsys)
    assert not out.exists()
