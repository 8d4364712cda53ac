"""The typed --seeds result (goldfish.app.seeds_result): today's key order when built by the combination, older
files read as they are, and each summary kind refused by the other's reader."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from goldfish.app.bucket_tests import BucketTest
from goldfish.app.compare_result import CompareResult
from goldfish.app.seeds_result import SEEDS_KEYS, PooledExtraction, SeedsResult

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
TODAY = RESULTS / "compare_corpus_mechanism" / "summary.json"  # written by today's combination
OLDER = RESULTS / "compare_corpus" / "summary.json"  # before the pooled cluster statistics and paired tests


def test_a_result_built_without_keys_writes_todays_keys_in_order() -> None:
    summary = json.loads(TODAY.read_text())
    typed = SeedsResult.from_json(summary)
    built = dataclasses.replace(typed, keys=None)  # as seed_combination builds it: every key
    assert list(built.to_json()) == list(summary) == list(SEEDS_KEYS)
    assert built.to_json() == summary
    bucket = typed.combined["standard"].buckets[-1]  # type: ignore[index]
    assert bucket.pooled is not None and bucket.pooled.rate == bucket.pooled.k / bucket.pooled.n
    assert list(dataclasses.replace(bucket.pooled, keys=None).to_json())[:6] == [
        "repeats",
        "n_targets",
        "n_seeds",
        "k",
        "n",
        "rate",
    ]
    tests = typed.bucket_tests.models["goldfish-hashed-k4-h13"]  # type: ignore[union-attr]
    assert all(t.paired and t.unpaired is None and t.mcnemar_p is None for t in tests)  # several seeds


def test_an_older_summary_is_read_as_it_is() -> None:
    typed = SeedsResult.from_json(json.loads(OLDER.read_text()))
    assert typed.bucket_tests is None and typed.pooled_what is None and typed.corpus_per_seed is None
    pooled = typed.combined["standard"].buckets[-1].pooled  # type: ignore[index]
    assert pooled == PooledExtraction(k=24, n=64, pair_interval=pooled.pair_interval, keys=("k", "n", "ci"))  # type: ignore[union-attr]
    assert pooled.rate is None and pooled.pooled_rate == 24 / 64  # type: ignore[union-attr]
    validation = typed.combined["standard"].validation
    assert validation is not None and validation.loss_ci is None and validation.difference_per_seed is None


def test_an_older_one_seed_test_has_fishers_counts_only() -> None:
    entry = {"repeats": 64, "a_n": 32, "a_exact_match_k": 20, "a_exact_match": 0.625, "b_n": 32,
             "b_exact_match_k": 0, "b_exact_match": 0.0, "fisher_p": 2.3e-08}  # fmt: skip
    test = BucketTest.from_json(entry)
    assert not test.paired and test.unpaired is not None and test.unpaired.a_k == 20
    assert test.to_json() == entry and list(test.to_json()) == list(entry)


def test_each_reader_refuses_the_other_kind() -> None:
    with pytest.raises(ValueError, match="not a --seeds summary"):
        SeedsResult.from_json(json.loads((RESULTS / "compare_corpus" / "seed-0" / "summary.json").read_text()))
    with pytest.raises(ValueError, match="not a compare summary"):
        CompareResult.from_json(json.loads(OLDER.read_text()))
    with pytest.raises(ValueError, match="unknown keys"):
        SeedsResult.from_json(json.loads(OLDER.read_text()) | {"models": {}})
