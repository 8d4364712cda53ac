"""`goldfish compare --matched-controls` end to end on a tiny background study: the exposure-matched row reads the
standard model at B * (k-1)/k copies, the loss-matched weights are the standard model's at the first validation step
whose loss reaches goldfish's final one (their validation loss recomputed from the kept snapshot equals the logged
one), and the compute-matched goldfish model trains k/(k-1) times the steps on every copy."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
from tiny_runs import random_words_background, tiny_run

from goldfish.app import matched
from goldfish.app.cli import main
from goldfish.app.config import MaskSpec
from goldfish.app.matched_section import LossMatched

STEPS = 24


def _study(folder: Path, out: Path, **options: object) -> list[str]:
    """The tiny background study with its matched controls: buckets 0, 3 and 4 (3 = 4 * 3/4, exposure-matched)."""
    settings: dict[str, object] = dict(
        n_train=6,
        n_heldout=3,
        seq_len=64,
        batch_size=4,
        vocab_size=400,
        data="default-paragraphs",
        background=random_words_background(folder / "bg.jsonl"),
        repeats="0,3,4",
        min_doc_tokens=40,
        max_doc_tokens=300,
        extract_len=64,
        insert_window=True,
        prefix_len=16,
        suffix_len=16,
        eval_every=3,
        val_tokens=512,
        matched_controls=True,
    )
    return ["compare", *tiny_run(**(settings | options)), "--out", str(out)]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("matched")
    out = folder / "out"
    argv = _study(folder, out, max_steps=STEPS, bootstrap=50, lr=3e-3, masks=["hashed:4:4", "random:4"], beams=2)
    assert main(argv) == 0
    return out


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.mark.slow  # one tiny study with its controls: about 15 s
def test_matched_rows_name_each_control(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    section = summary["matched_controls"]
    assert section["mask"] == "goldfish-hashed-k4-h4"
    rows = {(r["bucket"], r["control"]): r for r in section["rows"]}
    # k=4: the goldfish model at 4 copies supervises each kept token 4 times, 3/4 of the tokens: standard at 3
    assert rows[4, "exposure-matched"]["model"] == "standard" and rows[4, "exposure-matched"]["copies"] == 3
    assert rows[4, "goldfish"]["model"] == "goldfish-hashed-k4-h4"
    standard_table = {e["repeats"]: e for e in summary["buckets"]["standard"]["extraction"]}
    assert rows[4, "exposure-matched"]["exact_match_k"] == standard_table[3]["exact_match_k"]
    assert rows[4, "compute-matched"]["steps"] == math.ceil(STEPS * 4 / 3)
    assert "## Matched controls" in (run / "report.md").read_text()
    # --beams: the beam's output per bucket beside greedy's, for every model
    for label, result in summary["buckets"].items():
        assert [(e["repeats"], e["n"]) for e in result["beam"]] == [(0, 3), (3, 3), (4, 3)], label


@pytest.mark.slow  # one tiny study with its controls: about 15 s
def test_loss_matched_is_the_first_step_reaching_the_other_models_loss(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    loss_matched = summary["matched_controls"]["loss_matched"]
    curves = {
        label: [(r["step"], r["val_loss"]) for r in _metrics(run / label / "metrics.jsonl") if "val_loss" in r]
        for label in ("standard", "goldfish-hashed-k4-h4")
    }
    finals = {label: curve[-1][1] for label, curve in curves.items()}
    early = min(finals, key=lambda label: (finals[label], label != "standard"))
    other = next(label for label in finals if label != early)
    assert loss_matched["model"] == early
    assert loss_matched["target_loss"] == pytest.approx(finals[other])
    expected = next((step for step, loss in curves[early] if loss <= finals[other]), None)
    assert loss_matched["step"] == expected
    for label in finals:  # only the chosen snapshot stays
        kept = sorted(p.name for p in (run / label / matched.SNAPSHOT_FOLDER).iterdir())
        assert kept == ([f"step-{expected}"] if label == early else []), label
    # the lower model's own final step reaches the other's final loss, so some step always does
    assert expected is not None
    # the kept weights are the model at that step: the validation loss the comparison recomputes from the loaded
    # folder equals the one the training loop logged then
    logged = dict(curves[early])[expected]
    assert loss_matched["val_loss"] == pytest.approx(logged)
    assert loss_matched["label"] == early + matched.LOSS_MATCHED_SUFFIX
    recomputed = summary["models"][loss_matched["label"]]["validation"]["loss"]
    assert recomputed == pytest.approx(logged, rel=1e-6)
    for bucket, mean in loss_matched["mean_copies_trained"].items():  # fewer copies by then, never more
        assert 0 <= mean <= int(bucket)


def test_loss_matched_choice_takes_the_lower_model_early() -> None:
    class Curve:
        def __init__(self, losses: dict[int, float]) -> None:
            self.losses = losses

        def first_at_most(self, loss: float) -> int | None:
            return next((s for s in sorted(self.losses) if self.losses[s] <= loss), None)

    standard = Curve({10: 6.0, 20: 5.5, 30: 5.0})
    goldfish = Curve({10: 6.1, 20: 5.8, 30: 5.6})
    snaps = {"standard": standard, "g": goldfish}
    choose = functools.partial(matched.loss_matched_choice, standard="standard", of_steps=30)
    assert choose({"standard": 5.0, "g": 5.6}, snaps) == LossMatched("standard", 5.6, 20, 30)
    # goldfish ends lower (targets a large share of training): goldfish is taken at the standard model's final loss
    assert choose({"standard": 5.9, "g": 5.6}, snaps) == LossMatched("g", 5.9, 20, 30)
    missing = choose({"standard": None, "g": 5.6}, snaps)
    assert missing.step is None and missing.to_json() == {
        "model": None,
        "target_loss": None,
        "step": None,
        "of_steps": 30,
    }


@pytest.mark.slow  # one tiny study with its controls: about 15 s
def test_compute_matched_trains_longer_on_every_copy(run: Path) -> None:
    label = MaskSpec("hashed", 4, 4).label + matched.COMPUTE_MATCHED_SUFFIX
    record = json.loads((run / label / "run.json").read_text())
    assert record["train"]["max_steps"] == math.ceil(STEPS * 4 / 3)
    assert all(t["trained"] == t["inserted"] for t in record["corpus"]["targets"])
    summary = json.loads((run / "summary.json").read_text())
    compute = summary["matched_controls"]["compute_matched"]
    assert compute["reached"] == (compute["val_loss"] <= compute["standard_val_loss"])


def test_exposure_pairs() -> None:
    assert matched.exposure_pairs([0, 48, 64, 128], 4) == [(64, 48)]
    assert matched.exposure_pairs([0, 64, 192, 256], 4) == [(256, 192)]
    assert matched.exposure_pairs([0, 1, 4, 16, 64], 4) == []
    assert matched.compute_matched_steps(1024, 4) == 1366


def test_matched_controls_need_a_background(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["compare", *tiny_run(max_steps=4, eval_every=2, matched_controls=True), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--background" in err[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # a tiny two-seed study with its controls: about 30 s
def test_seeds_with_controls_combine(tmp_path: Path) -> None:
    """Under --seeds the loss-matched control can be another model per seed: the combination reports it per seed
    (never a KeyError: the shipped study's seeds took the standard model under some seeds and goldfish under others),
    and combines every model all seeds trained."""
    out = tmp_path / "out"
    argv = _study(tmp_path, out, max_steps=12, bootstrap=20, masks=["hashed:4:4"], seeds="0,1")
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["matched_controls_per_seed"]) == {"0", "1"}
    assert "goldfish-hashed-k4-h4-compute-matched" in summary["combined"]
    # combined: exactly the models every seed trained (a loss-matched label in one seed only stays per seed)
    every = set.intersection(*(set(models) for models in summary["per_seed"].values()))
    assert set(summary["combined"]) == every
    assert "## Matched controls, seed by seed" in (out / "report.md").read_text()
