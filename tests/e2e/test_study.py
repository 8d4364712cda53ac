"""The repetition-bucket study end to end: `goldfish compare` with bucket 0, a k sweep, a random-mask baseline and two
seeds on a tiny model; the per-bucket tables, the tests between models, minimal pairs and the seed combination."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from statistics_recompute import check_one_seed, check_seeds, read_rows
from tiny_runs import random_words_background, tiny_run

from goldfish.app.cli import main


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("study")
    out = folder / "out"
    args = [
        "compare",
        *tiny_run(
            n_train=6,
            n_heldout=3,
            seq_len=64,
            batch_size=4,
            vocab_size=400,
            data="default-paragraphs",
            background=random_words_background(folder / "bg.jsonl"),
            repeats="0,1,4",
            min_doc_tokens=40,
            max_doc_tokens=300,
            extract_len=64,
            insert_window=True,
            prefix_len=16,
            suffix_len=16,
            prefix_lengths="8,24",
            max_steps=24,
            eval_every=3,
            val_tokens=512,
            bootstrap=50,
            masks=["hashed:2:4", "hashed:4:4", "random:4"],
            seeds="0,1",
            tuning_seeds="1,7",
        ),
        "--out",
        str(out),
    ]
    assert main(args) == 0
    return out


def test_every_bucket_has_its_targets_and_intervals(study: Path) -> None:
    summary = json.loads((study / "seed-0" / "summary.json").read_text())
    assert set(summary["buckets"]) == {
        "control",
        "standard",
        "goldfish-hashed-k2-h4",
        "goldfish-hashed-k4-h4",
        "goldfish-random-k4",
    }
    for result in summary["buckets"].values():
        table = result["extraction"]
        assert [(e["repeats"], e["n"]) for e in table] == [(0, 3), (1, 3), (4, 3)]
        for entry in table:
            low, high = entry["exact_match_ci"]
            assert 0 <= low <= entry["exact_match"] <= high <= 1
            assert entry["rouge_l_ci"] is not None and entry["suffix_logprob_mean"] < 0
        # membership per bucket: bucket-0 targets are the non-members of every trained bucket
        assert [(m["repeats"], m["n_members"], m["n_nonmembers"]) for m in result["membership"]] == [
            (1, 3, 3),
            (4, 3, 3),
        ]
        assert set(result["prefix_length"]) == {"8", "24"}
        assert set(result["recall_at_incorrect"]) == {"1", "10", "100"}
        assert result["pythia"] is None  # the split is 16/16, not Pythia's 32/32
    tests = summary["bucket_tests"]["models"]
    assert set(tests) == {"control", "goldfish-hashed-k2-h4", "goldfish-hashed-k4-h4", "goldfish-random-k4"}
    assert all(0 <= t["fisher_p"] <= 1 for table in tests.values() for t in table)


def test_models_are_minimal_pairs_and_seeds_differ(study: Path) -> None:
    """Within a seed every model trains on the same stream (schedule and positions); another seed moves them."""
    schedules = {}
    for seed in (0, 1):
        for label in ("standard", "goldfish-hashed-k2-h4", "goldfish-random-k4"):
            record = json.loads((study / f"seed-{seed}" / label / "run.json").read_text())
            schedules[seed, label] = (
                record["corpus"]["schedule_sha256"],
                [t["stream_offsets"] for t in record["corpus"]["targets"]],
                {t["id"]: t["inserted"] for t in record["corpus"]["targets"]},
            )
        assert (
            schedules[seed, "standard"]
            == schedules[seed, "goldfish-hashed-k2-h4"]
            == schedules[seed, "goldfish-random-k4"]
        )
    assert schedules[0, "standard"][0] != schedules[1, "standard"][0]
    assert schedules[0, "standard"][2] == schedules[1, "standard"][2]  # the buckets are the data seed's


def test_protocol_is_recorded_and_reported(study: Path) -> None:
    summary = json.loads((study / "seed-0" / "summary.json").read_text())
    corpus = summary["corpus"]
    assert corpus["buckets"]["n_per_bucket"] == {"1": 3, "4": 3, "0": 3}
    assert corpus["most_copies_in_a_row"] == 1
    assert 0 < corpus["target_share"] < 1
    assert corpus["target_tokens_trained"] == round(corpus["target_share"] * corpus["tokens_trained"])
    # --insert-window: every copy is the 64-token extraction window and an EOS, whatever the paragraph's length
    assert corpus["target_tokens_trained"] == 65 * sum(t["trained"] for t in corpus["targets"])
    goldfish = summary["models"]["goldfish-hashed-k4-h4"]["validation"]
    assert goldfish["n_rows"] == corpus["validation"]["n_rows"] and goldfish["loss_ci"][0] < goldfish["loss_ci"][1]
    assert goldfish["difference_ci"] is not None and "relative_difference" in goldfish
    heldout = summary["models"]["goldfish-hashed-k4-h4"]["heldout_loss"]
    assert heldout["n_docs"] == 3 and heldout["difference_ci"] is not None
    assert "## Utility: loss on the held-out documents" in (study / "seed-0" / "report.md").read_text()
    report = (study / "seed-0" / "report.md").read_text()
    assert "## Per repetition bucket" in report and "Clopper-Pearson" in report
    assert "difference to standard" in report
    # beside the validation table: the targets' share and the validation candidates left out as background twins
    removed = corpus["validation"]["removed_copies"]
    assert len(removed["documents"]) == removed["exact_text"] + removed["near"]
    beside = report.split("## Validation (held-out background)")[1].split("|")[0]
    assert f"Target copies are {100 * corpus['target_share']:.1f}% of the" in beside
    assert f"({removed['exact_text']} with the same normalized text, {removed['near']} held at least" in beside
    for figure in ("buckets.png", "k_sweep.png", "breakdown_repeats.png"):
        assert (study / "seed-0" / figure).stat().st_size > 0


def test_seeds_are_combined(study: Path) -> None:
    summary = json.loads((study / "summary.json").read_text())
    assert summary["seeds"] == [0, 1]
    standard = summary["combined"]["standard"]
    assert [(e["repeats"], e["n_targets"], e["n_seeds"]) for e in standard["buckets"]] == [
        (0, 3, 2),
        (1, 3, 2),
        (4, 3, 2),
    ]
    for entry in standard["buckets"]:
        assert len(entry["exact_match_per_seed"]) == 2
        # pooled over target-seed pairs with the targets as clusters; the exact bounds are never zero-wide
        assert entry["exact_match_pooled"]["n"] == 6 and entry["exact_match_pooled"]["exact_bounds"][1] > 0
        # the combined mean is the mean of the per-seed means (every seed has the same targets per bucket)
        assert entry["rouge_l"] == pytest.approx(sum(entry["rouge_l_per_seed"]) / 2)
    assert len(standard["validation"]["per_seed"]) == 2
    assert len(summary["combined"]["goldfish-hashed-k4-h4"]["validation"]["difference_per_seed"]) == 2
    report = (study / "report.md").read_text()
    assert "over seeds" in report and "seed-0/report.md" in report
    per_seed = summary["corpus_per_seed"]
    assert list(per_seed) == ["0", "1"] and all(0 < e["target_share"] < 1 for e in per_seed.values())
    assert "Validation candidates with a twin elsewhere in the background" in report.split("Validation loss")[1]
    assert (study / "buckets.png").stat().st_size > 0 and (study / "k_sweep.png").stat().st_size > 0


def test_per_target_rows_give_the_reported_statistics(study: Path) -> None:
    """Every seed's targets.jsonl and the combined one: one row per target and model (and seed), from which scipy and
    statsmodels give the paired tests, intervals and clustered statistics summary.json reports (issue 42)."""
    combined = read_rows(study / "targets.jsonl")
    per_seed = [read_rows(study / f"seed-{seed}" / "targets.jsonl") for seed in (0, 1)]
    assert combined == per_seed[0] + per_seed[1] and len(combined) == 2 * 5 * 9  # seeds x models x targets
    assert check_one_seed(study / "seed-0") == check_one_seed(study / "seed-1") == 4 * 3  # models x buckets
    assert check_seeds(study) == 5 * 3 + 4 * 3  # pooled (every model) and tests (against standard), per bucket
    assert "exact McNemar p" in (study / "seed-0" / "report.md").read_text()
    report = (study / "report.md").read_text()
    assert "sign-flip p" in report and "cluster bootstrap" in report and "Clopper-Pearson over targets" in report


def test_last_insertion_step_follows_the_stream_offsets(study: Path) -> None:
    """A target's last insertion step is the step that reads its last trained copy: rows of seq_len tokens read in
    stream order, batch_size rows a step, so a copy starting at stream token o is read at step o // seq_len //
    batch_size + 1 (counted from 1), or the next when it runs over the step's last row."""
    for seed in (0, 1):
        summary = json.loads((study / f"seed-{seed}" / "summary.json").read_text())
        seq_len, batch = summary["config"]["data"]["seq_len"], summary["config"]["train"]["batch_size"]
        corpus = summary["corpus"]
        assert summary["config"]["train"]["max_steps"] * batch <= corpus["n_rows"]  # within the first epoch
        rows = {r["id"]: r for r in read_rows(study / f"seed-{seed}" / "targets.jsonl") if r["model"] == "standard"}
        for target in corpus["targets"]:
            row = rows[target["id"]]
            assert (row["bucket"], row["copies"], row["seed"]) == (target["inserted"], target["trained"], seed)
            if target["trained"]:
                start = target["stream_offsets"][target["trained"] - 1] // seq_len // batch + 1
                assert row["last_insertion_step"] in (start, start + 1)
            else:
                assert row["last_insertion_step"] is None
        held = [r for r in rows.values() if r["bucket"] == 0]
        assert len(held) == 3 and all(r["copies"] == 0 and r["last_insertion_step"] is None for r in held)


def test_a_tuning_seed_is_flagged_as_exploratory(study: Path) -> None:
    """--tuning-seeds 1,7 with --seeds 0,1: seed 1 is named exploratory in the combined summary and report."""
    summary = json.loads((study / "summary.json").read_text())
    assert summary["tuning_seeds"] == [1, 7]
    assert summary["exploratory_seeds_run"] == [1] and summary["confirmatory_seeds_run"] == [0]
    assert any("seed(s) 1 were used to choose these settings" in w for w in summary["warnings"])
    report = (study / "report.md").read_text()
    assert "Confirmatory seeds (played no part in choosing the settings): 0" in report


def test_bad_study_settings_fail_in_one_line_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "never"
    for args, says in (
        (["--seeds", "1,1"], "--seeds lists a seed twice"),
        (["--seeds", "a"], "--seeds"),
        (["--repeats", "0,1", "--n-heldout", "0"], "--n-heldout"),
        (["--repeats", "0"], "at least one >= 1"),
    ):
        try:
            code = main(["compare", "--out", str(out), *args])
        except SystemExit as stop:  # argparse's own errors (a value it cannot parse) exit from the parser
            code = stop.code
        assert code == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and says in error[0], error
        assert not out.exists()
