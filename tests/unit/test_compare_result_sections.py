"""The typed buckets and matched-controls sections of a comparison (goldfish.app.bucket_section,
goldfish.app.matched_section): built typed by their writers with today's keys in order, read back from files of any
key order, a key they do not know refused, and the matched-controls table of a shipped seed rebuilt from its buckets
exactly."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from eval.extraction import ExtractionConfig
from goldfish.app import matched
from goldfish.app.bucket_section import MODEL_KEYS, BucketStats, ModelBuckets
from goldfish.app.buckets import bucket_results, with_bucket_intervals
from goldfish.app.compare_result import CompareResult
from goldfish.app.config import MaskSpec
from goldfish.app.matched_section import LossMatched, MatchedControls, MatchedRow
from goldfish.app.report_buckets import k_sweep_series

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
MECHANISM = RESULTS / "compare_corpus_mechanism" / "seed-11" / "summary.json"  # buckets, beams, matched controls
CORPUS = RESULTS / "compare_corpus" / "seed-0" / "summary.json"  # buckets without beams


def _row(doc: str, exact: bool, rouge: float, **extra: object) -> dict:
    return {"id": doc, "exact_match": exact, "rouge_l": rouge, "match_fraction": float(exact), **extra}


ROWS = [
    _row("a", True, 1.0, generated_logprob_mean=-0.1),
    _row("b", False, 0.4, generated_logprob_mean=-2.0),
    _row("c", True, 1.0, generated_logprob_mean=-0.3),
    _row("h1", False, 0.2, generated_logprob_mean=-3.0),
    _row("h2", False, 0.1, generated_logprob_mean=-4.0),
]
REPEATS = {"a": 4, "b": 4, "c": 1}  # h1, h2: held out (bucket 0)


def test_bucket_results_are_built_typed_with_todays_keys_in_order() -> None:
    beams = [_row(r["id"], r["exact_match"], r["rouge_l"]) for r in ROWS]
    prefixes = [_row(r["id"], r["exact_match"], r["rouge_l"], prefix_len=p) for r in ROWS for p in (8, 16)]
    built = bucket_results(
        ROWS, REPEATS, ExtractionConfig(prefix_len=32, suffix_len=32), prefix_rows=prefixes, n_resamples=20
    )
    assert isinstance(built, ModelBuckets) and built.beam is None and built.keys is None
    assert [b.repeats for b in built.extraction] == [0, 1, 4] and list(built.prefix_length) == ["8", "16"]
    top = built.bucket(4)
    assert top is not None and (top.k, top.n, top.rate) == (1, 2, 0.5) and built.bucket(2) is None
    assert top.interval("exact_match") == top.rate_ci and top.interval("rouge_l") == top.intervals["rouge_l"]
    assert built.pythia is not None and [t.memorized for t in built.pythia.table] == [0.0, 1.0, 0.5]
    assert built.recall_at_incorrect["1"].n_targets == 3 and built.membership == []
    summary = built.to_json()
    assert list(summary) == [key for key in MODEL_KEYS if key != "beam"]  # no beam rows, no "beam"
    assert ModelBuckets.from_json(summary).to_json() == summary
    with_beams = bucket_results(
        ROWS, REPEATS, ExtractionConfig(prefix_len=8, suffix_len=16), beam_rows=beams, n_resamples=0
    )
    assert list(with_beams.to_json()) == list(MODEL_KEYS) and with_beams.pythia is None  # not the 32/32 split
    assert with_beams.beam is not None and with_beams.beam[0].intervals["rouge_l"] is None  # no resamples


def test_shipped_bucket_sections_read_back_in_their_order_and_refuse_unknown_keys() -> None:
    for path in (MECHANISM, CORPUS):
        summary = json.loads(path.read_text())
        typed = CompareResult.from_json(summary)
        assert typed.buckets is not None
        for label, entry in summary["buckets"].items():
            model = typed.buckets[label]
            assert json.dumps(model.to_json()) == json.dumps(entry), (path, label)
            # built today (no keys recorded): the same dict in the same order
            fresh = dataclasses.replace(
                model, keys=None, extraction=[dataclasses.replace(b, keys=None) for b in model.extraction]
            )
            assert json.dumps(fresh.to_json()) == json.dumps(entry)
    entry = json.loads(CORPUS.read_text())["buckets"]["standard"]
    # an entry of another order (an older writer) is written back in its own order
    shuffled = {key: entry[key] for key in reversed(list(entry))}
    assert list(ModelBuckets.from_json(shuffled).to_json()) == list(shuffled)
    bucket = entry["extraction"][-1]
    reordered = {key: bucket[key] for key in sorted(bucket)}
    assert list(BucketStats.from_json(reordered).to_json()) == sorted(bucket)
    with pytest.raises(ValueError, match="unknown keys"):
        ModelBuckets.from_json(entry | {"new_table": []})
    with pytest.raises(ValueError, match="unknown keys"):  # an interval without its measure
        BucketStats.from_json(bucket | {"other_ci": [0.0, 1.0]})
    with pytest.raises(ValueError, match="unknown keys"):
        MatchedControls.from_json(json.loads(MECHANISM.read_text())["matched_controls"] | {"extra": 1})


def test_a_shipped_matched_controls_section_is_rebuilt_from_its_buckets() -> None:
    """matched.matched_controls, given a finished seed's buckets, validation losses and loss-matched choice, writes
    the section that seed shipped, row for row and key for key."""
    summary = json.loads(MECHANISM.read_text())
    typed = CompareResult.from_json(summary)
    shipped = typed.matched_controls
    assert shipped is not None and typed.buckets is not None and typed.repeats is not None
    mask = next(
        MaskSpec(m["strategy"], m["k"], m["h"], m["seed"])
        for m in summary["config"]["masks"]  # type: ignore[union-attr]
        if m["label"] == shipped.mask
    )
    losses = {label: typed.validation(label).get("loss") for label in typed.headlines}
    rebuilt = matched.matched_controls(
        typed.buckets,
        losses,  # type: ignore[arg-type]
        typed.repeats,  # type: ignore[arg-type]
        mask=mask,
        standard="standard",
        loss_matched=dataclasses.replace(shipped.loss_matched, keys=None),
        compute_matched=(shipped.compute_matched.label, shipped.compute_matched.steps),
        of_steps=shipped.compute_matched.of_steps,
    )
    assert json.dumps(rebuilt.to_json()) == json.dumps(summary["matched_controls"])
    assert {row.control for row in rebuilt.rows} == {
        "goldfish",
        "standard",
        "exposure-matched",
        "loss-matched",
        "compute-matched",
    }
    assert all(row.keys is None for row in rebuilt.rows)
    lines = matched.render_matched(rebuilt)
    assert lines[0] == "## Matched controls" and len([line for line in lines if line.startswith("| ")]) == 1 + len(
        rebuilt.rows
    )
    # without a loss-matched step: the choice only, and no loss-matched row
    none = LossMatched(model="standard", target_loss=5.0, step=None, of_steps=1024)
    assert list(none.to_json()) == ["model", "target_loss", "step", "of_steps"]
    rows = matched.matched_rows(
        typed.buckets,
        losses,
        mask=mask,
        standard="standard",
        top_buckets=[128],
        loss_matched=none,
        compute_matched=None,
    )
    assert [row.control for row in rows] == ["goldfish", "standard"]
    assert list(rows[0].to_json())[-1] == "rouge_l_ci"  # neither a loss- nor a compute-matched row's keys
    seeds = matched.render_matched_seeds({"11": rebuilt})
    assert any(line.startswith("| 11 | standard at ") for line in seeds)


def test_matched_rows_keep_their_control_keys() -> None:
    entry = json.loads(MECHANISM.read_text())["matched_controls"]["rows"]
    for row in entry:
        typed = MatchedRow.from_json(row)
        assert list(typed.to_json()) == list(row)
        assert list(dataclasses.replace(typed, keys=None).to_json()) == list(row)


def test_the_repeats_breakdown_gets_the_bucket_intervals() -> None:
    typed = CompareResult.from_json(json.loads(CORPUS.read_text()))
    assert typed.buckets is not None
    model = typed.buckets["standard"]
    groups = [{"repeats": 64, "exact_match": 0.5}, {"repeats": 3}]  # 3: no such bucket
    with_bucket_intervals(groups, model, ["exact_match", "rouge_l"])  # type: ignore[arg-type]
    top = model.bucket(64)
    assert top is not None
    assert groups[0] == {
        "repeats": 64,
        "exact_match": 0.5,
        "exact_match_ci": top.rate_ci,
        "rouge_l_ci": top.intervals["rouge_l"],
    }
    assert groups[1] == {"repeats": 3, "exact_match_ci": None, "rouge_l_ci": None}


def test_the_k_sweep_reads_the_top_bucket_of_each_mask() -> None:
    typed = CompareResult.from_json(json.loads(CORPUS.read_text()))
    sweep = k_sweep_series(typed)
    assert sweep is not None and sweep.top_bucket == 64 and sweep.standard is not None
    ks, points = sweep.series["hashed h=13"]
    assert ks == [4, 32] and sweep.series["random"][0] == [4]  # a series per strategy, one k of random masks
    top = typed.buckets["goldfish-hashed-k32-h13"].bucket(64)  # type: ignore[index]
    assert top is not None and (points[1].exact_match, points[1].inner) == (top.rate, top.rate_ci)
    assert points[1].val_loss == typed.validation("goldfish-hashed-k32-h13")["loss"]
